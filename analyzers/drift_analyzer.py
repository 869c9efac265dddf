"""Drift of each model's key series, streaming: a change-point detector per (node, model, series).

Series (each fed in data order, one value per iteration or per request):

- ``latency``: iteration latency (``end_ns - start_ns``, seconds), from ``iterations`` rows, in order
  of their end;
- ``kernels_per_iteration``: GPU kernels (``kind == "kernel"``, as KAR counts them) the correlator
  placed in the iteration (``model, run_id, iteration`` set) — a change means the graph, its
  fusion or the kernels chosen changed;
- ``kernel_time``: the summed duration of those kernels (seconds) — with ``latency`` it tells a
  slower GPU (kernel time moved with latency) from a slower host (it did not);
- ``ttft`` and ``tpot``: each served request's time to first token and time per output token
  (seconds; ``request_series`` of ``requests`` rows), in order of the requests' end (the order
  servers report them); a request without one (TPOT of a one-token answer) is skipped for it.

An iteration's kernels can span batches, so its counts are final once kernels of an iteration two
further in the same run arrive (kernels come in launch order); at most ``max_open_iterations`` are
held, the oldest dropped and counted beyond that. The last two iterations of a run are therefore
never scored (a detector learns from its first 200 values before it scores any).

Each change point becomes a finding (subject: the model) whose evidence holds the baseline, the new
level, the ratio and the magnitude in baseline sigmas, the estimated change and detection positions
with their data times, and whose trace ID is that of the iteration (or request) at which it was
detected. Severity: latency, kernel time, TTFT or TPOT up — ``warning``, ``critical`` from a ratio of 1.5; kernels per
iteration changed either way — ``warning``; a series going down (faster) — ``info``.

``aaco_drift_active`` is 1 from a change point until the detector has re-baselined on the new
level and, so that a scrape every minute sees it, at least ``hold_s`` (300 s) of data time has
passed; ``aaco_drift_changepoints_total`` counts change points by direction. Models are bounded
by ``max_models`` (further ones are dropped and counted).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveFloat, PositiveInt, model_validator

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.analyzers.drift import DETECTORS, ChangePoint
from aaco.analyzers.grouping import group
from aaco.contract.config_base import StrictModel
from aaco.contract.schemas import EventBatch
from aaco.contract.serving import request_series
from aaco.contract.signals import MetricPoint, PointBuilder, define
from aaco.contract.snapshot import Finding

DRIFT_ACTIVE = define(
    "aaco.drift.active",
    "aaco_drift_active",
    "gauge",
    "1",
    "1 while a series is in a changed state: from a change point until its detector re-baselined on the new "
    "level (and at least the hold time), else 0. Series: latency, kernels_per_iteration, kernel_time, ttft, tpot.",
    ("node", "model", "series"),
)
DRIFT_CHANGEPOINTS = define(
    "aaco.drift.changepoints",
    "aaco_drift_changepoints",
    "counter",
    "{changepoint}",
    "Change points detected in a series, by direction (up, down).",
    ("node", "model", "series", "direction"),
)
DRIFT_DROPPED = define(
    "aaco.drift.dropped",
    "aaco_drift_dropped",
    "counter",
    "{value}",
    "Values the drift analyzer did not score: max_models (model cap reached), open_iterations (an iteration's "
    "kernels still open when too many were), not_finite.",
    ("reason",),
)

LATENCY: Final = "latency"
KERNELS: Final = "kernels_per_iteration"
KERNEL_TIME: Final = "kernel_time"
TTFT: Final = "ttft"
TPOT: Final = "tpot"
UNITS: Final[dict[str, str]] = {LATENCY: "s", KERNELS: "{kernel}", KERNEL_TIME: "s", TTFT: "s", TPOT: "s"}
SERIES_NAMES: Final[dict[str, str]] = {TTFT: "TTFT", TPOT: "TPOT"}  # as summaries write them
REQUEST_SERIES: Final = ((TTFT, "ttft_s"), (TPOT, "tpot_s"))  # series, request_series field
DROP_REASONS: Final = ("max_models", "open_iterations", "not_finite")
_CONTEXT: Final = 128  # (position, data time, trace ID) kept per series, to place a change point in time


@dataclass
class _Track:
    """One series: its detector, what it found, and the recent values' time and trace."""

    detector: Any
    context: deque[tuple[int, int, str | None]] = field(default_factory=lambda: deque(maxlen=_CONTEXT))
    counts: dict[str, int] = field(default_factory=lambda: {"up": 0, "down": 0})
    last: dict[str, Any] | None = None
    alarm_ts_ns: int | None = None
    latest_ts_ns: int = 0

    def active(self, hold_ns: int) -> bool:
        if self.alarm_ts_ns is None:
            return False
        return not self.detector.monitoring or self.latest_ts_ns - self.alarm_ts_ns < hold_ns

    def state(self) -> str:
        if self.detector.monitoring:
            return "monitoring"
        return "warming" if self.alarm_ts_ns is None else "rebaselining"


