"""Kernel time per family (GEMM, convolution, attention, ...) per model, per iteration, and the top kernels.

Time is the sum of kernel durations (GPU time, as HTA's kernel breakdown counts it; overlapping
kernels on several streams each count), so the shares say where the GPU work goes, not how busy
the device was (that is the activity analyzer's union of intervals). Per-iteration figures divide
by the iterations of the model seen so far; kernels outside iterations (model ``unknown``) have
totals and shares only.

Bounded: at most ``max_models`` (node, model) groups and ``max_names`` kernel names per group;
time of names beyond the cap is kept under ``(other names)`` and counted in ``names_dropped``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer, ratio
from aaco.analyzers.grouping import group
from aaco.contract.config_base import StrictModel
from aaco.contract.kernels import FAMILIES, families
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define

FAMILY_SECONDS = define(
    "aaco.kernel.family.time",
    "aaco_kernel_family_seconds",
    "counter",
    "s",
    "GPU time of kernels by family (sum of durations).",
    ("node", "model", "family"),
)
FAMILY_PER_ITERATION = define(
    "aaco.kernel.family.time_per_iteration",
    "aaco_kernel_family_seconds_per_iteration",
    "gauge",
    "s",
    "GPU time of kernels by family per iteration of the model (mean over the iterations seen).",
    ("node", "model", "family"),
)

OTHER_NAMES = "(other names)"
_FAMILY_INDEX = {f: i for i, f in enumerate(FAMILIES)}


@dataclass
class _Group:
    iterations: int = 0
    count: np.ndarray = field(default_factory=lambda: np.zeros(len(FAMILIES), np.int64))
    time_ns: np.ndarray = field(default_factory=lambda: np.zeros(len(FAMILIES), np.int64))
    names: dict[str, list[Any]] = field(default_factory=dict)  # name -> [family, count, time_ns]
    names_dropped: int = 0


@dataclass(frozen=True)
class FamilyRow:
    """One kernel family's kernels and time in one model."""

    kernels: int
    time_s: float
    share: float | None  # of the model's kernel time
    per_iteration_s: float | None  # None without iterations
    kernels_per_iteration: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class KernelRow:
    """One kernel name among a model's top kernels by time."""

    name: str
    family: str
    kernels: int
    time_s: float
    share: float | None
    mean_us: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return asdict(self)


@dataclass(frozen=True)
class FamiliesGroup:
    """Kernel time per family and the top kernels of one (node, model)."""

    iterations: int
    time_s: float
    families: Mapping[str, FamilyRow]  # the families with kernels
    top_kernels: tuple[KernelRow, ...]
    names_dropped: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "iterations": self.iterations,
            "time_s": self.time_s,
            "families": {f: row.to_dict() for f, row in self.families.items()},
            "top_kernels": [k.to_dict() for k in self.top_kernels],
            "names_dropped": self.names_dropped,
        }


@dataclass(frozen=True)
class FamiliesResult:
    """Kernel time per family and the top kernels per (node, model)."""

    groups: Mapping[tuple[str, str], FamiliesGroup]

    def to_dict(self) -> dict[str, Any]:
        """``{"families": [...], "models": {model: {...}}}``; with several nodes the key is ``node/model``."""
        nodes = {n for n, _ in self.groups}
        return {
            "families": list(FAMILIES),
            "models": {
                (m if len(nodes) <= 1 else f"{n}/{m}"): g.to_dict() for (n, m), g in sorted(self.groups.items())
            },
        }

    def points(self) -> list[MetricPoint]:
        """Family time counters and per-iteration gauges."""
        pb = PointBuilder()
        for (node, model), g in self.groups.items():
            for fam, v in g.families.items():
                pb.add(FAMILY_SECONDS, v.time_s, node=node, model=model, family=fam)
                if v.per_iteration_s is not None:
                    pb.add(FAMILY_PER_ITERATION, v.per_iteration_s, node=node, model=model, family=fam)
        return pb.points


