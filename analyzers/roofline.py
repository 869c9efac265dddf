"""Each kernel family's work and place under the roofline, live, from the ``counters`` rows (docs/counters.md).

The rows of every dispatch are folded (only the counters a formula reads, ``FORMULA_COUNTERS``),
the most recent ``max_dispatches`` dispatches kept; at each snapshot their work is computed per
node, model (the rows', "" when unknown), GPU architecture and kernel family
(``contract.kernels.family_of``: bounded labels) with the formulas of ``contract.roofline``, and
placed under the architecture's peaks where ``analyzers.roofline.peaks`` gives them
(rocprof-compute's ``roofline.csv`` names, or a GPU model of ``contract.gpu_peaks``). The bottleneck
class reads the placement of a model's families (docs/bottleneck_taxonomy.md).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveInt, field_validator

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.contract.config_base import StrictModel
from aaco.contract.counters import Dispatch
from aaco.contract.gpu_peaks import PEAKS, peaks_for
from aaco.contract.kernels import family_of
from aaco.contract.roofline import FORMULA_COUNTERS, KernelWork, Placement, place, work_for
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define

LABELS: Final = ("node", "model", "arch", "family")
INTENSITY = define(
    "aaco.kernel.family.arithmetic_intensity",
    "aaco_kernel_family_arithmetic_intensity",
    "gauge",
    "{flop}/By",
    "A kernel family's FLOPs per byte moved at a memory level (hbm, l2, l1), from hardware counters "
    "(rocprof-compute's formulas on AMD, SASS counters on NVIDIA; docs/counters.md), over its recent dispatches.",
    (*LABELS, "level"),
)
FLOPS = define(
    "aaco.kernel.family.flops",
    "aaco_kernel_family_flops_per_second",
    "gauge",
    "{flop}/s",
    "A kernel family's achieved FLOP/s: its FLOPs per call over its mean call, from hardware counters.",
    LABELS,
)
HBM_BANDWIDTH = define(
    "aaco.kernel.family.hbm.bandwidth",
    "aaco_kernel_family_hbm_bandwidth_bytes_per_second",
    "gauge",
    "By/s",
    "A kernel family's achieved HBM bandwidth: its HBM bytes per call over its mean call.",
    LABELS,
)
ROOF_FRACTION = define(
    "aaco.kernel.family.roof_fraction",
    "aaco_kernel_family_roof_fraction",
    "gauge",
    "1",
    "How near a kernel family comes to the roof that bounds it (bound: memory, the HBM bandwidth; compute, its "
    "FLOP ceiling), where analyzers.roofline.peaks gives the architecture's peaks.",
    (*LABELS, "bound"),
)


class RooflineSettings(StrictModel):
    """Each kernel family's arithmetic intensity, FLOP/s and place under the roofline, from hardware counters."""

    max_dispatches: PositiveInt = Field(4096, description="Recent dispatches kept per analysis (the oldest dropped).")
    peaks: dict[str, dict[str, float] | str] = Field(
        default_factory=dict,
        description="Per GPU architecture (gfx90a, gfx942, sm_90): a GPU model of the published table (MI300X, "
        "H100-SXM5 ...; docs/counters.md) or its peaks under rocprof-compute's roofline.csv names: HBMBw (GB/s), "
        "FP32Flops, FP64Flops, MFMAF16Flops, MFMABF16Flops, MFMAF32Flops, MFMAF64Flops, MFMAI8Ops (GFLOP/s).",
    )

    @field_validator("peaks")
    @classmethod
    def _models(cls, peaks: dict[str, dict[str, float] | str]) -> dict[str, dict[str, float] | str]:
        """A model name must be one of the table's."""
        for arch, given in peaks.items():
            if isinstance(given, str) and peaks_for(given) is None:
                raise ValueError(f"{arch}: no GPU model {given!r} in the peaks table (known: {', '.join(PEAKS)})")
        return peaks

    def peaks_of(self, arch: str) -> dict[str, float] | None:
        """The peaks an architecture's families are placed under (None: not placed)."""
        given = self.peaks.get(arch)
        return peaks_for(given) if isinstance(given, str) else given


