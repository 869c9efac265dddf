"""Launch tax (the seeds' definition): how much of the kernel stream is tiny kernels launched fast.

``launch_tax = microkernel_pct x kernel_launch_rate / 1000`` with ``microkernel_pct`` the fraction
(0..1) of kernels shorter than ``microkernel_threshold_us`` (default 10 us, as in the seeds) and
``kernel_launch_rate`` kernels per second of wall time. The product is microkernel launches per
millisecond. Wall time is the model's iteration time when kernels are correlated to iterations,
else the sum of each capture's window (first kernel start to last kernel end, per ``run_id``).

Health bands (documented in docs/metrics.md): a launch costs the CPU roughly 5-10 us, so below 1
microkernel launch per ms at most ~1 % of the launching thread goes to launching work that is
shorter than its launch (``healthy``); from 5 per ms, 25-50 % does and the launching thread, not
the GPU, sets the pace (``severe``); between is ``elevated``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveFloat, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer, ratio
from aaco.analyzers.grouping import group
from aaco.analyzers.launch_overhead import LaunchOverhead
from aaco.contract.config_base import StrictModel
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define

LAUNCH_TAX = define(
    "aaco.launch.tax",
    "aaco_launch_tax_score",
    "gauge",
    "{kernel}/ms",
    "Launch tax: microkernel fraction x kernel launches per second / 1000.",
    ("node", "model"),
)
MICROKERNEL_RATIO = define(
    "aaco.launch.microkernel_ratio",
    "aaco_microkernel_ratio",
    "gauge",
    "1",
    "Fraction of kernels shorter than the microkernel threshold.",
    ("node", "model"),
)
LAUNCH_RATE = define(
    "aaco.launch.rate",
    "aaco_kernel_launch_rate_per_second",
    "gauge",
    "{kernel}/s",
    "Kernels launched per second of wall time.",
    ("node", "model"),
)
KERNELS_TOTAL = define(
    "aaco.kernels",
    "aaco_kernels",
    "counter",
    "{event}",
    "GPU events seen (kernels, copies, memsets).",
    ("node", "model", "kind"),
)


def launch_band(value: float | None) -> str | None:
    """Health band of a launch tax value."""
    if value is None:
        return None
    if value < 1.0:
        return "healthy"
    return "elevated" if value < 5.0 else "severe"


@dataclass
class _Group:
    kernels: int = 0
    micro: int = 0
    busy_ns: int = 0
    iteration_ns: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    runs: OrderedDict[str, list[int]] = field(default_factory=OrderedDict)  # run_id -> [min start, max end]


@dataclass(frozen=True)
class LaunchGroup:
    """Launch statistics of one (node, model); ``launch_overhead`` is HTA's measures (``LaunchOverhead``)."""

    kernels: int
    microkernels: int
    microkernel_pct: float | None
    launch_rate_per_s: float | None
    launch_tax: float | None
    wall_s: float
    mean_kernel_us: float | None
    by_kind: Mapping[str, int]
    launch_overhead: Mapping[str, Any] | None  # None when no event had a known launch call

    @property
    def band(self) -> str | None:
        """The health band of ``launch_tax``."""
        return launch_band(self.launch_tax)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``band`` included)."""
        return {
            "kernels": self.kernels,
            "microkernels": self.microkernels,
            "microkernel_pct": self.microkernel_pct,
            "launch_rate_per_s": self.launch_rate_per_s,
            "launch_tax": self.launch_tax,
            "band": self.band,
            "wall_s": self.wall_s,
            "mean_kernel_us": self.mean_kernel_us,
            "by_kind": dict(self.by_kind),
            "launch_overhead": self.launch_overhead,
        }


@dataclass(frozen=True)
class LaunchResult:
    """Launch statistics per (node, model)."""

    threshold_us: float
    groups: Mapping[tuple[str, str], LaunchGroup]
    overhead_points: tuple[MetricPoint, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """``{"microkernel_threshold_us", "models": {...}}``."""
        nodes = {n for n, _ in self.groups}
        return {
            "microkernel_threshold_us": self.threshold_us,
            "models": {
                (m if len(nodes) <= 1 else f"{n}/{m}"): g.to_dict() for (n, m), g in sorted(self.groups.items())
            },
        }

    def points(self) -> list[MetricPoint]:
        """Launch tax, microkernel ratio, launch rate gauges and the kernel counters."""
        pb = PointBuilder()
        for (node, model), g in self.groups.items():
            for kind, n in g.by_kind.items():
                pb.add(KERNELS_TOTAL, float(n), node=node, model=model, kind=kind)
            if g.launch_tax is not None and g.launch_rate_per_s is not None:
                pb.add(LAUNCH_TAX, g.launch_tax, node=node, model=model)
                pb.add(LAUNCH_RATE, g.launch_rate_per_s, node=node, model=model)
            if g.microkernel_pct is not None:
                pb.add(MICROKERNEL_RATIO, g.microkernel_pct, node=node, model=model)
        return [*pb.points, *self.overhead_points]


class LaunchSettings(StrictModel):
    """Launch tax and HTA's launch measures."""

    microkernel_threshold_us: PositiveFloat = Field(10.0, description="Kernels shorter than this are microkernels.")
    runtime_outlier_us: PositiveFloat = Field(
        50.0, description="Launch calls longer than this are runtime outliers (HTA runtime_cutoff)."
    )
    delay_outlier_us: PositiveFloat = Field(
        100.0, description="Launch delays longer than this are outliers (HTA launch_delay_cutoff)."
    )
    max_runs: PositiveInt = Field(1024, description="Runs (capture windows) tracked per model for wall time.")