class FamiliesSettings(StrictModel):
    """Kernel time per family and per kernel name."""

    max_names: PositiveInt = Field(2000, description="Kernel names tracked per model (further ones are summed).")
    top: PositiveInt = Field(10, description="Kernel names listed per model in the snapshot.")


class FamiliesAnalyzer(Analyzer):
    """Folds kernels into time per family and per kernel name, iterations into counts per model."""

    name = "families"
    kinds = frozenset({"iterations", "kernels"})

    def __init__(self, max_models: int = 256, max_names: int = 2000, top: int = 10) -> None:
        self._max_models = max_models
        self._max_names = max_names
        self._top = top
        self._groups: dict[tuple[str, str], _Group] = {}
        self.groups_dropped = 0

    def _group(self, key: tuple[str, str]) -> _Group | None:
        g = self._groups.get(key)
        if g is None:
            if len(self._groups) >= self._max_models:
                self.groups_dropped += 1
                return None
            g = self._groups[key] = _Group()
        return g

    def update(self, item: EventBatch) -> None:
        """Fold a batch of kernels or iterations in."""
        b = item.batch
        if b.num_rows == 0:
            return
        node = b.column("node")
        model = pc.fill_null(b.column("model"), "unknown")
        if item.kind == "iterations":
            pairs = group(node, model)
            for key, n in zip(pairs.keys, pairs.counts().tolist(), strict=True):
                g = self._group(key)
                if g is not None:
                    g.iterations += n
            return
        dur = np.maximum(pc.subtract(b.column("end_ns"), b.column("start_ns")).to_numpy(zero_copy_only=False), 0)
        # Names repeat heavily: reduce the batch to its distinct (node, model, name, kind) first.
        groups = group(node, model, b.column("name").fill_null(""), b.column("kind"))
        totals, counts = groups.sums(dur), groups.counts()
        keys = groups.keys
        fams = families(pa.array([k[2] for k in keys], pa.string()), pa.array([k[3] for k in keys], pa.string()))
        for (node_v, model_v, name_v, _), fam, total, count in zip(
            keys, fams, totals.tolist(), counts.tolist(), strict=True
        ):
            g = self._group((node_v, model_v))
            if g is None:
                continue
            i = _FAMILY_INDEX[fam]
            g.count[i] += count
            g.time_ns[i] += total
            entry = g.names.get(name_v)
            if entry is None:
                if len(g.names) >= self._max_names:
                    g.names_dropped += 1
                    entry = g.names.setdefault(OTHER_NAMES, ["mixed", 0, 0])
                else:
                    entry = g.names[name_v] = [fam, 0, 0]
            entry[1] += count
            entry[2] += total

    def snapshot(self) -> FamiliesResult:
        """Family time, shares, per-iteration time and the top kernels by time."""
        out: dict[tuple[str, str], FamiliesGroup] = {}
        for key, g in self._groups.items():
            total_ns = int(g.time_ns.sum())
            per_iter = key[1] != "unknown" and g.iterations > 0
            fams = {
                fam: FamilyRow(
                    int(g.count[i]),
                    int(g.time_ns[i]) / 1e9,
                    ratio(int(g.time_ns[i]), total_ns),
                    int(g.time_ns[i]) / 1e9 / g.iterations if per_iter else None,
                    int(g.count[i]) / g.iterations if per_iter else None,
                )
                for fam, i in _FAMILY_INDEX.items()
                if g.count[i]
            }
            top = sorted(g.names.items(), key=lambda kv: kv[1][2], reverse=True)[: self._top]
            kernels = tuple(
                KernelRow(name, fam, count, t / 1e9, ratio(t, total_ns), t / count / 1000 if count else None)
                for name, (fam, count, t) in top
            )
            out[key] = FamiliesGroup(g.iterations, total_ns / 1e9, fams, kernels, g.names_dropped)
        return FamiliesResult(out)


def create(s: FamiliesSettings, hints: AgentHints, max_models: int) -> FamiliesAnalyzer:
    """The analyzer for its settings and what the agent derives from its sources."""
    return FamiliesAnalyzer(max_models=max_models, max_names=s.max_names, top=s.top)
