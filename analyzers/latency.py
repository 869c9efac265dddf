"""Iteration latency per model: a cumulative histogram for Prometheus, quantiles over recent iterations.

Quantiles come from the last ``window`` iterations (a bounded ring), so they follow the workload
as it changes; the histogram is cumulative, as Prometheus expects, and each bucket carries its
latest iteration's trace ID as exemplar. Throughput is sequential: iterations per second of iteration
time (1 / mean latency for one stream of requests).
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from pydantic import Field, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.analyzers.stats import Histogram, percentiles
from aaco.contract.config_base import StrictModel
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import LATENCY_BUCKETS, HistogramValue, MetricPoint, PointBuilder, define

ITERATION_LATENCY = define(
    "aaco.iteration.duration",
    "aaco_iteration_latency_seconds",
    "histogram",
    "s",
    "Iteration (inference request, training step) latency.",
    ("node", "model"),
    LATENCY_BUCKETS,
)
THROUGHPUT = define(
    "aaco.iteration.throughput",
    "aaco_iteration_throughput_per_second",
    "gauge",
    "{iteration}/s",
    "Sequential throughput over recent iterations: iterations per second of iteration time.",
    ("node", "model"),
)


@dataclass
class _ModelState:
    hist: Histogram
    recent: deque[float] = field(default_factory=deque)


@dataclass(frozen=True)
class LatencyRow:
    """One (node, model)'s iteration latency over the recent window, in seconds (None without iterations)."""

    iterations: int
    window: int
    p50_s: float | None
    p95_s: float | None
    p99_s: float | None
    mean_s: float | None
    min_s: float | None
    max_s: float | None
    throughput_per_s: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``analysis.json``)."""
        return asdict(self)


@dataclass(frozen=True)
class LatencyResult:
    """Latency statistics per (node, model)."""

    models: dict[tuple[str, str], LatencyRow]
    histograms: dict[tuple[str, str], HistogramValue]

    def to_dict(self) -> dict[str, Any]:
        """``{"models": {model: {...}}}``; with several nodes the key is ``node/model``."""
        nodes = {node for node, _ in self.models}
        return {
            "models": {
                (m if len(nodes) <= 1 else f"{n}/{m}"): row.to_dict() for (n, m), row in sorted(self.models.items())
            }
        }

    def points(self) -> list[MetricPoint]:
        """Histogram and throughput points."""
        pb = PointBuilder()
        for (node, model), hist in self.histograms.items():
            pb.add(ITERATION_LATENCY, hist, node=node, model=model)
            tput = self.models[(node, model)].throughput_per_s
            if tput is not None:
                pb.add(THROUGHPUT, tput, node=node, model=model)
        return pb.points


class LatencySettings(StrictModel):
    """Iteration latency statistics."""

    window: PositiveInt = Field(10_000, description="Recent iterations the quantiles are computed over.")


class LatencyAnalyzer(Analyzer):
    """Folds iterations into per-model latency statistics."""

    name = "latency"
    kinds = frozenset({"iterations"})

    def __init__(self, window: int = 10_000, max_models: int = 256) -> None:
        self._window = window
        self._max_models = max_models
        self._bounds = np.array(LATENCY_BUCKETS)
        self._models: dict[tuple[str, str], _ModelState] = {}
        self.dropped_models = 0

    def update(self, item: EventBatch) -> None:
        """Fold an iterations batch in."""
        b = item.batch
        if b.num_rows == 0:
            return
        lat = (b.column("end_ns").to_numpy() - b.column("start_ns").to_numpy()) / 1e9
        nodes = b.column("node").to_numpy(zero_copy_only=False)
        models = b.column("model").fill_null("unknown").to_numpy(zero_copy_only=False)
        traces = b.column("trace_id").to_numpy(zero_copy_only=False)
        ends = b.column("end_ns").to_numpy()
        for key in {(str(n), str(m)) for n, m in zip(nodes, models, strict=True)}:
            st = self._models.get(key)
            if st is None:
                if len(self._models) >= self._max_models:
                    self.dropped_models += 1
                    continue
                st = self._models[key] = _ModelState(Histogram(self._bounds))
                st.recent = deque(maxlen=self._window)
            mask = (nodes == key[0]) & (models == key[1])
            values = lat[mask]
            st.hist.add(values, traces[mask], ends[mask])
            st.recent.extend(values.tolist())

    def snapshot(self) -> LatencyResult:
        """Current statistics."""
        models: dict[tuple[str, str], LatencyRow] = {}
        hists: dict[tuple[str, str], HistogramValue] = {}
        for key, st in self._models.items():
            recent = np.fromiter(st.recent, dtype=np.float64)
            p50, p95, p99 = percentiles(recent, (50, 95, 99))
            mean = float(recent.mean()) if recent.size else None
            models[key] = LatencyRow(
                iterations=st.hist.count,
                window=int(recent.size),
                p50_s=p50,
                p95_s=p95,
                p99_s=p99,
                mean_s=mean,
                min_s=float(recent.min()) if recent.size else None,
                max_s=float(recent.max()) if recent.size else None,
                throughput_per_s=(1.0 / mean) if mean else None,
            )
            hists[key] = st.hist.value()
        return LatencyResult(models, hists)


def create(s: LatencySettings, hints: AgentHints, max_models: int) -> LatencyAnalyzer:
    """The analyzer for its settings and what the agent derives from its sources."""
    return LatencyAnalyzer(window=s.window, max_models=max_models)
