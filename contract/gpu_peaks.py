"""Vendor-published peaks per GPU model, under rocprof-compute's ``roofline.csv`` names (docs/counters.md).

GB/s for ``HBMBw``, GFLOP/s (GOP/s for ``MFMAI8Ops``) for the rest, dense (without structured
sparsity). On NVIDIA the matrix columns are the tensor cores': ``MFMAF32Flops`` is TF32,
``MFMAF64Flops`` FP64 tensor. A figure the vendor publishes only with sparsity is left out rather
than halved; so is one it does not publish. Every figure's source is in docs/counters.md ("Peaks
per GPU model"). Measured peaks (a capture's ``roofline.csv``) are preferred where there are some.
"""

from __future__ import annotations

from typing import Final

_MI300X: Final = {
    "HBMBw": 5325.0,
    "FP64Flops": 81700.0,
    "MFMAF64Flops": 163400.0,
    "FP32Flops": 163400.0,
    "MFMAF32Flops": 163400.0,
    "MFMAF16Flops": 1307400.0,
    "MFMABF16Flops": 1307400.0,
    "MFMAI8Ops": 2614900.0,
}

PEAKS: Final[dict[str, dict[str, float]]] = {
    # AMD CDNA 1-4 white papers; ROCm's MI100 and MI300 microarchitecture pages
    "MI100": {
        "HBMBw": 1228.8,
        "FP64Flops": 11540.0,
        "FP32Flops": 23100.0,
        "MFMAF32Flops": 46100.0,
        "MFMAF16Flops": 184600.0,
        "MFMABF16Flops": 92300.0,
        "MFMAI8Ops": 184600.0,
    },
    "MI210": {
        "HBMBw": 1638.4,
        "FP64Flops": 22600.0,
        "MFMAF64Flops": 45300.0,
        "FP32Flops": 22600.0,
        "MFMAF32Flops": 45300.0,
        "MFMAF16Flops": 181000.0,
        "MFMABF16Flops": 181000.0,
        "MFMAI8Ops": 181000.0,
    },
    "MI250X": {
        "HBMBw": 3276.8,
        "FP64Flops": 47900.0,
        "MFMAF64Flops": 95700.0,
        "FP32Flops": 47900.0,
        "MFMAF32Flops": 95700.0,
        "MFMAF16Flops": 383000.0,
        "MFMABF16Flops": 383000.0,
        "MFMAI8Ops": 383000.0,
    },
    "MI300X": _MI300X,
    "MI325X": {**_MI300X, "HBMBw": 6000.0},  # MI300X's compute, HBM3E at 6 TB/s (CDNA 3 white paper)
    "MI355X": {
        "HBMBw": 8000.0,
        "FP64Flops": 78600.0,
        "MFMAF64Flops": 78600.0,
        "FP32Flops": 157300.0,
        "MFMAF32Flops": 157300.0,
        "MFMAF16Flops": 2500000.0,
        "MFMABF16Flops": 2500000.0,
        "MFMAI8Ops": 5000000.0,
    },
    # NVIDIA datasheets (A100 80GB, H100, H200, Blackwell) and the H100 architecture white paper V1.04
    "A100-SXM4-80GB": {
        "HBMBw": 2039.0,
        "FP64Flops": 9700.0,
        "MFMAF64Flops": 19500.0,
        "FP32Flops": 19500.0,
        "MFMAF32Flops": 156000.0,
        "MFMAF16Flops": 312000.0,
        "MFMABF16Flops": 312000.0,
        "MFMAI8Ops": 624000.0,
    },
    "H100-SXM5": {
        "HBMBw": 3352.0,
        "FP64Flops": 33500.0,
        "MFMAF64Flops": 66900.0,
        "FP32Flops": 66900.0,
        "MFMAF32Flops": 494700.0,
        "MFMAF16Flops": 989400.0,
        "MFMABF16Flops": 989400.0,
        "MFMAI8Ops": 1978900.0,
    },
    "H200-SXM": {  # tensor figures published with sparsity only: left out
        "HBMBw": 4800.0,
        "FP64Flops": 34000.0,
        "MFMAF64Flops": 67000.0,
        "FP32Flops": 67000.0,
    },
    "B200": {  # HGX B200; TF32/FP16/BF16 tensor published with sparsity only: left out
        "HBMBw": 7700.0,
        "FP64Flops": 37000.0,
        "MFMAF64Flops": 37000.0,
        "FP32Flops": 75000.0,
        "MFMAI8Ops": 4500000.0,
    },
}


def peaks_for(model: str) -> dict[str, float] | None:
    """The peaks of ``model`` (case and spacing ignored: ``mi300x``, ``H100 SXM5``), None for one not in the table."""
    return PEAKS.get(model.strip().upper().replace(" ", "-").replace("_", "-"))
