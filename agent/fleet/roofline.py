"""``aaco roofline``: per kernel, its work from the lake's hardware counters and where it sits under its roofline.

The ``counters`` rows of every node are folded into dispatches (node, process, device, dispatch)
and each kernel's work is computed per GPU architecture: rocprof-compute's formulas on AMD
(``contract.roofline``; the HBM counters differ: MI200's ``TCC_EA_*``, MI300's ``TCC_EA0_*``), the
SASS instruction and Nsight Compute byte counters on NVIDIA (``sm_80``). With peaks
(rocprof-compute's measured ``roofline.csv``), each kernel is placed: memory- or compute-bound and
its fraction of that roof (docs/counters.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from aaco.contract.counters import Dispatch
from aaco.contract.roofline import KernelWork, place, work_for


def roofline(con: duckdb.DuckDBPyConnection, peaks: Mapping[str, float] | None = None) -> dict[str, Any]:
    """``{"kernels": [...]}``, the kernels by total time, each with its work, intensities, rate and placement."""
    rows = con.execute(
        "SELECT node, pid, device, dispatch_id, kernel, coalesce(arch, ''), start_ns, end_ns, counter, value "
        "FROM counters ORDER BY node, pid, device, dispatch_id"
    ).fetchall()
    by_arch: dict[str, dict[tuple[Any, ...], Dispatch]] = {}
    for node, pid, device, dispatch, kernel, arch, start, end, counter, value in rows:
        found = by_arch.setdefault(arch, {})
        d = found.get((node, pid, device, dispatch))
        if d is None:
            d = found[(node, pid, device, dispatch)] = Dispatch(dispatch, kernel, device, start, end, None, pid)
        d.counters[counter] = value
    work = [w for arch, found in sorted(by_arch.items()) for w in work_for(arch, found.values())]
    work.sort(key=lambda w: w.total_duration_ns, reverse=True)
    return {"kernels": [_entry(w, peaks) for w in work]}


def _entry(w: KernelWork, peaks: Mapping[str, float] | None) -> dict[str, Any]:
    where = place(w, peaks) if peaks else None
    return {
        "kernel": w.kernel,
        "calls": w.calls,
        "flops": w.total_flops,
        "hbm_bytes": w.hbm_bytes,
        "l2_bytes": w.l2_bytes,
        "l1_bytes": w.l1_bytes,
        "lds_bytes": w.lds_bytes,
        "ai_hbm": w.intensity("hbm"),
        "ai_l2": w.intensity("l2"),
        "ai_l1": w.intensity("l1"),
        "gflops_per_s": w.flops_per_s / 1e9,
        "mean_ns": w.avg_duration_ns,
        "bound": where.bound if where else None,
        "roof_fraction": where.roof_fraction if where else None,
        "ceiling": where.ceiling if where else None,
    }
