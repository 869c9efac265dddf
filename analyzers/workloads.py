"""Who uses each GPU: per workload (pod, Slurm job, or bare process) what its processes used, and its energy.

The ``gpu_processes`` source publishes one ``telemetry`` row per process and measured value
(``PROCESS_*``, with the process's pod, container and job as attributes). This analyzer sums them per
workload and device at each sample: SM (GFX) share, memory-controller share, device memory, the
number of processes; only values measured per process, never the device's (docs/shared-gpus.md).
A workload is its pod's namespace, pod and container, its Slurm job, or, for a process in neither,
its executable's name.

Energy per workload (``contract.energy``): at every reading of a GPU's energy counter (``hw.energy``;
a GPU without one has its power integrated over the samples instead) the interval's energy goes to
the workloads on that GPU (its MIG devices included): to the one workload alone on a whole GPU as
``measured``, else split above the GPU's idle line by the workloads' SM shares as ``apportioned``;
the rest is the GPU's own, ``idle``. The idle line is ``idle_power_w`` where set, else the lowest
power the GPU drew while the agent watched. Summed over methods and workloads, a GPU's series add up
to its energy since the agent first read it. Bounded: ``max_gpus`` GPUs, ``max_workloads`` per GPU.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, replace
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.contract.config_base import StrictModel
from aaco.contract.energy import IDLE, EnergyLedger
from aaco.contract.gpu_processes import PROCESS_METRICS
from aaco.contract.jobs import ATTR_JOB
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define
from aaco.contract.telemetry import (
    ATTR_CONTAINER,
    ATTR_NAMESPACE,
    ATTR_PARENT_UUID,
    ATTR_POD,
    ENERGY,
    POWER,
    PROCESS_MEMORY_UTILIZATION,
    PROCESS_UTILIZATION,
)

WORKLOAD_LABELS: Final = ("node", "gpu", "gpu_uuid", "namespace", "pod", "container", "job", "process")
_PROCESS_NAME: Final = "process.executable.name"

UTILIZATION = define(
    "aaco.gpu.workload.utilization",
    "aaco_gpu_workload_utilization_ratio",
    "gauge",
    "1",
    "Share of a device's SM (NVIDIA) or GFX engine (AMD) time its workload's processes used, as the driver "
    "measured per process (NVML process utilisation, amdsmi engine usage, nvidia-smi pmon).",
    WORKLOAD_LABELS,
)
MEMORY_UTILIZATION = define(
    "aaco.gpu.workload.memory.utilization",
    "aaco_gpu_workload_memory_utilization_ratio",
    "gauge",
    "1",
    "Share of a device's memory-controller time its workload's processes used (per process).",
    WORKLOAD_LABELS,
)
MEMORY_USED = define(
    "aaco.gpu.workload.memory.usage",
    "aaco_gpu_workload_memory_used_bytes",
    "gauge",
    "By",
    "Device memory the workload's processes hold on the device (a MIG device's or partition's own memory).",
    WORKLOAD_LABELS,
)
PROCESSES = define(
    "aaco.gpu.workload.processes",
    "aaco_gpu_workload_processes",
    "gauge",
    "{process}",
    "Processes of the workload on the device.",
    WORKLOAD_LABELS,
)
ENERGY_TOTAL = define(
    "aaco.gpu.workload.energy",
    "aaco_gpu_workload_energy_joules",
    "counter",
    "J",
    "GPU energy per workload since the agent first read the GPU: method measured (the workload alone on a whole "
    "GPU), apportioned (energy above idle split by SM share, Kepler's model) or idle (the GPU's own; no workload "
    "labels). Summed over a GPU's series: its energy counter's increase.",
    (*WORKLOAD_LABELS, "method"),
)

Workload = tuple[str, str, str, str, str]  # namespace, pod, container, job, process


class WorkloadsSettings(StrictModel):
    """Per-workload GPU use and energy on shared GPUs (docs/shared-gpus.md)."""

    idle_power_w: NonNegativeFloat | None = Field(
        None, description="A GPU's idle power for apportioning energy; null: the lowest power it drew while watched."
    )
    max_gpus: PositiveInt = Field(256, description="GPUs followed at once, over every node.")
    max_workloads: PositiveInt = Field(64, description="Workloads per GPU at most (bounds label sets).")
    stale_after_s: PositiveFloat = Field(
        60.0, description="A source's processes not read again within this much data time are forgotten."
    )


@dataclass
class _Use:
    gpu: Hashable  # the physical GPU (its key): a MIG device's or partition's parent
    whole: bool  # the device is a whole GPU, not a slice of one
    utilization: float | None = None  # each a sum over the workload's processes; None: not measured
    memory_utilization: float | None = None
    memory_bytes: float | None = None
    processes: int = 0

    def add(self, name: str, value: float) -> None:
        """One process's measured value into the workload's sum."""
        setattr(self, name, (getattr(self, name) or 0.0) + value)


@dataclass
class _Gpu:
    node: str
    index: str
    uuid: str
    min_power_w: float | None = None
    power_ts_ns: int | None = None
    power_w: float = 0.0
    integrated_j: float = 0.0
    has_counter: bool = False


@dataclass(frozen=True)
class WorkloadsResult:
    """The workloads on every device now, and every GPU's energy per workload so far."""

    uses: tuple[tuple[tuple[str, str, str], Workload, _Use], ...]  # ((node, device, uuid), workload, use)
    energy: tuple[tuple[tuple[str, str, str], Workload, str, float], ...]  # ((node, gpu, uuid), workload, method, J)

    def to_dict(self) -> dict[str, Any]:
        """``{"workloads": [...], "energy": [...]}``, one entry per device and workload."""
        names = ("namespace", "pod", "container", "job", "process")
        return {
            "workloads": [
                {
                    "node": d[0],
                    "gpu": d[1],
                    "gpu_uuid": d[2],
                    **dict(zip(names, w, strict=True)),
                    "utilization": u.utilization,
                    "memory_utilization": u.memory_utilization,
                    "memory_bytes": u.memory_bytes,
                    "processes": u.processes,
                }
                for d, w, u in self.uses
            ],
            "energy": [
                {
                    "node": d[0],
                    "gpu": d[1],
                    "gpu_uuid": d[2],
                    **dict(zip(names, w, strict=True)),
                    "method": m,
                    "joules": j,
                }
                for d, w, m, j in self.energy
            ],
        }

    def points(self) -> list[MetricPoint]:
        """The gauges per device and workload, the energy counters per GPU, workload and method."""
        pb = PointBuilder()
        for (node, gpu, uuid), w, u in self.uses:
            labels = _labels(node, gpu, uuid, w)
            for metric, value in (
                (UTILIZATION, u.utilization),
                (MEMORY_UTILIZATION, u.memory_utilization),
                (MEMORY_USED, u.memory_bytes),
            ):
                if value is not None:
                    pb.add(metric, value, **labels)
            pb.add(PROCESSES, float(u.processes), **labels)
        for (node, gpu, uuid), w, method, joules in self.energy:
            pb.add(ENERGY_TOTAL, joules, **_labels(node, gpu, uuid, w), method=method)
        return pb.points