@dataclass(frozen=True)
class DriftSeries:
    """One tracked series (a model's latency, kernels, kernel time, TTFT or TPOT) as the snapshot reports it."""

    node: str
    model: str
    series: str
    unit: str
    state: str  # warming | monitoring | rebaselining
    values: int  # values the detector was fed
    baseline: float | None
    sigma: float | None
    active: bool  # a change point within hold_s
    changepoints: Mapping[str, int]  # up, down
    last_change: Mapping[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "node": self.node,
            "model": self.model,
            "series": self.series,
            "unit": self.unit,
            "state": self.state,
            "values": self.values,
            "baseline": self.baseline,
            "sigma": self.sigma,
            "active": self.active,
            "changepoints": dict(self.changepoints),
            "last_change": dict(self.last_change) if self.last_change is not None else None,
        }


@dataclass(frozen=True)
class DriftResult:
    """Every tracked series' state, and what was dropped."""

    detector: Mapping[str, Any]
    series: tuple[DriftSeries, ...]
    dropped: Mapping[str, int]

    def to_dict(self) -> dict[str, Any]:
        """``{"detector": {...}, "series": [...], "dropped": {...}}``."""
        return {
            "detector": dict(self.detector),
            "series": [s.to_dict() for s in self.series],
            "dropped": dict(self.dropped),
        }

    def points(self) -> list[MetricPoint]:
        """``aaco_drift_active``, ``aaco_drift_changepoints_total`` per series, the drop counters."""
        pb = PointBuilder()
        for s in self.series:
            labels = {"node": s.node, "model": s.model, "series": s.series}
            pb.add(DRIFT_ACTIVE, 1.0 if s.active else 0.0, **labels)
            for direction in ("up", "down"):
                pb.add(DRIFT_CHANGEPOINTS, float(s.changepoints[direction]), **labels, direction=direction)
        for reason in DROP_REASONS:
            pb.add(DRIFT_DROPPED, float(self.dropped.get(reason, 0)), reason=reason)
        return pb.points


class DriftSettings(StrictModel):
    """Change points in each model's iteration latency, kernels and kernel time per iteration, TTFT and TPOT."""

    detector: Literal["cusum", "ewma"] = Field("cusum", description="The chart (docs/drift.md).")
    detector_options: dict[str, int | float] = Field(
        default_factory=dict,
        description="The chart's parameters (cusum: k, h; ewma: lam, L; both: warmup, window, lag, refresh, "
        "clip, min_rel_scale); unset ones keep their defaults.",
    )
    hold_s: PositiveFloat = Field(300.0, description="An iteration's kernels are awaited this long (data time).")
    max_open_iterations: PositiveInt = Field(4096, description="Iterations awaiting their kernels at most.")

    @model_validator(mode="after")
    def _detector_takes_the_options(self) -> DriftSettings:
        try:
            DETECTORS[self.detector](**self.detector_options)
        except (TypeError, ValueError) as e:
            raise ValueError(f"detector_options for {self.detector}: {e}") from None
        return self


