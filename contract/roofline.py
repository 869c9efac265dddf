"""Work per kernel from AMD hardware counters: FLOPs by kind, bytes at LDS, L1, L2 and HBM, arithmetic intensity.

The formulas are rocprof-compute's (``src/utils/roofline_calc.py``, ``calc_ai``, at commit 95b600ea;
docs/counters.md), per dispatch, then averaged over a kernel's calls:

- VALU FLOPs per precision p (F16, F32, F64): ``64 * (SQ_INSTS_VALU_ADD_p + SQ_INSTS_VALU_MUL_p + 2 *
  SQ_INSTS_VALU_FMA_p + SQ_INSTS_VALU_TRANS_p)`` (64 lanes per wavefront instruction, an FMA two);
- MFMA FLOPs per type t (F16, BF16, F32, F64; I8 as integer ops): ``512 * SQ_INSTS_VALU_MFMA_MOPS_t``;
- total FLOPs: the three VALU terms and the four MFMA floating-point terms;
- LDS bytes: ``(SQ_LDS_IDX_ACTIVE - SQ_LDS_BANK_CONFLICT) * 4 * lds_banks_per_cu``;
- L1 (vL1D) bytes: ``64 * TCP_TOTAL_CACHE_ACCESSES_sum``;
- L2 bytes: ``64 * (TCP_TCC_WRITE_REQ_sum + TCP_TCC_ATOMIC_WITH_RET_REQ_sum +
  TCP_TCC_ATOMIC_WITHOUT_RET_REQ_sum + TCP_TCC_READ_REQ_sum)``;
- HBM bytes on MI200: ``32 * TCC_EA_RDREQ_32B_sum + 64 * (TCC_EA_RDREQ_sum - TCC_EA_RDREQ_32B_sum) +
  64 * TCC_EA_WRREQ_64B_sum + 32 * (TCC_EA_WRREQ_sum - TCC_EA_WRREQ_64B_sum)``; on the others (MI300):
  ``128 * TCC_BUBBLE_sum + 32 * TCC_EA0_RDREQ_32B_sum + 64 * (TCC_EA0_RDREQ_sum - TCC_BUBBLE_sum -
  TCC_EA0_RDREQ_32B_sum) + 32 * (TCC_EA0_WRREQ_sum - TCC_EA0_WRREQ_64B_sum) + 64 * TCC_EA0_WRREQ_64B_sum``.

As in ``calc_ai``, a term whose counters a dispatch lacks adds nothing for that dispatch (the MFMA
terms one after the other, in the order above, until one is missing); arithmetic intensity at a
level is total FLOPs over that level's bytes (0 without bytes), and the achieved rate total FLOPs
over the mean duration.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from aaco.contract.counters import Dispatch

PRECISIONS: Final = ("F16", "F32", "F64")
MFMA: Final = ("F16", "BF16", "F32", "F64", "I8")
L2_REQUESTS: Final = (
    "TCP_TCC_WRITE_REQ_sum",
    "TCP_TCC_ATOMIC_WITH_RET_REQ_sum",
    "TCP_TCC_ATOMIC_WITHOUT_RET_REQ_sum",
    "TCP_TCC_READ_REQ_sum",
)


class _Missing(Exception):  # noqa: N818 - control flow: a counter the dispatch lacks, as calc_ai's KeyError
    pass


def _get(c: Mapping[str, float], name: str) -> float:
    try:
        return c[name]
    except KeyError:
        raise _Missing from None


def _valu(c: Mapping[str, float], p: str) -> float:
    return 64 * (
        _get(c, f"SQ_INSTS_VALU_ADD_{p}")
        + _get(c, f"SQ_INSTS_VALU_MUL_{p}")
        + 2 * _get(c, f"SQ_INSTS_VALU_FMA_{p}")
        + _get(c, f"SQ_INSTS_VALU_TRANS_{p}")
    )


def _hbm(c: Mapping[str, float], series: str) -> float:
    if series == "MI200":
        rd32, rd = _get(c, "TCC_EA_RDREQ_32B_sum"), _get(c, "TCC_EA_RDREQ_sum")
        wr64, wr = _get(c, "TCC_EA_WRREQ_64B_sum"), _get(c, "TCC_EA_WRREQ_sum")
        return rd32 * 32 + (rd - rd32) * 64 + wr64 * 64 + (wr - wr64) * 32
    bubble, rd32, rd = _get(c, "TCC_BUBBLE_sum"), _get(c, "TCC_EA0_RDREQ_32B_sum"), _get(c, "TCC_EA0_RDREQ_sum")
    wr64, wr = _get(c, "TCC_EA0_WRREQ_64B_sum"), _get(c, "TCC_EA0_WRREQ_sum")
    return bubble * 128 + rd32 * 32 + (rd - bubble - rd32) * 64 + (wr - wr64) * 32 + wr64 * 64


@dataclass
class KernelWork:
    """A kernel's work per call (FLOPs, bytes), its calls and its time (ns)."""

    kernel: str
    calls: int = 0
    total_flops: float = 0.0
    valu_flops: float = 0.0
    valu_flops_f16: float = 0.0
    valu_flops_f32: float = 0.0
    valu_flops_f64: float = 0.0
    mfma_flops_f16: float = 0.0
    mfma_flops_bf16: float = 0.0
    mfma_flops_f32: float = 0.0
    mfma_flops_f64: float = 0.0
    mfma_iops_i8: float = 0.0
    lds_bytes: float = 0.0
    l1_bytes: float = 0.0
    l2_bytes: float = 0.0
    hbm_bytes: float = 0.0
    total_duration_ns: float = 0.0

    @property
    def avg_duration_ns(self) -> float:
        """Mean duration of a call."""
        return self.total_duration_ns / self.calls if self.calls else 0.0

    def intensity(self, level: str) -> float:
        """FLOPs per byte at ``level`` (lds, l1, l2, hbm); 0 without bytes there."""
        moved = getattr(self, f"{level}_bytes")
        return self.total_flops / moved if moved else 0.0

    @property
    def flops_per_s(self) -> float:
        """Achieved FLOP/s (0 without a duration)."""
        avg = self.avg_duration_ns
        return self.total_flops / avg * 1e9 if avg else 0.0


