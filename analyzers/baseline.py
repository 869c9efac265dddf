"""A performance baseline of a lake: per model, latency samples, kernel counts, time per kernel family.

``model_profile`` reduces one model's iterations and kernels (as the lake holds them) to what a
later session is compared against (``verdict.compare``):

- ``latency_s``: iteration latencies in time order, all of them up to ``MAX_SAMPLES``, else that
  many evenly spaced over the run (the test statistics need samples, not quantiles);
- ``kernels_per_iteration`` (kind ``kernel``), ``events_per_iteration`` by kind, the mean kernel
  duration and the share of microkernels (shorter than 10 us, the launch analyzer's threshold);
- ``family_time_per_iteration_s``: summed durations per kernel family (``kernels.families``) over
  iterations, and ``family_kernels_per_iteration``;
- ``busy_per_iteration_s``: the union of the model's GPU intervals within each iteration (overlap
  across streams counted once), and ``host_gap_per_iteration_s`` = mean latency - busy: the part of
  an iteration the device did nothing for it (host work, launches, synchronisation);
- ``cpu_overhead_ratio``: time inside launch calls (where the trace has them) over iteration time.

Only kernels correlated to an iteration of the model count. Pure: tables in, dicts out.
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.analyzers.stats import evenly_spaced, percentiles
from aaco.contract.kernels import FAMILIES, families

FORMAT: Final = "aaco-baseline/1"
MAX_SAMPLES: Final = 10_000
MICROKERNEL_NS: Final = 10_000


def union_per_group(codes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
    """Total busy time (ns) of intervals, their union taken within each group (``codes``), vectorised.

    Each group's times are made relative to its first start and shifted by the group's index times
    the longest group extent, so one running maximum over the sorted intervals never carries one
    group's frontier into the next.
    """
    if codes.size == 0:
        return 0
    n_groups = int(codes.max()) + 1
    first = np.full(n_groups, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, codes, starts)
    rel_s = starts - first[codes]
    rel_e = np.maximum(ends - first[codes], rel_s)
    extent = int(rel_e.max()) + 1
    order = np.lexsort((rel_s, codes))
    s = rel_s[order] + codes[order] * extent
    e = rel_e[order] + codes[order] * extent
    running = np.maximum.accumulate(e)
    before = np.empty_like(running)
    before[0] = s[0]
    before[1:] = running[:-1]
    return int(np.clip(e - np.maximum(s, before), 0, None).sum())


def model_profile(iterations: pa.Table, kernels: pa.Table, model: str) -> dict[str, Any]:
    """The baseline figures of ``model`` (see module doc); ``iterations`` and ``kernels`` as in the lake."""
    it = iterations.filter(pc.equal(pc.fill_null(iterations["model"], "unknown"), model)).sort_by("start_ns")
    n = it.num_rows
    lat = (it["end_ns"].to_numpy() - it["start_ns"].to_numpy()) / 1e9
    prof: dict[str, Any] = {
        "iterations": n,
        "nodes": sorted(set(it["node"].to_pylist())),
        "latency_s": evenly_spaced(lat, MAX_SAMPLES).tolist(),
        "latency": _latency_summary(lat),
    }
    traces = pc.unique(it["trace_id"].drop_null())
    mine = pc.equal(pc.fill_null(kernels["model"], "unknown"), model)
    k = kernels.filter(pc.and_(mine, pc.is_in(kernels["trace_id"], traces)))  # null trace ids drop out
    dur = np.maximum(k["end_ns"].to_numpy() - k["start_ns"].to_numpy(), 0)
    kind = pc.fill_null(k["kind"], "kernel").to_numpy(zero_copy_only=False)
    is_kernel = kind == "kernel"
    fams = families(k["name"], k["kind"]) if k.num_rows else np.array([], dtype=object)
    per = max(n, 1)
    prof["kernels_per_iteration"] = int(is_kernel.sum()) / per
    prof["events_per_iteration"] = {str(v): int((kind == v).sum()) / per for v in np.unique(kind)}
    prof["avg_kernel_duration_us"] = float(dur[is_kernel].mean() / 1e3) if is_kernel.any() else None
    prof["microkernel_pct"] = float((dur[is_kernel] < MICROKERNEL_NS).mean()) if is_kernel.any() else None
    prof["gpu_time_per_iteration_s"] = float(dur.sum()) / 1e9 / per
    prof["family_time_per_iteration_s"] = {
        f: float(dur[fams == f].sum()) / 1e9 / per for f in FAMILIES if (fams == f).any()
    }
    prof["family_kernels_per_iteration"] = {f: int((fams == f).sum()) / per for f in FAMILIES if (fams == f).any()}
    codes = pc.dictionary_encode(k["trace_id"]).combine_chunks().indices.to_numpy().astype(np.int64)
    busy = union_per_group(codes, k["start_ns"].to_numpy(), k["end_ns"].to_numpy()) / 1e9 / per
    prof["busy_per_iteration_s"] = busy
    mean = float(lat.mean()) if n else None
    prof["host_gap_per_iteration_s"] = max(0.0, mean - busy) if mean is not None else None
    has_launch = pc.and_(pc.is_valid(k["launch_start_ns"]), pc.is_valid(k["launch_end_ns"])).to_numpy(
        zero_copy_only=False
    )
    if has_launch.any() and lat.sum() > 0:
        calls = k["launch_end_ns"].to_numpy(zero_copy_only=False)[has_launch].astype(np.int64)
        calls = calls - k["launch_start_ns"].to_numpy(zero_copy_only=False)[has_launch].astype(np.int64)
        prof["cpu_overhead_ratio"] = min(1.0, float(np.maximum(calls, 0).sum()) / 1e9 / float(lat.sum()))
    else:
        prof["cpu_overhead_ratio"] = None
    return prof


def models_of(iterations: pa.Table) -> list[str]:
    """The models that have iterations (the only ones with latency to compare)."""
    return sorted({m or "unknown" for m in iterations["model"].to_pylist()})


def _latency_summary(lat: np.ndarray) -> dict[str, float | None]:
    p50, p95, p99 = percentiles(lat, (50, 95, 99))
    return {"p50_s": p50, "p95_s": p95, "p99_s": p99, "mean_s": float(lat.mean()) if lat.size else None}