class DriftAnalyzer(Analyzer):
    """Runs a ``Cusum`` (or ``Ewma``) per (node, model, series) over iterations, their kernels and requests."""

    name = "drift"
    kinds = frozenset({"iterations", "kernels", "requests"})

    def __init__(
        self,
        detector: str = "cusum",
        detector_options: dict[str, Any] | None = None,
        max_models: int = 256,
        hold_s: float = 300.0,
        max_open_iterations: int = 4096,
    ) -> None:
        if detector not in DETECTORS:
            raise ValueError(f"unknown detector {detector!r}; known: {', '.join(DETECTORS)}")
        self.detector = detector
        self.options = dict(detector_options or {})
        # Bad options fail here, not at the first value.
        self._params = {**DETECTORS[detector](**self.options).params(), "hold_s": hold_s}
        self.max_models = max_models
        self.hold_ns = int(hold_s * 1e9)
        self.max_open_iterations = max_open_iterations
        self._models: set[tuple[str, str]] = set()
        self._tracks: dict[tuple[str, str, str], _Track] = {}
        # (node, model, run_id, iteration) -> [kernels, kernel ns, last end ns, trace id], in arrival order
        self._open: dict[tuple[str, str, str, int], list[Any]] = {}
        self._newest: dict[tuple[str, str, str], int] = {}  # newest iteration seen per (node, model, run)
        self._dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)

    def update(self, item: EventBatch) -> None:
        """Fold iterations (latency), correlated kernels (per-iteration counts and time) or requests in."""
        b = item.batch
        if b.num_rows == 0:
            return
        if item.kind == "iterations":
            self._iterations(b)
        elif item.kind == "kernels":
            self._kernels(b)
        elif item.kind == "requests":
            self._requests(b)

    def _iterations(self, b: pa.RecordBatch) -> None:
        start = b.column("start_ns").to_numpy()
        end = b.column("end_ns").to_numpy()
        nodes = b.column("node").to_pylist()
        models = b.column("model").fill_null("unknown").to_pylist()
        traces = b.column("trace_id").to_pylist()
        for i in np.argsort(end, kind="stable").tolist():
            self._feed(nodes[i], models[i], LATENCY, (int(end[i]) - int(start[i])) / 1e9, int(end[i]), traces[i])

    def _requests(self, b: pa.RecordBatch) -> None:
        values = request_series(b).values
        end = b.column("end_ns").to_numpy()
        nodes = b.column("node").to_pylist()
        models = b.column("model").fill_null("unknown").to_pylist()
        traces = b.column("trace_id").to_pylist()
        order = np.argsort(end, kind="stable").tolist()
        for series, name in REQUEST_SERIES:
            column = values[name]
            for i in order:
                value = float(column[i])
                if not math.isnan(value):
                    self._feed(nodes[i], models[i], series, value, int(end[i]), traces[i])

    def _kernels(self, b: pa.RecordBatch) -> None:
        is_kernel = pc.fill_null(pc.equal(b.column("kind"), "kernel"), False).to_numpy(zero_copy_only=False)
        if not is_kernel.any():
            return
        groups = group(b.column("node"), b.column("model"), b.column("run_id"), b.column("iteration"))
        k = len(groups.keys)
        weight = is_kernel.astype(np.float64)
        start = b.column("start_ns").to_numpy(zero_copy_only=False)
        end = b.column("end_ns").to_numpy(zero_copy_only=False)
        counts = np.bincount(groups.index, weights=weight, minlength=k)
        kernel_ns = np.bincount(groups.index, weights=(end - start) * weight, minlength=k)
        last_end = np.zeros(k, np.int64)
        np.maximum.at(last_end, groups.index, end)
        first_row = np.full(k, b.num_rows, np.int64)
        np.minimum.at(first_row, groups.index, np.arange(b.num_rows))
        traces = b.column("trace_id")
        for g, (node, model, run_id, iteration) in enumerate(groups.keys):
            if model is None or iteration is None or counts[g] == 0:
                continue
            key = (node, model, run_id or "", int(iteration))
            acc = self._open.get(key)
            if acc is None:
                acc = self._open[key] = [0, 0, 0, None]
            acc[0] += int(counts[g])
            acc[1] += int(kernel_ns[g])
            acc[2] = max(acc[2], int(last_end[g]))
            acc[3] = acc[3] or traces[int(first_row[g])].as_py()
            run = key[:3]
            self._newest[run] = max(self._newest.get(run, key[3]), key[3])
        self._close_iterations()

    def _close_iterations(self) -> None:
        done = [k for k in self._open if k[3] <= self._newest.get(k[:3], k[3]) - 2]
        for key in sorted(done, key=lambda k: (k[:3], k[3])):
            count, kernel_ns, end_ns, trace = self._open.pop(key)
            self._feed(key[0], key[1], KERNELS, float(count), end_ns, trace)
            self._feed(key[0], key[1], KERNEL_TIME, kernel_ns / 1e9, end_ns, trace)
        while len(self._open) > self.max_open_iterations:
            del self._open[next(iter(self._open))]
            self._dropped["open_iterations"] += 1
        if len(self._newest) > self.max_open_iterations:  # runs long finished: forget the oldest
            for run in list(self._newest)[: len(self._newest) - self.max_open_iterations]:
                del self._newest[run]

    def _track(self, node: str, model: str, series: str) -> _Track | None:
        key = (node, model, series)
        tr = self._tracks.get(key)
        if tr is not None:
            return tr
        if (node, model) not in self._models:
            if len(self._models) >= self.max_models:
                return None
            self._models.add((node, model))
        tr = self._tracks[key] = _Track(DETECTORS[self.detector](**self.options))
        return tr

    def _feed(self, node: str, model: str, series: str, value: float, ts_ns: int, trace: str | None) -> None:
        tr = self._track(node, model, series)
        if tr is None:
            self._dropped["max_models"] += 1
            return
        if not math.isfinite(value):
            self._dropped["not_finite"] += 1
            return
        position = tr.detector.samples
        tr.context.append((position, ts_ns, trace))
        tr.latest_ts_ns = max(tr.latest_ts_ns, ts_ns)
        cp = tr.detector.update(value)
        if cp is not None:
            self._changed(tr, node, model, series, cp, ts_ns, trace)

    def _changed(
        self, tr: _Track, node: str, model: str, series: str, cp: ChangePoint, ts_ns: int, trace: str | None
    ) -> None:
        tr.counts[cp.direction] += 1
        tr.alarm_ts_ns = ts_ns
        start = next(((t, tid) for pos, t, tid in tr.context if pos >= cp.index), (None, None))
        unit = UNITS[series]
        evidence = {
            "series": series,
            "unit": unit,
            "detector": self.detector,
            "direction": cp.direction,
            "baseline": cp.baseline,
            "new_level": cp.new_level,
            "ratio": cp.ratio,
            "magnitude_sigmas": cp.magnitude,
            "sigma": cp.sigma,
            "change_index": cp.index,
            "detected_index": cp.detected_at,
            "change_ts_ns": start[0],
            "change_trace_id": start[1],
            "detected_ts_ns": ts_ns,
            "statistic": cp.statistic,
        }
        tr.last = {**evidence, "trace_id": trace}
        ratio = cp.ratio
        if series == KERNELS:
            severity = "warning"
        elif cp.direction == "down":
            severity = "info"
        else:
            severity = "critical" if ratio is not None and ratio >= 1.5 else "warning"
        # Confidence: a z-test of the new level's values against the baseline (the detector's own
        # false-alarm rate is far lower); close to 1 for any real alarm, lower for borderline ones.
        z = cp.magnitude * math.sqrt(cp.delay + 1)
        confidence = min(0.99, math.erf(z / math.sqrt(2.0)))
        moved = "rose" if cp.direction == "up" else "fell"
        times = f" (x{ratio:.2f})" if ratio is not None else ""
        summary = (
            f"{model}: {SERIES_NAMES.get(series, series.replace('_', ' '))} {moved} from {_fmt(cp.baseline, unit)} to "
            f"{_fmt(cp.new_level, unit)}{times}, {cp.magnitude:.1f} sigma"
        )
        self.emit(Finding(ts_ns, node, self.name, model, severity, confidence, summary, evidence, trace))

    def snapshot(self) -> DriftResult:
        """Each series' state (an immutable copy)."""
        series = []
        for (node, model, name), tr in sorted(self._tracks.items()):
            b = tr.detector.baseline
            series.append(
                DriftSeries(
                    node,
                    model,
                    name,
                    UNITS[name],
                    tr.state(),
                    tr.detector.samples,
                    b.median if b is not None else None,
                    b.scale if b is not None else None,
                    tr.active(self.hold_ns),
                    dict(tr.counts),
                    dict(tr.last) if tr.last else None,
                )
            )
        return DriftResult(dict(self._params), tuple(series), dict(self._dropped))


def _fmt(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1e3:.3g} ms" if abs(value) < 1 else f"{value:.3g} s"
    return f"{value:.4g}"


def create(s: DriftSettings, hints: AgentHints, max_models: int) -> DriftAnalyzer:
    """The analyzer for its settings and what the agent derives from its sources."""
    return DriftAnalyzer(
        detector=s.detector,
        detector_options=dict(s.detector_options),
        max_models=max_models,
        hold_s=s.hold_s,
        max_open_iterations=s.max_open_iterations,
    )
