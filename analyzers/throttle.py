"""Throttling: episodes per GPU from telemetry, and what they cost in iteration latency.

``throttle_episodes`` turns each GPU's telemetry samples into episodes per reason (power, thermal,
current, other); ``throttle_impact`` compares the iteration latency of each model inside and
outside episodes (ratio of medians with a bootstrap 95 % interval). The conditions, severities and
the estimate are derived in docs/throttle.md; every setting is ``analyzers.throttle.<name>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.analyzers.layout import LayoutCache
from aaco.analyzers.throttle_episodes import Episode, Episodes
from aaco.analyzers.throttle_impact import ImpactRow, LatencyImpact
from aaco.analyzers.throttle_settings import POWER_LIMIT, REASONS, TEMPERATURE_LIMIT, ThrottleSettings
from aaco.contract import telemetry as m
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define

DROP_REASONS: Final = ("max_devices", "max_models", "late_telemetry", "pending_overflow")
_ATTRIBUTE: Final[dict[str, str]] = {**m.SERIES_ATTRIBUTE, TEMPERATURE_LIMIT: "sensor"}
_TRACKED: Final = frozenset(
    {m.UTILIZATION, m.POWER, m.CLOCK, m.CLOCK_MAX, m.TEMPERATURE, m.THROTTLE, POWER_LIMIT, TEMPERATURE_LIMIT}
)
# One GPU's rows of one sample: node, GPU, row numbers, (metric, series attribute) of each row.
_Group = tuple[str, str, list[int], list[tuple[str, str]]]

THROTTLE_ACTIVE = define(
    "aaco.throttle.active",
    "aaco_throttle_active",
    "gauge",
    "1",
    "1 while a GPU is in a throttling episode for a reason (power, thermal, current, other), else 0.",
    ("node", "gpu", "reason"),
)
THROTTLE_EPISODES = define(
    "aaco.throttle.episodes",
    "aaco_throttle_episodes",
    "counter",
    "{episode}",
    "Throttling episodes started, by GPU and reason.",
    ("node", "gpu", "reason"),
)
THROTTLE_SECONDS = define(
    "aaco.throttle.time",
    "aaco_throttle_seconds",
    "counter",
    "s",
    "Time a GPU spent throttled, by reason (telemetry time between samples while in an episode).",
    ("node", "gpu", "reason"),
)
IMPACT = define(
    "aaco.throttle.latency_impact",
    "aaco_throttle_latency_impact_ratio",
    "gauge",
    "1",
    "Median iteration latency inside throttling episodes over the median outside them.",
    ("node", "model"),
)
IMPACT_LOW = define(
    "aaco.throttle.latency_impact.ci_low",
    "aaco_throttle_latency_impact_ci_low_ratio",
    "gauge",
    "1",
    "Lower bound of the 95 % bootstrap confidence interval of the throttling latency impact ratio.",
    ("node", "model"),
)
IMPACT_HIGH = define(
    "aaco.throttle.latency_impact.ci_high",
    "aaco_throttle_latency_impact_ci_high_ratio",
    "gauge",
    "1",
    "Upper bound of the 95 % bootstrap confidence interval of the throttling latency impact ratio.",
    ("node", "model"),
)
ITERATIONS = define(
    "aaco.throttle.iterations",
    "aaco_throttle_iterations",
    "counter",
    "{iteration}",
    "Iterations classified against throttling episodes: inside, outside, unknown (no telemetry then).",
    ("node", "model", "state"),
)
DROPPED = define(
    "aaco.throttle.dropped",
    "aaco_throttle_dropped",
    "counter",
    "{event}",
    "Inputs the throttle analyzer did not use: max_devices, max_models (caps reached), late_telemetry (older "
    "than the GPU's last sample), pending_overflow (iterations waiting for telemetry beyond the cap).",
    ("reason",),
)


@dataclass(frozen=True)
class GpuRow:
    """One GPU as the snapshot reports it: open and recent episodes, counters per reason."""

    node: str
    gpu: str
    throttled: tuple[str, ...]
    last_sample_ns: int
    open: tuple[Episode, ...]
    recent: tuple[Episode, ...]  # the last 10 ended
    episodes_total: Mapping[str, int]
    throttled_seconds: Mapping[str, float]
    power_cap_w: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "node": self.node,
            "gpu": self.gpu,
            "throttled": list(self.throttled),
            "last_sample_ns": self.last_sample_ns,
            "open": [ep.to_dict() for ep in self.open],
            "recent": [ep.to_dict() for ep in self.recent],
            "episodes_total": dict(self.episodes_total),
            "throttled_seconds": dict(self.throttled_seconds),
            "power_cap_w": self.power_cap_w,
        }


@dataclass(frozen=True)
class ThrottleResult:
    """Episodes per GPU, the latency impact per model, and the analyzer's counters."""

    gpus: tuple[GpuRow, ...]
    impact: Mapping[tuple[str, str], ImpactRow]
    dropped: Mapping[str, int]
    settings: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """``{"gpus": [...], "impact": {model: {...}}, "dropped": {...}, "settings": {...}}``."""
        nodes = {n for n, _ in self.impact}
        impact = {(mo if len(nodes) <= 1 else f"{n}/{mo}"): v.to_dict() for (n, mo), v in sorted(self.impact.items())}
        return {
            "gpus": [g.to_dict() for g in self.gpus],
            "impact": impact,
            "dropped": dict(self.dropped),
            "settings": dict(self.settings),
        }

    def latency_impact(self, node: str, model: str) -> float | None:
        """The impact as the bottleneck classifier reads it (``ratio - 1``).

        ``ratio - 1`` when significant, 0 when measured and not significant (both sides have enough
        iterations), None when not measured.
        """
        v = self.impact.get((node, model))
        if v is None or v.ratio is None:
            return None
        if v.significant:
            return v.ratio - 1.0
        return 0.0 if v.enough else None

    def points(self) -> list[MetricPoint]:
        """Active gauges, episode and time counters per GPU and reason; impact per model; drops."""
        pb = PointBuilder()
        for g in self.gpus:
            for reason in REASONS:
                labels = {"node": g.node, "gpu": g.gpu, "reason": reason}
                pb.add(THROTTLE_ACTIVE, 1.0 if reason in g.throttled else 0.0, **labels)
                pb.add(THROTTLE_EPISODES, float(g.episodes_total[reason]), **labels)
                pb.add(THROTTLE_SECONDS, float(g.throttled_seconds[reason]), **labels)
        for (node, model), v in self.impact.items():
            for state, n in (("inside", v.inside), ("outside", v.outside), ("unknown", v.unknown)):
                pb.add(ITERATIONS, float(n), node=node, model=model, state=state)
            if v.ratio is not None and v.ci is not None:
                pb.add(IMPACT, v.ratio, node=node, model=model)
                pb.add(IMPACT_LOW, v.ci[0], node=node, model=model)
                pb.add(IMPACT_HIGH, v.ci[1], node=node, model=model)
        for reason in DROP_REASONS:
            pb.add(DROPPED, float(self.dropped.get(reason, 0)), reason=reason)
        return pb.points