def _add(w: KernelWork, c: Mapping[str, float], series: str, lds_banks_per_cu: float) -> None:
    """One dispatch's counters into its kernel's sums (each term all or nothing, as calc_ai)."""
    with contextlib.suppress(_Missing):
        valu = sum(_valu(c, p) for p in PRECISIONS)
        w.total_flops += valu + sum(_get(c, f"SQ_INSTS_VALU_MFMA_MOPS_{t}") * 512 for t in MFMA[:4])
    with contextlib.suppress(_Missing):
        w.valu_flops += sum(_valu(c, p) for p in PRECISIONS)
    for p in PRECISIONS:  # by precision too (not in calc_ai): which ceiling a kernel is placed under
        with contextlib.suppress(_Missing):
            setattr(w, f"valu_flops_{p.lower()}", getattr(w, f"valu_flops_{p.lower()}") + _valu(c, p))
    with contextlib.suppress(_Missing):  # one after the other until one is missing
        for t in MFMA:
            value = _get(c, f"SQ_INSTS_VALU_MFMA_MOPS_{t}") * 512
            name = "mfma_iops_i8" if t == "I8" else f"mfma_flops_{t.lower()}"
            setattr(w, name, getattr(w, name) + value)
    for attr, term in (
        ("lds_bytes", lambda: (_get(c, "SQ_LDS_IDX_ACTIVE") - _get(c, "SQ_LDS_BANK_CONFLICT")) * 4 * lds_banks_per_cu),
        ("l1_bytes", lambda: _get(c, "TCP_TOTAL_CACHE_ACCESSES_sum") * 64),
        ("l2_bytes", lambda: sum(_get(c, n) * 64 for n in L2_REQUESTS)),
        ("hbm_bytes", lambda: _hbm(c, series)),
    ):
        with contextlib.suppress(_Missing):
            setattr(w, attr, getattr(w, attr) + term())