def _labels(node: str, gpu: str, uuid: str, w: Workload) -> dict[str, str]:
    return dict(zip(WORKLOAD_LABELS, (node, gpu, uuid, *w), strict=True))


_NO_WORKLOAD: Final[Workload] = ("", "", "", "", "")


class WorkloadsAnalyzer(Analyzer):
    """Sums the processes' rows per workload and device; apportions each GPU's energy among its workloads."""

    name = "workloads"
    kinds = frozenset({"telemetry"})

    def __init__(self, settings: WorkloadsSettings | None = None) -> None:
        self.s = settings or WorkloadsSettings()
        self._samples: dict[tuple[str, str], tuple[int, dict[tuple[tuple[str, str, str], Workload], _Use]]] = {}
        self._activity: OrderedDict[Hashable, tuple[dict[Workload, float], bool]] = OrderedDict()
        self._gpus: OrderedDict[Hashable, _Gpu] = OrderedDict()
        self.ledger = EnergyLedger(max_devices=self.s.max_gpus, max_workloads=self.s.max_workloads)
        self._newest = 0

    def update(self, item: EventBatch) -> None:
        """Process rows: the source's newest sample per workload. Energy and power rows: the GPUs' energy."""
        b = item.batch
        metric = b.column("metric")
        procs = b.filter(pc.is_in(metric, _process_metrics()))
        if procs.num_rows:
            self._processes(procs, item.source)
        power = b.filter(pc.is_in(metric, _power_metrics()))
        if power.num_rows:
            self._energy(power)

    def _processes(self, b: pa.RecordBatch, item_source: str) -> None:
        cols = {
            c: b.column(c).to_pylist() for c in ("ts_ns", "node", "device", "metric", "value", "gpu_uuid", "source")
        }
        attrs = b.column("attributes").to_pylist()
        fresh: set[tuple[str, str]] = set()  # a batch is its source's whole sample: it replaces the one held
        for i, metric in enumerate(cols["metric"]):
            node, ts = cols["node"][i], cols["ts_ns"][i]
            key = (node, cols["source"][i] or item_source)
            held = self._samples.get(key)
            if held is None or held[0] < ts or (held[0] == ts and key not in fresh):
                held = self._samples[key] = (ts, {})
                fresh.add(key)
                self._newest = max(self._newest, ts)
            elif held[0] > ts:
                continue  # an older sample arriving late
            a = dict(attrs[i] or ())
            device = (node, cols["device"][i], cols["gpu_uuid"][i] or "")
            use = held[1].get((device, _workload(a)))
            if use is None:
                use = held[1][(device, _workload(a))] = _Use(*_gpu_key(device, a.get(ATTR_PARENT_UUID, "")))
            value = float(cols["value"][i])
            if metric == PROCESS_UTILIZATION:
                use.add("utilization", value)
                use.processes += 1  # every backend that measures a process's share lists it once here
            elif metric == PROCESS_MEMORY_UTILIZATION:
                use.add("memory_utilization", value)
            else:
                if use.utilization is None:  # a process listed with its memory only (a MIG device, the XML)
                    use.processes += 1
                use.add("memory_bytes", value)
        for key in [k for k, (ts, _) in self._samples.items() if ts < self._newest - int(self.s.stale_after_s * 1e9)]:
            del self._samples[key]
        self._refresh_activity()

    def _refresh_activity(self) -> None:
        """Per physical GPU: each workload's SM share now, and whether one workload holds the whole GPU."""
        activity: dict[Hashable, tuple[dict[Workload, float], bool]] = {}
        for _ts, uses in self._samples.values():
            for (_device, w), use in uses.items():
                shares, exclusive = activity.setdefault(use.gpu, ({}, True))
                shares[w] = shares.get(w, 0.0) + (use.utilization or 0.0)
                activity[use.gpu] = (shares, exclusive and use.whole)
        self._activity = OrderedDict(
            (k, (shares, exclusive and len(shares) == 1)) for k, (shares, exclusive) in activity.items()
        )

    def _energy(self, b: pa.RecordBatch) -> None:
        cols = {c: b.column(c).to_pylist() for c in ("ts_ns", "node", "device", "metric", "value", "gpu_uuid")}
        for i, metric in enumerate(cols["metric"]):
            node, device, uuid = cols["node"][i], cols["device"][i], cols["gpu_uuid"][i] or ""
            if "/" in device:
                continue  # power and energy are a GPU's, never a MIG device's or partition's
            key, _whole = _gpu_key((node, device, uuid), "")
            gpu = self._gpus.pop(key, None) or _Gpu(node, device, uuid)
            self._gpus[key] = gpu
            while len(self._gpus) > self.s.max_gpus:
                self._gpus.popitem(last=False)
            ts, value = cols["ts_ns"][i], float(cols["value"][i])
            if metric == POWER:
                gpu.min_power_w = value if gpu.min_power_w is None else min(gpu.min_power_w, value)
                if gpu.has_counter:
                    continue
                if gpu.power_ts_ns is not None:
                    if ts <= gpu.power_ts_ns:
                        continue  # an older reading arriving late
                    gpu.integrated_j += (value + gpu.power_w) / 2 * (ts - gpu.power_ts_ns) / 1e9  # trapezoids
                gpu.power_ts_ns, gpu.power_w = ts, value
                self._observe(key, gpu, ts, gpu.integrated_j)
            else:
                gpu.has_counter = True
                self._observe(key, gpu, ts, value)

    def _observe(self, key: Hashable, gpu: _Gpu, ts: int, energy_j: float) -> None:
        # the processes' rows name the GPU by UUID where their backend knows it, else by its index
        found = self._activity.get(key) or self._activity.get((gpu.node, "#" + gpu.index))
        shares, exclusive = found or ({}, False)
        idle = self.s.idle_power_w if self.s.idle_power_w is not None else (gpu.min_power_w or 0.0)
        self.ledger.observe(key, ts, energy_j, idle, shares, exclusive=exclusive)

    def snapshot(self) -> WorkloadsResult:
        """The workloads now, and the energy so far."""
        uses = tuple(
            (device, w, replace(use))  # a copy: the snapshot must not change with later samples
            for _ts, held in sorted(self._samples.values(), key=lambda t: t[0])
            for (device, w), use in sorted(held.items(), key=lambda kv: kv[0])
        )
        energy = []
        for key in self.ledger.devices():
            gpu = self._gpus.get(key)
            if gpu is None:
                continue
            where = (gpu.node, gpu.index, gpu.uuid)
            for (w, method), joules in self.ledger.totals(key).items():
                energy.append((where, w, method, joules))  # type: ignore[arg-type]
            energy.append((where, _NO_WORKLOAD, IDLE, self.ledger.device_totals(key)[0]))
        return WorkloadsResult(uses, tuple(energy))  # type: ignore[arg-type]


