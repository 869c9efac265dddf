"""A compute-bound GEMM placed under the roofline by hand: the real MI210 bf16 4096^3 GEMM of vibesys.

The capture (``tests/data/rocprofv3-pmc-mi210``) counts MFMA instructions (``SQ_INSTS_MFMA``), not
the MFMA operations rocprof-compute's formula reads, and no byte counter: aaco itself does not place
it. By hand, as TraceLens' performance models do, its work is read from the GEMM's shape: 2 * 4096^3
FLOPs; the capture confirms it (each MFMA instruction of ``v_mfma_f32_32x32x8bf16_1k``, the
MI32x32 instruction the Tensile kernel's name says, does 32 * 32 * 8 * 2 = 16,384 operations, and
8,388,608 instructions make exactly 2 * 4096^3). HBM moves at least A and B once and C once (bf16,
2 bytes each), the most favourable case for memory; even then the kernel lies far right of the MI210's
ridge point, so it is compute-bound whatever the caches do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from aaco.agent.sources.counters.rocprofv3 import read_counter_collection
from aaco.contract.counters import dispatches
from aaco.contract.gpu_peaks import peaks_for
from aaco.contract.roofline import KernelWork, place

CSV = Path(__file__).resolve().parents[1] / "data" / "rocprofv3-pmc-mi210" / "782163_counter_collection.csv"
N = 4096
GEMM_FLOPS = 2 * N**3
MIN_HBM_BYTES = 3 * N * N * 2  # A and B read, C written, bf16
OPS_PER_MFMA = 32 * 32 * 8 * 2  # v_mfma_f32_32x32x8bf16_1k, per wave


def gemm_dispatches():
    return [d for d in dispatches(read_counter_collection(CSV)) if d.kernel.startswith("Cijk_")]


def test_the_counters_confirm_the_work_the_shape_says():
    gemms = gemm_dispatches()
    assert len(gemms) == 2
    for d in gemms:
        assert d.counters["SQ_INSTS_MFMA"] * OPS_PER_MFMA == GEMM_FLOPS


def test_the_gemm_is_compute_bound_at_two_thirds_of_the_mi210_bf16_roof():
    gemms = gemm_dispatches()
    work = KernelWork(
        gemms[0].kernel,
        calls=len(gemms),
        total_flops=GEMM_FLOPS,
        mfma_flops_bf16=GEMM_FLOPS,
        hbm_bytes=MIN_HBM_BYTES,
        total_duration_ns=sum(d.end_ns - d.start_ns for d in gemms),
    )
    assert [d.end_ns - d.start_ns for d in gemms] == [1_161_123, 1_159_843]  # ns, from the capture
    peaks = peaks_for("MI210")
    placed = place(work, peaks)
    assert placed is not None
    # 137.4 GFLOP over at most 100.7 MB is at least 1,365 FLOP/byte; the ridge 181 TFLOP/s / 1,638.4 GB/s = 110.5
    assert work.intensity("hbm") == pytest.approx(1365.33, abs=0.01)
    assert placed.ridge_ai == pytest.approx(110.47, abs=0.01)
    assert placed.bound == "compute" and placed.ceiling == "MFMABF16Flops"
    # 137.4 GFLOP in a mean 1,160,483 ns: 118.4 TFLOP/s, 65.4 % of the 181 TFLOP/s dense bf16 peak
    assert placed.roof_fraction == pytest.approx(118.43e12 / 181e12, rel=1e-3)
