"""Bottleneck class per model: launch-bound, CPU-bound, memory-bound, compute-bound, queue-bound, throttled, unknown.

A ``DerivedAnalyzer``: at each snapshot it gathers, for every (node, model), the signals the other
analyzers measured — launch (microkernel share, launch rate, mean kernel time, CPU time in launch
calls), kar (kernels per iteration), activity (device active and copy-only shares of the model's
capture windows), families (GEMM/convolution/attention versus elementwise/normalisation/copy time),
latency (p95/p50), telemetry (GPU and memory utilisation, throttle flags, clocks against their
maximum, of the model's GPUs), sched (scheduler interference, fault penalty, involuntary switches of
the model's processes) and throttle (latency impact of throttle episodes, when that analyzer runs)
— and classifies them with the rules of ``bottleneck_rules`` (``docs/bottleneck_taxonomy.md``).

What the other results do not say — which capture windows, GPUs and processes belong to a model —
it folds in from the kernels and iterations itself (bounded sets per model). From served LLM
``requests`` (joined on node and model name) it folds the model's serving load over the last
``request_window_s`` of request end times: the queue share (queue time over request duration), the
mean queue time, output tokens per second and per GPU of the model (``ServingLoad``). A missing
input lowers confidence rather than breaking anything.

When a model's class changes (or is first known) with enough confidence it emits a finding with
the evidence. Metrics: ``aaco_bottleneck_class{node,model,class}`` (1 for the current class, 0 for
the others: a fixed label set of seven classes) and ``aaco_bottleneck_confidence{node,model}``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveFloat, PositiveInt

from aaco.analyzers.base import AgentHints, DerivedAnalyzer, ratio
from aaco.analyzers.bottleneck_load import BINS, LoadBins, ServingLoad, request_sums
from aaco.analyzers.bottleneck_rules import CLASSES, UNKNOWN, Classification, classify
from aaco.analyzers.grouping import group
from aaco.contract import telemetry as tm
from aaco.contract.config_base import StrictModel
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define
from aaco.contract.snapshot import AnalyzerResult, Finding

BOTTLENECK_CLASS = define(
    "aaco.bottleneck.class",
    "aaco_bottleneck_class",
    "gauge",
    "1",
    "1 for a model's current bottleneck class (launch-bound, CPU-bound, memory-bound, compute-bound, "
    "queue-bound, throttled, unknown), 0 for the others (see docs/bottleneck_taxonomy.md).",
    ("node", "model", "class"),
)
BOTTLENECK_CONFIDENCE = define(
    "aaco.bottleneck.confidence",
    "aaco_bottleneck_confidence",
    "gauge",
    "1",
    "Confidence (0..1) of a model's bottleneck class; 0 when unknown.",
    ("node", "model"),
)

COMPUTE_FAMILIES = ("gemm", "convolution", "attention")
# Low arithmetic intensity (well under the ridge point of any GPU's roofline): bandwidth sets their pace.
MEMORY_FAMILIES = ("elementwise", "normalization", "memcpy", "memset")
CLOCK_DOMAINS = ("graphics", "sm")  # the compute clock: AMD graphics (GFX), NVIDIA SM
UNDER_LOAD = 0.5  # a clock below its maximum only counts as throttling when the GPU is this busy


@dataclass
class _Model:
    """What the other analyzers do not say about a model: its capture windows, GPUs and processes."""

    windows: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict)  # (device, run_id)
    devices: OrderedDict[str, None] = field(default_factory=OrderedDict)
    pids: OrderedDict[int, None] = field(default_factory=OrderedDict)
    last_ts: int = 0
    load: LoadBins = field(default_factory=LoadBins)  # served requests


def _remember(d: OrderedDict[Any, None], key: Any, cap: int) -> None:
    d[key] = None
    d.move_to_end(key)
    while len(d) > cap:
        d.popitem(last=False)


@dataclass(frozen=True)
class BottleneckResult:
    """The classification of every (node, model), and the serving load of those that serve requests."""

    models: Mapping[tuple[str, str], Classification]
    serving: Mapping[tuple[str, str], ServingLoad] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{"classes": [...], "models": {model: {...}}}``; with several nodes the key is ``node/model``.

        A model that serves requests has its ``serving`` load beside its classification.
        """
        nodes = {n for n, _ in self.models}
        out: dict[str, Any] = {}
        for (n, m), c in sorted(self.models.items()):
            doc = c.to_dict()
            load = self.serving.get((n, m))
            if load is not None:
                doc["serving"] = load.to_dict()
            out[m if len(nodes) <= 1 else f"{n}/{m}"] = doc
        return {"classes": list(CLASSES), "models": out}

    def points(self) -> list[MetricPoint]:
        """The class indicator (every class, 1 for the current one) and the confidence per model."""
        pb = PointBuilder()
        for (node, model), c in self.models.items():
            for cls in CLASSES:
                pb.add(
                    BOTTLENECK_CLASS,
                    1.0 if cls == c.bottleneck_class else 0.0,
                    node=node,
                    model=model,
                    **{"class": cls},
                )
            pb.add(BOTTLENECK_CONFIDENCE, c.confidence, node=node, model=model)
        return pb.points


