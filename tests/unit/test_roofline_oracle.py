"""Work per kernel from counters against rocprof-compute's own ``calc_ai``, run from its source as an oracle.

The oracle is ``src/utils/roofline_calc.py`` of ROCm/rocprofiler-compute at commit 95b600ea, carried
byte for byte in tests/data/rocprof-compute (MIT, provenance in its README); it runs on the real
vcopy workloads of the same commit, read with pandas as rocprof-compute reads them. Its per-kernel
``AI_Data`` records are taken as it builds them.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from aaco.agent.sources.counters.rocprof_compute import read_pmc_perf, read_sysinfo
from aaco.contract.roofline import kernel_work
from tests.conftest import skip_or_fail

DATA = Path(__file__).resolve().parents[1] / "data" / "rocprof-compute"
# the workload's folder -> rocprof-compute's gpu_series for it (soc_base: SUPPORTED_ARCHS by gpu_arch)
SERIES = {"MI100": "MI100", "MI200": "MI200", "MI300X_A1": "MI300"}
FIELDS = {  # calc_ai's AI_Data field -> KernelWork's
    "numCalls": "calls",
    "total_flops": "total_flops",
    "valu_flops": "valu_flops",
    "mfma_flops_f16": "mfma_flops_f16",
    "mfma_flops_bf16": "mfma_flops_bf16",
    "mfma_flops_f32": "mfma_flops_f32",
    "mfma_flops_f64": "mfma_flops_f64",
    "mfma_iops_i8": "mfma_iops_i8",
    "lds_data": "lds_bytes",
    "L1cache_data": "l1_bytes",
    "L2cache_data": "l2_bytes",
    "hbm_data": "hbm_bytes",
    "totalDuration": "total_duration_ns",
    "avgDuration": "avg_duration_ns",
}


def oracle() -> types.ModuleType:
    """rocprof-compute's roofline_calc, its one import of rocprof-compute itself (a debug print) stubbed."""
    utils = types.ModuleType("utils")
    utils.utils = types.ModuleType("utils.utils")  # type: ignore[attr-defined]
    utils.utils.console_debug = lambda *a, **k: None  # type: ignore[attr-defined]
    saved = {k: sys.modules.get(k) for k in ("utils", "utils.utils")}
    sys.modules.update({"utils": utils, "utils.utils": utils.utils})  # type: ignore[attr-defined]
    try:
        spec = importlib.util.spec_from_file_location("rocprof_compute_roofline_calc", DATA / "roofline_calc.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    return mod


@pytest.mark.parametrize("arch", sorted(SERIES))
def test_work_per_kernel_equals_calc_ai(arch: str):
    try:
        import pandas as pd
    except ImportError:
        skip_or_fail("pandas (the dev extra) runs rocprof-compute's calc_ai as the oracle")
    calc = oracle()
    recorded: list[Any] = []

    class Recording(calc.AI_Data):  # type: ignore[name-defined, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            recorded.append(self)

    calc.AI_Data = Recording
    folder = DATA / "vcopy" / arch
    info = read_sysinfo(folder / "sysinfo.csv")
    banks = float(info["lds_banks_per_cu"])
    mspec = types.SimpleNamespace(gpu_series=SERIES[arch], lds_banks_per_cu=banks)
    points = calc.calc_ai(mspec, "kernels", {"pmc_perf": pd.read_csv(folder / "pmc_perf.csv")})
    problems: list[str] = []
    ours = {w.kernel: w for w in kernel_work(read_pmc_perf(folder / "pmc_perf.csv", problems), SERIES[arch], banks)}
    assert problems == []
    assert sorted(ours) == sorted(r.KernelName for r in recorded) == sorted(points["kernelNames"])
    for r in recorded:
        w = ours[r.KernelName]
        for theirs, mine in FIELDS.items():
            assert getattr(w, mine) == pytest.approx(float(getattr(r, theirs)), rel=1e-9, abs=0), (arch, theirs)
    for i, name in enumerate(points["kernelNames"]):
        for level in ("l1", "l2", "hbm"):
            assert ours[name].intensity(level) == pytest.approx(points[f"ai_{level}"][0][i], rel=1e-9, abs=0)
        expected = points["ai_l1"][1][i]  # FLOPs per ns of a mean call
        assert ours[name].flops_per_s / 1e9 == pytest.approx(expected, rel=1e-9, abs=0)


def test_the_copy_kernel_moves_bytes_and_does_no_floating_point_work():
    """vcopy on MI200 read by hand: a copy kernel, memory-bound, arithmetic intensity 0 at every level."""
    (w,) = kernel_work(read_pmc_perf(DATA / "vcopy" / "MI200" / "pmc_perf.csv"), "MI200", 32)
    assert w.calls == 3 and w.total_flops == 0.0
    copied = 2 * 1048576 * 8  # 1,048,576 doubles read and as many written per call (vcopy -n 1048576)
    assert w.l2_bytes == copied  # every byte through L2 once
    assert 0.8 * copied < w.hbm_bytes <= copied  # nearly all of it from and to HBM (some reads hit in L2)
    assert w.intensity("hbm") == w.intensity("l2") == w.intensity("l1") == 0.0