@dataclass(frozen=True)
class RooflineResult:
    """Per (node, model, architecture, family): its work per call and, with peaks, its placement."""

    families: tuple[tuple[str, str, str, KernelWork, Placement | None], ...]  # (node, model, arch, work, placement)

    def model_families(self, model: str) -> dict[str, dict[str, Any]]:
        """Per family of ``model`` (over its nodes: the entry with the most calls), what a baseline keeps of it."""
        out: dict[str, dict[str, Any]] = {}
        for row in self.to_dict()["families"]:
            if row["model"] == model and row["calls"] > out.get(row["family"], {}).get("calls", 0):
                keep = ("calls", "ai_hbm", "ai_l2", "ai_l1", "gflops_per_s", "hbm_bytes_per_s", "bound")
                out[row["family"]] = {k: row[k] for k in keep}
        return out

    def placed_shares(self, node: str, model: str) -> tuple[float, float] | None:
        """Shares of a model's counted kernel time in families placed compute-bound and memory-bound (None: none)."""
        placed = [
            (w.total_duration_ns, where.bound)
            for n, m, _, w, where in self.families
            if (n, m) == (node, model) and where
        ]
        total = sum(t for t, _ in placed)
        if not placed or total <= 0:
            return None
        return (
            sum(t for t, b in placed if b == "compute") / total,
            sum(t for t, b in placed if b == "memory") / total,
        )

    def to_dict(self) -> dict[str, Any]:
        """``{"families": [...]}``: work, intensities, rates and placement of each."""
        return {
            "families": [
                {
                    "node": node,
                    "model": model,
                    "arch": arch,
                    "family": w.kernel,
                    "calls": w.calls,
                    "flops": w.total_flops,
                    "hbm_bytes": w.hbm_bytes,
                    "l2_bytes": w.l2_bytes,
                    "l1_bytes": w.l1_bytes,
                    "ai_hbm": w.intensity("hbm"),
                    "ai_l2": w.intensity("l2"),
                    "ai_l1": w.intensity("l1"),
                    "gflops_per_s": w.flops_per_s / 1e9,
                    "hbm_bytes_per_s": w.hbm_bytes / w.avg_duration_ns * 1e9 if w.avg_duration_ns else None,
                    "bound": where.bound if where else None,
                    "roof_fraction": where.roof_fraction if where else None,
                }
                for node, model, arch, w, where in self.families
            ]
        }

    def points(self) -> list[MetricPoint]:
        """The gauges of every family."""
        pb = PointBuilder()
        for node, model, arch, w, where in self.families:
            labels = {"node": node, "model": model, "arch": arch, "family": w.kernel}
            for level in ("hbm", "l2", "l1"):
                pb.add(INTENSITY, w.intensity(level), **labels, level=level)
            pb.add(FLOPS, w.flops_per_s, **labels)
            if w.avg_duration_ns:
                pb.add(HBM_BANDWIDTH, w.hbm_bytes / w.avg_duration_ns * 1e9, **labels)
            if where is not None:
                pb.add(ROOF_FRACTION, where.roof_fraction, **labels, bound=where.bound)
        return pb.points


class RooflineAnalyzer(Analyzer):
    """Folds counter rows into recent dispatches; places each kernel family at snapshot time."""

    name = "roofline"
    kinds = frozenset({"counters"})

    def __init__(self, settings: RooflineSettings | None = None) -> None:
        self.s = settings or RooflineSettings()
        self._dispatches: OrderedDict[tuple[Any, ...], tuple[str, str, str, Dispatch]] = OrderedDict()

    def update(self, item: EventBatch) -> None:
        """Keep the formulas' counters of each dispatch."""
        b = item.batch.filter(pc.is_in(item.batch.column("counter"), _formula_counters()))
        if b.num_rows == 0:
            return
        cols = {
            c: b.column(c).to_pylist()
            for c in (
                "node",
                "model",
                "arch",
                "pid",
                "device",
                "dispatch_id",
                "kernel",
                "start_ns",
                "end_ns",
                "counter",
                "value",
            )
        }
        for i, counter in enumerate(cols["counter"]):
            node, model, arch = cols["node"][i], cols["model"][i] or "", cols["arch"][i] or ""
            key = (node, model, arch, cols["pid"][i], cols["device"][i], cols["dispatch_id"][i])
            held = self._dispatches.get(key)
            if held is None:
                d = Dispatch(
                    cols["dispatch_id"][i], cols["kernel"][i], cols["device"][i], cols["start_ns"][i], cols["end_ns"][i]
                )
                held = self._dispatches[key] = (node, model, arch, d)
                while len(self._dispatches) > self.s.max_dispatches:
                    self._dispatches.popitem(last=False)
            held[3].counters[counter] = float(cols["value"][i])

    def snapshot(self) -> RooflineResult:
        """Each family's work over the dispatches held, placed where the architecture's peaks are known."""
        groups: dict[tuple[str, str, str], list[Dispatch]] = {}
        for node, model, arch, d in self._dispatches.values():
            family = replace(d, kernel=family_of(d.kernel), counters=dict(d.counters))
            groups.setdefault((node, model, arch), []).append(family)
        out = []
        for (node, model, arch), found in sorted(groups.items()):
            peaks = self.s.peaks_of(arch)
            for w in sorted(work_for(arch, found), key=lambda w: w.kernel):
                out.append((node, model, arch, w, place(w, peaks) if peaks else None))
        return RooflineResult(tuple(out))


@functools.cache
def _formula_counters() -> pa.Array:
    """Built on first use: pyarrow's conversion of a list at import time would import pandas."""
    return pa.array(sorted(FORMULA_COUNTERS), pa.string())


def create(s: RooflineSettings, hints: AgentHints, max_models: int) -> RooflineAnalyzer:
    """The analyzer for its settings."""
    return RooflineAnalyzer(s)
