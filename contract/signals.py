"""Metric definitions and points: the one vocabulary analyzers, self-metrics and exporters share.

Analyzers describe what they measured as ``MetricPoint``s of a registered ``MetricDef``; the
Prometheus exporter and the OTLP metrics exporter render the same points under their own naming
rules (``prom_name``, ``otel_name``), and ``docs/metrics.md`` is generated from ``METRICS``. A
metric that is not defined here cannot be emitted, so every exported name has a description,
a unit and a bounded label set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

MetricKind = Literal["gauge", "counter", "histogram"]

# Latency buckets (seconds) for iteration latency: 100 us .. 60 s, roughly x2.5 per step.
LATENCY_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


@dataclass(frozen=True, slots=True)
class MetricDef:
    """A metric's identity: names in both worlds, type, unit (UCUM), description and label keys."""

    otel_name: str
    prom_name: str  # without the `_total` suffix that counters get on exposition
    kind: MetricKind
    unit: str
    description: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class Exemplar:
    """One observation that links a histogram bucket to its trace: trace id, value, when (Unix seconds)."""

    trace_id: str
    value: float
    ts_s: float | None = None


@dataclass(frozen=True, slots=True)
class HistogramValue:
    """Cumulative histogram state: ``bucket_counts[i]`` counts observations <= ``bounds[i]``.

    ``exemplars`` is empty (none kept) or holds one entry per bucket, ``len(bounds) + 1`` (the last
    for +Inf): the bucket's latest observation with a known trace, None where it has none.
    """

    bounds: tuple[float, ...]
    bucket_counts: tuple[int, ...]
    count: int
    total: float
    exemplars: tuple[Exemplar | None, ...] = ()

    def __post_init__(self) -> None:
        if self.exemplars and len(self.exemplars) != len(self.bounds) + 1:
            raise ValueError(f"{len(self.exemplars)} exemplars for {len(self.bounds) + 1} buckets")


@dataclass(frozen=True, slots=True)
class MetricPoint:
    """One value of one metric for one label set."""

    metric: MetricDef
    labels: Mapping[str, str]
    value: float | HistogramValue
    ts_ns: int | None = None


METRICS: dict[str, MetricDef] = {}


def define(
    otel_name: str,
    prom_name: str,
    kind: MetricKind,
    unit: str,
    description: str,
    labels: tuple[str, ...] = (),
    buckets: tuple[float, ...] = (),
) -> MetricDef:
    """Register a metric definition (once per name) and return it."""
    existing = METRICS.get(prom_name)
    new = MetricDef(otel_name, prom_name, kind, unit, description, labels, buckets)
    if existing is not None and existing != new:
        raise ValueError(f"metric {prom_name} defined twice with different definitions")
    METRICS[prom_name] = new
    return new


@dataclass
class PointBuilder:
    """Collects points for one snapshot, checking each label set against its definition."""

    points: list[MetricPoint] = field(default_factory=list)

    def add(self, metric: MetricDef, value: float | HistogramValue, **labels: str) -> None:
        """Add a point; labels must be exactly the definition's label keys."""
        if set(labels) != set(metric.labels):
            raise ValueError(f"{metric.prom_name}: labels {sorted(labels)} != defined {sorted(metric.labels)}")
        self.points.append(MetricPoint(metric, {k: str(v) for k, v in labels.items()}, value))