class BottleneckSettings(StrictModel):
    """Bottleneck class per model, from the other analyzers' results."""

    max_windows: PositiveInt = Field(256, description="Capture windows remembered per model.")
    max_devices: PositiveInt = Field(64, description="GPUs remembered per model.")
    max_pids: PositiveInt = Field(64, description="Processes remembered per model.")
    request_window_s: PositiveFloat = Field(
        300.0, description="Served requests' queue share and tokens/s are taken over this much data time."
    )
    min_finding_confidence: float = Field(
        0.4, ge=0.0, le=1.0, description="A class change is reported from this confidence on."
    )


class BottleneckAnalyzer(DerivedAnalyzer):
    """Classifies each model's bottleneck from the other analyzers' results (see module doc)."""

    name = "bottleneck"
    kinds = frozenset({"kernels", "iterations", "requests"})

    def __init__(
        self,
        max_models: int = 256,
        max_windows: int = 256,
        max_devices: int = 64,
        max_pids: int = 64,
        min_finding_confidence: float = 0.4,
        request_window_s: float = 300.0,
    ) -> None:
        self.max_models = max_models
        self.max_windows = max_windows
        self.max_devices = max_devices
        self.max_pids = max_pids
        self.min_finding_confidence = min_finding_confidence
        self.bin_ns = max(1, int(request_window_s * 1e9) // BINS)
        self._models: dict[tuple[str, str], _Model] = {}
        self._reported: dict[tuple[str, str], str] = {}
        self.models_dropped = 0

    # -- folding in ---------------------------------------------------------------------------------

    def _model(self, key: tuple[str, str]) -> _Model | None:
        m = self._models.get(key)
        if m is None:
            if len(self._models) >= self.max_models:
                self.models_dropped += 1
                return None
            m = self._models[key] = _Model()
        return m

    def update(self, item: EventBatch) -> None:
        """Fold a model's capture windows, GPUs and processes (kernels, iterations) or its load (requests) in."""
        b = item.batch
        if b.num_rows == 0:
            return
        model = pc.fill_null(b.column("model"), UNKNOWN)
        ends = b.column("end_ns").to_numpy()
        if item.kind == "requests":
            self._requests(b, model)
            return
        if item.kind == "iterations":
            groups = group(b.column("node"), model, b.column("pid"))
            last = groups.maxs(ends)
            for i, (node, name, pid) in enumerate(groups.keys):
                m = self._model((node, name))
                if m is not None:
                    if pid is not None:
                        _remember(m.pids, int(pid), self.max_pids)
                    m.last_ts = max(m.last_ts, int(last[i]))
            return
        run = pc.fill_null(b.column("run_id"), item.source)
        device = pc.fill_null(b.column("device"), "unknown")
        groups = group(b.column("node"), model, run, device, b.column("pid"))
        last = groups.maxs(ends)
        for i, (node, name, run_id, dev, pid) in enumerate(groups.keys):
            m = self._model((node, name))
            if m is None:
                continue
            _remember(m.windows, (dev, run_id), self.max_windows)
            _remember(m.devices, dev, self.max_devices)
            if pid is not None:
                _remember(m.pids, int(pid), self.max_pids)
            m.last_ts = max(m.last_ts, int(last[i]))

    def _requests(self, b: pa.RecordBatch, model: pa.Array) -> None:
        """Sum the requests per (node, model, bin of end time) into the model's load."""
        keys, sums = request_sums(b, model, self.bin_ns)
        for g, (node, name, index) in enumerate(keys):
            m = self._model((node, name))
            if m is not None:
                m.load.add(int(index), sums[g])
                m.last_ts = max(m.last_ts, m.load.last_end_ns)

    def serving_load(self, key: tuple[str, str]) -> ServingLoad | None:
        """The model's serving load over the request window; None when it served no request there."""
        m = self._models.get(key)
        return None if m is None else m.load.load(len(m.devices))

    # -- concluding ---------------------------------------------------------------------------------

    def derive(self, results: Mapping[str, AnalyzerResult]) -> BottleneckResult:
        """Classify every model the results or the folded events know."""
        keys: dict[tuple[str, str], None] = dict.fromkeys(self._models)
        for name in ("launch", "latency"):
            keys.update(dict.fromkeys(_keyed(results.get(name))))
        out: dict[tuple[str, str], Classification] = {}
        serving: dict[tuple[str, str], ServingLoad] = {}
        for key in list(keys)[: self.max_models]:
            load = self.serving_load(key)
            if load is not None:
                serving[key] = load
            signals = self.signals(key, results, load)
            c = classify(signals)
            out[key] = c
            self._report(key, c, load)
        return BottleneckResult(out, serving)

    def _report(self, key: tuple[str, str], c: Classification, load: ServingLoad | None) -> None:
        """A finding when the class differs from the last reported one (with enough confidence)."""
        if c.bottleneck_class == UNKNOWN or c.confidence < self.min_finding_confidence:
            return
        before = self._reported.get(key)
        if before == c.bottleneck_class:
            return
        self._reported[key] = c.bottleneck_class
        node, model = key
        m = self._models.get(key)
        summary = (
            f"{model}: bottleneck is {c.bottleneck_class} (confidence {c.confidence:.2f})"
            if before is None
            else f"{model}: bottleneck changed from {before} to {c.bottleneck_class} (confidence {c.confidence:.2f})"
        )
        self.emit(
            Finding(
                ts_ns=m.last_ts if m is not None else 0,
                node=node,
                analyzer=self.name,
                subject=model,
                severity="info" if before is None else "warning",
                confidence=c.confidence,
                summary=summary,
                evidence={
                    "bottleneck_class": c.bottleneck_class,
                    "previous_class": before,
                    "top_evidence": [dict(e) for e in c.top_evidence],
                    "scores": dict(c.scores),
                    **({"serving": load.to_dict()} if load is not None else {}),
                },
            )
        )

    def signals(
        self, key: tuple[str, str], results: Mapping[str, AnalyzerResult], load: ServingLoad | None = None
    ) -> dict[str, float | None]:
        """Every signal of the taxonomy for one (node, model); None where the inputs do not tell."""
        m = self._models.get(key) or _Model()
        s: dict[str, float | None] = {}
        if load is not None:
            s["queue_share"] = load.queue_share
        launch = getattr(results.get("launch"), "groups", {}).get(key)
        if launch is not None:
            s["microkernel_pct"] = launch.microkernel_pct
            s["kernel_launch_rate"] = launch.launch_rate_per_s
            s["avg_kernel_duration_us"] = launch.mean_kernel_us
            overhead = launch.launch_overhead  # None when no event had a known launch call
            if overhead is not None and overhead.get("launch_cpu_s") is not None and launch.wall_s > 0:
                s["cpu_overhead_ratio"] = min(1.0, float(overhead["launch_cpu_s"]) / launch.wall_s)
        kar = getattr(results.get("kar"), "models", {}).get(key)
        if kar is not None:
            s["kernels_per_iteration"] = kar.kernels_per_iteration
        lat = getattr(results.get("latency"), "models", {}).get(key)
        if lat is not None and lat.p50_s and lat.p95_s is not None:
            s["latency_p95_p50"] = lat.p95_s / lat.p50_s
        s.update(_activity(results.get("activity"), key[0], m))
        fam = getattr(results.get("families"), "groups", {}).get(key)
        if fam is not None:
            shares = {f: v.share or 0.0 for f, v in fam.families.items()}
            if shares:
                s["compute_kernel_pct"] = sum(shares.get(f, 0.0) for f in COMPUTE_FAMILIES)
                s["memory_bound_kernel_pct"] = sum(shares.get(f, 0.0) for f in MEMORY_FAMILIES)
        placed = getattr(results.get("roofline"), "placed_shares", None)
        roof = placed(*key) if placed is not None else None
        if roof is not None:  # hardware counters placed the model's kernels: the roofline says, not their names
            s["compute_kernel_pct"], s["memory_bound_kernel_pct"] = roof
        s.update(_telemetry(results.get("telemetry"), key[0], m, s.get("gpu_active_ratio")))
        s.update(_sched(results.get("sched"), key[0], m))
        s.update(_throttle(results.get("throttle"), key))
        return s


# -- reading the other analyzers' results (their typed rows; a result that is absent, as when an
# analyzer is not built, is simply a missing input) -------------------------------------------------


def _keyed(result: AnalyzerResult | None) -> list[tuple[str, str]]:
    for attr in ("groups", "models"):
        d = getattr(result, attr, None)
        if isinstance(d, Mapping):
            return [k for k in d if isinstance(k, tuple) and len(k) == 2]
    return []


def _activity(result: AnalyzerResult | None, node: str, m: _Model) -> dict[str, float | None]:
    """Device active share and copy-only share of busy time over the model's capture windows."""
    windows = getattr(result, "windows", None)
    if not windows or not m.windows:
        return {}
    span = busy = noncompute = 0.0
    for w in windows:
        if w.node != node or (w.device, w.run_id) not in m.windows:
            continue
        length = max(1, w.window_end_ns - w.window_start_ns)
        span += length
        busy += w.active_ratio * length
        noncompute += w.noncompute_ratio * length
    if span <= 0:
        return {}
    active = min(1.0, busy / span)
    return {
        "gpu_active_ratio": active,
        "gpu_idle_ratio": 1.0 - active,
        "memory_ops_ratio": ratio(noncompute, busy),
    }


def _telemetry(result: AnalyzerResult | None, node: str, m: _Model, active: float | None) -> dict[str, float | None]:
    """Utilisation, memory utilisation, throttle flags and clock drop of the model's GPUs.

    Where a GPU has activity counters (docs/health.md, "Activity"), ``gpu_utilization`` is its SM
    activity (else its graphics engine's) and ``gpu_memory_utilization`` its DRAM activity: a GPU
    "100 % utilised" by one small kernel is then seen as the idle GPU it is (the coarse figures stay on
    /metrics as ``aaco_gpu_utilization_ratio``).
    """
    series = getattr(result, "series", None)
    if not series or not m.devices:
        return {}
    util: dict[str, list[float]] = {}
    mem: dict[str, list[float]] = {}
    busy: dict[str, dict[str, float]] = {}  # gpu -> activity reading -> value
    throttle: list[float] = []
    clocks: dict[tuple[str, str, str], dict[str, float]] = {}
    for s in series:
        gpu = s.labels.get("gpu")
        if s.labels.get("node") != node or gpu not in m.devices:
            continue
        if s.metric == tm.UTILIZATION:
            util.setdefault(gpu, []).append(s.value)
        elif s.metric == tm.MEMORY_UTILIZATION:
            mem.setdefault(gpu, []).append(s.value)
        elif s.metric in _ACTIVITY:
            busy.setdefault(gpu, {})[s.metric] = s.value
        elif s.metric == tm.THROTTLE:
            throttle.append(s.value)
        elif s.metric in (tm.CLOCK, tm.CLOCK_MAX) and s.attr in CLOCK_DOMAINS:
            clocks.setdefault((s.source, gpu, s.attr), {})[s.metric] = s.value
    out: dict[str, float | None] = {}
    compute = _per_gpu(util, busy, (tm.SM_ACTIVE, tm.GRAPHICS_ACTIVE))
    if compute:
        out["gpu_utilization"] = float(np.mean(compute))
    memory = _per_gpu(mem, busy, (tm.DRAM_ACTIVE,))
    if memory:
        out["gpu_memory_utilization"] = float(np.mean(memory))
    if throttle:
        out["throttle_active"] = float(max(throttle))
    drops = []
    for (_, gpu, _), c in clocks.items():
        if tm.CLOCK in c and c.get(tm.CLOCK_MAX, 0.0) > 0:
            loaded_by = np.mean(util[gpu]) if gpu in util else active
            loaded = loaded_by is None or loaded_by >= UNDER_LOAD
            drops.append(max(0.0, 1.0 - c[tm.CLOCK] / c[tm.CLOCK_MAX]) if loaded else 0.0)
    if drops:
        out["clock_drop_under_load"] = float(max(drops))
    return out


_ACTIVITY: Final = frozenset({tm.SM_ACTIVE, tm.GRAPHICS_ACTIVE, tm.DRAM_ACTIVE})


def _per_gpu(coarse: dict[str, list[float]], busy: dict[str, dict[str, float]], prefer: tuple[str, ...]) -> list[float]:
    """Per GPU the first of ``prefer``'s activity readings it has, else the mean of its coarse readings."""
    out = []
    for gpu in sorted(coarse.keys() | busy.keys()):
        fine = next((busy[gpu][k] for k in prefer if k in busy.get(gpu, {})), None)
        if fine is not None:
            out.append(fine)
        elif gpu in coarse:
            out.append(float(np.mean(coarse[gpu])))
    return out


def _sched(result: AnalyzerResult | None, node: str, m: _Model) -> dict[str, float | None]:
    """Scheduler interference, fault penalty and involuntary switch share of the model's processes."""
    workloads = getattr(result, "workloads", None)
    if not workloads or not m.pids:
        return {}
    mine = [w for w in workloads if w.node == node and w.pid in m.pids and not w.exited]
    if not mine:
        return {}
    interference = [w.interference_ratio for w in mine if w.interference_ratio is not None]
    penalty = [w.fault_penalty_index for w in mine if w.fault_penalty_index is not None]
    switches = sum(w.context_switches for w in mine)
    involuntary = sum(w.involuntary for w in mine)
    return {
        "sched_interference_index": max(interference) if interference else None,
        "fault_penalty_index": max(penalty) if penalty else None,
        "involuntary_switch_ratio": ratio(involuntary, switches),
    }


def _throttle(result: AnalyzerResult | None, key: tuple[str, str]) -> dict[str, float | None]:
    """Latency impact of throttle episodes on the model (the throttle analyzer's, when it runs)."""
    if result is None:
        return {}
    impact = getattr(result, "latency_impact", None)
    if callable(impact):
        value = impact(*key)
        return {"throttle_latency_impact": value} if value is not None else {}
    return {}


def create(s: BottleneckSettings, hints: AgentHints, max_models: int) -> BottleneckAnalyzer:
    """The analyzer for its settings and what the agent derives from its sources."""
    return BottleneckAnalyzer(
        max_models=max_models,
        max_windows=s.max_windows,
        max_devices=s.max_devices,
        max_pids=s.max_pids,
        min_finding_confidence=s.min_finding_confidence,
        request_window_s=s.request_window_s,
    )