class LaunchAnalyzer(Analyzer):
    """Counts kernels, microkernels and wall time per model; HTA's launch measures (``LaunchOverhead``)."""

    name = "launch"
    kinds = frozenset({"iterations", "kernels"})

    def __init__(
        self,
        microkernel_threshold_us: float = 10.0,
        max_groups: int = 256,
        max_runs: int = 1024,
        runtime_outlier_us: float = 50.0,
        delay_outlier_us: float = 100.0,
    ) -> None:
        self._overhead = LaunchOverhead(runtime_outlier_us, delay_outlier_us, max_groups=max_groups)
        self._threshold_ns = int(microkernel_threshold_us * 1000)
        self._threshold_us = microkernel_threshold_us
        self._max_groups = max_groups
        self._max_runs = max_runs
        self._groups: dict[tuple[str, str], _Group] = {}

    def _group(self, key: tuple[str, str]) -> _Group | None:
        g = self._groups.get(key)
        if g is None and len(self._groups) < self._max_groups:
            g = self._groups[key] = _Group()
        return g

    def update(self, item: EventBatch) -> None:
        """Fold kernels (counts, durations, windows) or iterations (wall time) in."""
        b = item.batch
        if b.num_rows == 0:
            return
        table = pa.Table.from_batches([b])
        if item.kind == "iterations":
            t = table.append_column("dur", pc.subtract(table["end_ns"], table["start_ns"]))
            t = t.set_column(t.schema.get_field_index("model"), "model", pc.fill_null(t["model"], "unknown"))
            for row in t.group_by(["node", "model"]).aggregate([("dur", "sum")]).to_pylist():
                g = self._group((row["node"], row["model"]))
                if g is not None:
                    g.iteration_ns += int(row["dur_sum"])
            return
        self._overhead.update(table, pc.fill_null(table["model"], "unknown"))
        for row in self._aggregate(table, item.source):
            g = self._group((row["node"], row["model"]))
            if g is None:
                continue
            n = int(row["start_count"])
            g.by_kind[row["kind"]] = g.by_kind.get(row["kind"], 0) + n
            if row["kind"] == "kernel":
                g.kernels += n
                g.micro += int(row["micro_sum"])
                g.busy_ns += int(row["kdur_sum"])
            window = g.runs.get(row["run"])
            if window is None:
                g.runs[row["run"]] = [row["start_min"], row["end_max"]]
                while len(g.runs) > self._max_runs:
                    g.runs.popitem(last=False)
            else:
                window[0] = min(window[0], row["start_min"])
                window[1] = max(window[1], row["end_max"])

    def _aggregate(self, table: pa.Table, source: str) -> list[dict[str, Any]]:
        """Per (node, model, run, kind): count, first start, last end, kernel busy time, microkernels."""
        starts, ends = table["start_ns"].to_numpy(), table["end_ns"].to_numpy()
        dur = ends - starts
        is_kernel = pc.equal(table["kind"], "kernel").to_numpy(zero_copy_only=False)
        groups = group(
            table["node"],
            pc.fill_null(table["model"], "unknown"),
            pc.fill_null(table["run_id"], source),
            table["kind"],
        )
        columns = {
            "start_count": groups.counts(),
            "start_min": groups.mins(starts),
            "end_max": groups.maxs(ends),
            "kdur_sum": groups.sums(np.where(is_kernel, dur, 0)),
            "micro_sum": groups.sums((is_kernel & (dur < self._threshold_ns)).astype(np.int64)),
        }
        return [
            {
                "node": key[0],
                "model": key[1],
                "run": key[2],
                "kind": key[3],
                **{name: int(col[i]) for name, col in columns.items()},
            }
            for i, key in enumerate(groups.keys)
        ]

    def snapshot(self) -> LaunchResult:
        """Launch tax per model."""
        out: dict[tuple[str, str], LaunchGroup] = {}
        for key, g in self._groups.items():
            wall_ns = (
                g.iteration_ns
                if key[1] != "unknown" and g.iteration_ns > 0
                else sum(max(0, e - s) for s, e in g.runs.values())
            )
            rate = ratio(g.kernels, wall_ns / 1e9)
            micro = ratio(g.micro, g.kernels)
            tax = micro * rate / 1000 if (micro is not None and rate is not None) else None
            out[key] = LaunchGroup(
                kernels=g.kernels,
                microkernels=g.micro,
                microkernel_pct=micro,
                launch_rate_per_s=rate,
                launch_tax=tax,
                wall_s=wall_ns / 1e9,
                mean_kernel_us=(g.busy_ns / g.kernels / 1000) if g.kernels else None,
                by_kind=dict(g.by_kind),
                launch_overhead=self._overhead.result(key),
            )
        pb = PointBuilder()
        self._overhead.points(pb)
        return LaunchResult(self._threshold_us, out, tuple(pb.points))


def create(s: LaunchSettings, hints: AgentHints, max_models: int) -> LaunchAnalyzer:
    """The analyzer for its settings and what the agent derives from its sources."""
    return LaunchAnalyzer(
        microkernel_threshold_us=s.microkernel_threshold_us,
        max_groups=max_models,
        max_runs=s.max_runs,
        runtime_outlier_us=s.runtime_outlier_us,
        delay_outlier_us=s.delay_outlier_us,
    )