def kernel_work(dispatches: Iterable[Dispatch], series: str, lds_banks_per_cu: float) -> list[KernelWork]:
    """Per kernel (by name), its work per call; ``series`` picks the HBM formula (``MI200``, else MI300's)."""
    sums: dict[str, KernelWork] = {}
    for d in dispatches:
        w = sums.setdefault(d.kernel, KernelWork(d.kernel))
        _add(w, d.counters, series, lds_banks_per_cu)
        w.total_duration_ns += d.end_ns - d.start_ns
        w.calls += 1
    return [_per_call(w) for w in sums.values()]


PER_CALL: Final = (
    "total_flops",
    "valu_flops",
    "valu_flops_f16",
    "valu_flops_f32",
    "valu_flops_f64",
    "mfma_flops_f16",
    "mfma_flops_bf16",
    "mfma_flops_f32",
    "mfma_flops_f64",
    "mfma_iops_i8",
    "lds_bytes",
    "l1_bytes",
    "l2_bytes",
    "hbm_bytes",
)


def _per_call(w: KernelWork) -> KernelWork:
    """Sums over a kernel's calls made per call."""
    for name in PER_CALL:
        setattr(w, name, getattr(w, name) / w.calls)
    return w


# A kernel's FLOP kind -> the ceiling it is placed under (rocprof-compute's roofline.csv names, GFLOP/s).
# VALU FP16 has no measured ceiling there: it is placed under FP32's (a packed FP16 peak is twice that).
CEILINGS: Final = {
    "valu_flops_f16": "FP32Flops",
    "valu_flops_f32": "FP32Flops",
    "valu_flops_f64": "FP64Flops",
    "mfma_flops_f16": "MFMAF16Flops",
    "mfma_flops_bf16": "MFMABF16Flops",
    "mfma_flops_f32": "MFMAF32Flops",
    "mfma_flops_f64": "MFMAF64Flops",
    "mfma_iops_i8": "MFMAI8Ops",
}


@dataclass(frozen=True)
class Placement:
    """Where a kernel sits under its roofline: which roof bounds it and how near it comes to that roof."""

    bound: str  # memory | compute
    ceiling: str  # the compute ceiling it is placed under (CEILINGS' values)
    roof_fraction: float  # achieved over the roof that bounds it (HBM bandwidth, or the compute ceiling)
    ridge_ai: float  # FLOP/byte where the HBM roof meets the compute ceiling


def place(w: KernelWork, peaks: Mapping[str, float]) -> Placement | None:
    """The kernel against ``peaks`` (GB/s and GFLOP/s by roofline.csv name: ``HBMBw``, ``FP32Flops`` ...).

    Its ceiling is that of its largest kind of work (FP32 for a kernel without FLOPs); it is
    memory-bound when its HBM arithmetic intensity is left of the ridge point, and its fraction is then
    its HBM bandwidth over the peak, else its FLOP/s over the ceiling. None without the HBM peak or
    that ceiling, without a duration, or without HBM bytes (a capture without HBM counters: MI100's).
    """
    kind = max(CEILINGS, key=lambda k: getattr(w, k))
    ceiling = CEILINGS[kind] if getattr(w, kind) > 0 else "FP32Flops"
    hbm, top = peaks.get("HBMBw"), peaks.get(ceiling)
    if not hbm or not top or not w.avg_duration_ns or not w.hbm_bytes:
        return None
    ridge = top / hbm  # GFLOP/s over GB/s: FLOP/byte
    if w.intensity("hbm") < ridge:
        return Placement("memory", ceiling, w.hbm_bytes / w.avg_duration_ns / hbm, ridge)  # bytes/ns is GB/s
    return Placement("compute", ceiling, w.flops_per_s / 1e9 / top, ridge)