class ThrottleAnalyzer(Analyzer):
    """Throttling episodes per GPU from telemetry; their latency impact per model from iterations."""

    name = "throttle"
    kinds = frozenset({"telemetry", "iterations", "kernels"})

    def __init__(self, settings: ThrottleSettings | None = None, max_models: int = 256) -> None:
        self.settings = settings or ThrottleSettings()
        self._episodes = Episodes(self.settings, lambda ep, what: self.emit(ep.finding(self.name, what)))
        self._impact = LatencyImpact(self.settings, max_models, self.emit)
        self._dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        # The grouping per GPU of the last telemetry batch of one sample time.
        self._layout: LayoutCache[list[_Group]] = LayoutCache(("node", "device", "metric", "attributes"))
        # Made on first use, not at import: pyarrow imports pandas (about 30 MiB resident) on its first
        # list conversion unless the agent has already kept it out (cli.keep_pandas_out), at start.
        self._tracked: pa.Array | None = None

    def update(self, item: EventBatch) -> None:
        """Fold telemetry (episodes), kernels (model -> GPUs) or iterations (latency impact) in."""
        b = item.batch
        if b.num_rows == 0:
            return
        if item.kind == "telemetry":
            self._telemetry(b)
        elif item.kind == "kernels":
            self._impact.kernels(b)
            return
        elif item.kind == "iterations":
            self._dropped["pending_overflow"] += self._impact.iterations(b)
        else:
            return
        self._dropped["max_models"] += self._impact.classify(self._episodes.gpus, self._episodes.newest_ts)

    def _telemetry(self, b: pa.RecordBatch) -> None:
        if self._tracked is None:
            self._tracked = pa.array(sorted(_TRACKED))
        sel = b.filter(pc.is_in(b.column("metric"), self._tracked))
        if sel.num_rows:
            ts = sel.column("ts_ns").to_numpy()
            values = sel.column("value").to_numpy(zero_copy_only=False).tolist()
            one_time = bool((ts == ts[0]).all())
            layout = self._layout.layout(sel)
            known = self._layout.get(layout) if one_time else None
            if known is not None:
                groups = [(int(ts[0]), g) for g in known]
            else:
                groups = self._groups(sel, ts)
                if one_time:
                    self._layout.put(layout, [g for _, g in groups])
                else:
                    self._layout.clear()
            for now, (node, device, rows, keys) in groups:
                self._sample(now, node, device, rows, keys, values)
        self._episodes.expire()

    @staticmethod
    def _groups(sel: pa.RecordBatch, ts: np.ndarray) -> list[tuple[int, _Group]]:
        """The rows of each sample, by time then GPU: (time, (node, GPU, rows, (metric, attribute) per row))."""
        nodes = sel.column("node").to_pylist()
        devices = sel.column("device").fill_null("").to_pylist()
        metrics = sel.column("metric").to_pylist()
        attrs = sel.column("attributes").to_pylist()
        out: list[tuple[int, _Group]] = []
        last: tuple[int, str, str] | None = None
        for i in np.lexsort((devices, nodes, ts)).tolist():  # by time, then GPU
            at = (int(ts[i]), nodes[i], devices[i])
            if at != last:
                out.append((at[0], (at[1], at[2], [], [])))
                last = at
            metric = metrics[i]
            _, (_, _, rows, keys) = out[-1]
            rows.append(i)
            keys.append((metric, dict(attrs[i] or ()).get(_ATTRIBUTE.get(metric, ""), "")))
        return out

    def _sample(
        self, now: int, node: str, device: str, rows: list[int], keys: list[tuple[str, str]], values: list[float]
    ) -> None:
        g = self._episodes.gpu(node, device, now)
        if g is None:
            self._dropped["max_devices"] += len(rows)
            return
        if now < g.last_ts:
            self._dropped["late_telemetry"] += len(rows)
            return
        for i, key in zip(rows, keys, strict=True):
            g.readings[key] = (float(values[i]), now)
        self._episodes.evaluate(g, now)

    def snapshot(self) -> ThrottleResult:
        """Episodes, counters and impact (an immutable copy)."""
        gpus = tuple(
            GpuRow(
                node,
                gpu,
                tuple(sorted(g.open)),
                g.last_ts,
                tuple(ep.copy() for ep in g.open.values()),
                tuple(ep.copy() for ep in list(g.history)[-10:]),
                dict(g.episodes),
                dict(g.seconds),
                self._episodes.power_cap(g),
            )
            for (node, gpu), g in sorted(self._episodes.gpus.items())
        )
        s = self.settings
        settings = {
            "load_threshold": s.load_threshold,
            "clock_ratio": s.clock_ratio,
            "power_margin": s.power_margin,
            "power_cap_w": s.power_cap_w,
            "temperature_limits_c": dict(s.temperature_limits_c),
            "temperature_margin_c": s.temperature_margin_c,
            "pending_iterations": len(self._impact.pending),
        }
        return ThrottleResult(gpus, self._impact.rows(), dict(self._dropped), settings)


def create(s: ThrottleSettings, hints: AgentHints, max_models: int) -> ThrottleAnalyzer:
    """The analyzer for its settings and what the agent derives from its sources."""
    return ThrottleAnalyzer(settings=s, max_models=max_models)