def _gpu_key(device: tuple[str, str, str], parent_uuid: str) -> tuple[Hashable, bool]:
    """The physical GPU a device belongs to (by UUID, else node and index), and whether it is the whole GPU."""
    node, index, uuid = device
    if "/" not in index:
        return ((node, uuid) if uuid else (node, "#" + index)), True
    return ((node, parent_uuid) if parent_uuid else (node, "#" + index.split("/", 1)[0])), False


def _workload(a: dict[str, str]) -> Workload:
    pod, job = a.get(ATTR_POD, ""), a.get(ATTR_JOB, "")
    process = "" if pod or job else a.get(_PROCESS_NAME, "")
    return (a.get(ATTR_NAMESPACE, ""), pod, a.get(ATTR_CONTAINER, ""), job, process)


@functools.cache
def _process_metrics() -> pa.Array:
    """Built on first use: pyarrow's conversion of a list at import time would import pandas."""
    return pa.array(sorted(PROCESS_METRICS), pa.string())


@functools.cache
def _power_metrics() -> pa.Array:
    return pa.array([POWER, ENERGY], pa.string())


def create(s: WorkloadsSettings, hints: AgentHints, max_models: int) -> WorkloadsAnalyzer:
    """The analyzer for its settings."""
    return WorkloadsAnalyzer(s)