# NVIDIA: the SASS instruction counters a CUPTI profiler range carries, and the operations each
# instruction does per thread (HTA's CUDA_SASS_INSTRUCTION_COUNTER_FLOPS: an FMA two, the others one).
SASS_FLOPS: Final = {
    f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum": 2 if "fma" in op else 1
    for op in ("ffma", "fmul", "fadd", "hfma", "hmul", "hadd", "dfma", "dmul", "dadd")
}


def sass_flops(counters: Mapping[str, float], prefix: str = "") -> float:
    """Floating-point operations from the SASS thread-instruction counters present (``prefix``: h, f or d only)."""
    return sum(
        counters.get(name, 0.0) * per
        for name, per in SASS_FLOPS.items()
        if name.removeprefix("smsp__sass_thread_inst_executed_op_").startswith(prefix)
    )


# Nsight Compute's memory-level byte counters (its roofline sections: DRAM, L2 and L1/TEX traffic)
NVIDIA_BYTES: Final = {
    "hbm_bytes": ("dram__bytes_read.sum", "dram__bytes_write.sum"),
    "l2_bytes": ("lts__t_bytes.sum",),
    "l1_bytes": ("l1tex__t_bytes.sum",),
}


def nvidia_kernel_work(dispatches: Iterable[Dispatch]) -> list[KernelWork]:
    """Per kernel, its work per call from NVIDIA's counters: SASS FLOPs by precision, bytes where counted."""
    sums: dict[str, KernelWork] = {}
    for d in dispatches:
        w = sums.setdefault(d.kernel, KernelWork(d.kernel))
        c = d.counters
        for prec, prefix in (("f16", "h"), ("f32", "f"), ("f64", "d")):
            setattr(w, f"valu_flops_{prec}", getattr(w, f"valu_flops_{prec}") + sass_flops(c, prefix))
        w.valu_flops += sass_flops(c)
        w.total_flops += sass_flops(c)
        for attr, names in NVIDIA_BYTES.items():
            if all(n in c for n in names):
                setattr(w, attr, getattr(w, attr) + sum(c[n] for n in names))
        w.total_duration_ns += d.end_ns - d.start_ns
        w.calls += 1
    return [_per_call(w) for w in sums.values()]


# GPU architecture -> rocprof-compute's gpu_series (its SUPPORTED_ARCHS), which picks the HBM formula
SERIES: Final = {"gfx908": "MI100", "gfx90a": "MI200", "gfx940": "MI300", "gfx941": "MI300", "gfx942": "MI300"}
LDS_BANKS_PER_CU: Final = 32  # every CDNA GPU's (rocprof-compute's sysinfo lds_banks_per_cu)


def work_for(arch: str, dispatches: Iterable[Dispatch]) -> list[KernelWork]:
    """NVIDIA's formulas for a compute capability (``sm_80``), else AMD's for the architecture's series."""
    if arch.startswith("sm_"):
        return nvidia_kernel_work(dispatches)
    return kernel_work(dispatches, SERIES.get(arch, "MI300"), LDS_BANKS_PER_CU)


# Every counter a formula above reads: what a streaming consumer needs to keep of a dispatch.
FORMULA_COUNTERS: Final = frozenset(
    {f"SQ_INSTS_VALU_{op}_{p}" for op in ("ADD", "MUL", "FMA", "TRANS") for p in PRECISIONS}
    | {f"SQ_INSTS_VALU_MFMA_MOPS_{t}" for t in MFMA}
    | {"SQ_LDS_IDX_ACTIVE", "SQ_LDS_BANK_CONFLICT", "TCP_TOTAL_CACHE_ACCESSES_sum", *L2_REQUESTS}
    | {f"TCC_EA_{k}_sum" for k in ("RDREQ_32B", "RDREQ", "WRREQ_64B", "WRREQ")}
    | {"TCC_BUBBLE_sum", *(f"TCC_EA0_{k}_sum" for k in ("RDREQ_32B", "RDREQ", "WRREQ_64B", "WRREQ"))}
    | set(SASS_FLOPS)
    | {n for names in NVIDIA_BYTES.values() for n in names}
)
