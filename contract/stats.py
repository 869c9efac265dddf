"""The agent's own metrics: events in, out and dropped per component, queue depth, errors, lag.

Counters and gauges live in one lock-protected table keyed by (metric, label values). Label values
come from code (component names, drop reasons), never from data, and the table is capped at
``max_series`` all the same: a series beyond the cap is not created and is counted instead.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Final

from aaco.contract.signals import MetricDef, MetricPoint, define

EVENTS_RECEIVED: Final = define(
    "aaco.agent.events.received",
    "aaco_events_received",
    "counter",
    "{event}",
    "Events a pipeline component took in.",
    ("component",),
)
EVENTS_EMITTED: Final = define(
    "aaco.agent.events.emitted",
    "aaco_events_emitted",
    "counter",
    "{event}",
    "Events a pipeline component passed on or wrote out.",
    ("component",),
)
EVENTS_DROPPED: Final = define(
    "aaco.agent.events.dropped",
    "aaco_events_dropped",
    "counter",
    "{event}",
    "Events a component dropped, by reason (queue_full, shutdown, invalid, ...); 0 from the start for each "
    "source's queue_full and shutdown.",
    ("component", "reason"),
)
QUEUE_DEPTH: Final = define(
    "aaco.agent.queue.depth",
    "aaco_queue_depth",
    "gauge",
    "{event}",
    "Events waiting in a bounded queue.",
    ("queue",),
)
QUEUE_CAPACITY: Final = define(
    "aaco.agent.queue.capacity",
    "aaco_queue_capacity",
    "gauge",
    "{event}",
    "Capacity of a bounded queue, in events.",
    ("queue",),
)
EXPORT_ERRORS: Final = define(
    "aaco.agent.export.errors",
    "aaco_export_errors",
    "counter",
    "{error}",
    "Failed export attempts per exporter; 0 from the start for each exporter.",
    ("exporter",),
)
SOURCE_ERRORS: Final = define(
    "aaco.agent.source.errors",
    "aaco_source_errors",
    "counter",
    "{error}",
    "Bad input a source skipped (rows, records or files), by reason; 0 from the start for each source's "
    "unreadable, parser_error and io_error.",
    ("source", "reason"),
)
TRACE_EVENTS_UNRECOGNISED: Final = define(
    "aaco.agent.trace.events.unrecognised",
    "aaco_trace_events_unrecognised",
    "counter",
    "{event}",
    "Events of a trace file that look like GPU work (on a GPU lane or stream, or naming a device) but are of a "
    "category its reader does not know, so were not read; by source and trace format. Each such file is also "
    "named once in the log with the categories seen.",
    ("source", "format"),
)
SOURCE_LAG: Final = define(
    "aaco.agent.source.lag",
    "aaco_source_lag_seconds",
    "gauge",
    "s",
    "Wall time between the newest event of a live source's latest batch and its publication.",
    ("source",),
)
SOURCE_FILES: Final = define(
    "aaco.agent.source.files",
    "aaco_source_files",
    "counter",
    "{file}",
    "Files (traces, profiles) a source finished reading.",
    ("source",),
)
SOURCE_RESTARTS: Final = define(
    "aaco.agent.source.restarts",
    "aaco_source_restarts",
    "counter",
    "{restart}",
    "Times a source was restarted after an exception escaped it (with backoff, 1 s doubling to 60 s).",
    ("source",),
)
STATS_SERIES_DROPPED: Final = define(
    "aaco.agent.stats.series_dropped",
    "aaco_stats_series_dropped",
    "counter",
    "{series}",
    "Self-metric series not created because the series cap was reached.",
)


# The series each component has at 0 from the start (``declare_components``), so that alerts on
# ``rate()`` or ``increase()`` see a counter before its first error: a bounded set, the reasons that
# say the most (a damaged file, a parser failure, a full queue), not every reason that exists.
SOURCE_ERROR_REASONS: Final = ("unreadable", "parser_error", "io_error")
SOURCE_DROP_REASONS: Final = ("queue_full", "shutdown")


def declare_components(stats: Stats, sources: Iterable[str], exporters: Iterable[str]) -> None:
    """Create at 0 the error and drop counters of these sources and exporters (see the reasons above)."""
    for source in sources:
        for reason in SOURCE_ERROR_REASONS:
            stats.declare(SOURCE_ERRORS, source=source, reason=reason)
        for reason in SOURCE_DROP_REASONS:
            stats.declare(EVENTS_DROPPED, component=f"source:{source}", reason=reason)
    for exporter in exporters:
        stats.declare(EXPORT_ERRORS, exporter=exporter)


class Stats:
    """Thread-safe counters and gauges for the agent's self-metrics."""

    def __init__(self, max_series: int = 10_000) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[MetricDef, tuple[str, ...]], float] = {}
        self._max_series = max_series
        self._refused = 0

    def _key(self, metric: MetricDef, labels: dict[str, str]) -> tuple[MetricDef, tuple[str, ...]]:
        if set(labels) != set(metric.labels):
            raise ValueError(f"{metric.prom_name}: labels {sorted(labels)} != {sorted(metric.labels)}")
        return metric, tuple(str(labels[k]) for k in metric.labels)

    def inc(self, metric: MetricDef, value: float = 1, **labels: str) -> None:
        """Add ``value`` to a counter."""
        if value == 0:
            return
        key = self._key(metric, labels)
        with self._lock:
            if key in self._values:
                self._values[key] += value
            elif len(self._values) < self._max_series:
                self._values[key] = value
            else:
                self._refused += 1

    def declare(self, metric: MetricDef, **labels: str) -> None:
        """Create a series at 0 unless it exists (a counter exported before its first increment)."""
        key = self._key(metric, labels)
        with self._lock:
            if key in self._values:
                return
            if len(self._values) < self._max_series:
                self._values[key] = 0.0
            else:
                self._refused += 1

    def set(self, metric: MetricDef, value: float, **labels: str) -> None:
        """Set a gauge."""
        key = self._key(metric, labels)
        with self._lock:
            if key in self._values or len(self._values) < self._max_series:
                self._values[key] = value
            else:
                self._refused += 1

    def get(self, metric: MetricDef, **labels: str) -> float:
        """Current value of one series (0 if it does not exist)."""
        key = self._key(metric, labels)
        with self._lock:
            return self._values.get(key, 0.0)

    def total(self, metric: MetricDef, **match: str) -> float:
        """Sum of every series of ``metric`` whose labels include ``match``."""
        idx = {k: metric.labels.index(k) for k in match}
        with self._lock:
            return sum(
                v
                for (m, lv), v in self._values.items()
                if m is metric and all(lv[i] == match[k] for k, i in idx.items())
            )

    def counts(self, metric: MetricDef, by: tuple[str, ...], **match: str) -> Counter[tuple[str, ...]]:
        """Non-zero sums of ``metric`` grouped by the labels ``by``, over the series whose labels include ``match``."""
        idx = {k: metric.labels.index(k) for k in match}
        keys = [metric.labels.index(k) for k in by]
        out: Counter[tuple[str, ...]] = Counter()
        with self._lock:
            for (m, lv), v in self._values.items():
                if m is metric and v and all(lv[i] == match[k] for k, i in idx.items()):
                    out[tuple(lv[i] for i in keys)] += int(v)
        return out

    def points(self) -> Iterator[MetricPoint]:
        """Every series as metric points (a consistent copy)."""
        with self._lock:
            items = list(self._values.items())
            refused = self._refused
        for (metric, label_values), value in items:
            yield MetricPoint(metric, dict(zip(metric.labels, label_values, strict=True)), value)
        yield MetricPoint(STATS_SERIES_DROPPED, {}, float(refused))
