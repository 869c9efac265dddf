"""What a Kineto trace's keys outside its events say: how its clock maps to epoch ns, which GPUs it ran on.

The rules are ``kineto``'s (its module doc); they read the document's keys (``baseTimeNanoseconds``,
``deviceProperties``), which the streaming reader has only once the file ends.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from aaco.agent.sources.traces.json_values import INT_OUT_OF_RANGE, TIME_OUT_OF_RANGE, IntOutOfRangeError, need_int
from aaco.contract.clock import EPOCH_CEIL_NS, EPOCH_FLOOR_NS, ClockOffset

EPOCH_US_FLOOR = 1e15  # 2001-09-09 in microseconds: a ts above it is epoch-based


def _in_epoch(ns: int) -> bool:
    return EPOCH_FLOOR_NS <= ns < EPOCH_CEIL_NS


def kineto_clock(
    doc: dict[str, Any], ends_us: np.ndarray, file_mtime_ns: int, skipped: Counter[str] | None = None
) -> ClockOffset:
    """How this trace's microseconds map to epoch ns, from its events' ends (see the module doc)."""
    skipped = skipped if skipped is not None else Counter()
    ends = np.asarray(ends_us, dtype=np.float64)
    typical = float(np.median(ends)) if ends.size else 0.0
    try:
        base = need_int(doc.get("baseTimeNanoseconds"))
    except IntOutOfRangeError:
        skipped[INT_OUT_OF_RANGE] += 1
        base = None
    if base:
        if _in_epoch(base + round(typical * 1000)):
            return ClockOffset(base, 500, "kineto-baseTimeNanoseconds")
        skipped[TIME_OUT_OF_RANGE] += 1
    if typical > EPOCH_US_FLOOR:
        return ClockOffset(0, 500, "kineto-epoch-us")
    relative = ends[ends <= EPOCH_US_FLOOR]  # a stray epoch-sized end must not move the anchor
    last = float(relative.max()) if relative.size else 0.0
    return ClockOffset(file_mtime_ns - round(last * 1000), 10**9, "file-mtime")


def kineto_devices(doc: dict[str, Any], used: set[str]) -> dict[str, dict[str, Any]]:
    """What ``deviceProperties`` says about the devices in ``used`` (``ParsedTrace.devices``).

    ``{"0": {"type": "GPU", "name": ..., "product_name": ..., "compute_capability": "8.0",
    "total_memory_bytes": ...}}``: the product name as the runtime reported it (``NVIDIA A100-SXM4-80GB``;
    ROCm builds of Kineto often write ``AMD Radeon Graphics``), so a baseline knows which GPU it ran on.
    Kineto of May 2021 wrote the same list as ``computeProperties``, with ``major`` / ``minor``.
    """
    props = doc.get("deviceProperties", doc.get("computeProperties"))
    out: dict[str, dict[str, Any]] = {}
    if not isinstance(props, list):
        return out
    for p in props[:4096]:
        if not isinstance(p, dict) or not isinstance(p.get("name"), str) or len(p["name"]) > 256:
            continue
        try:
            dev = need_int(p.get("id"))
            major = need_int(p.get("computeMajor", p.get("major")))
            minor = need_int(p.get("computeMinor", p.get("minor")))
            memory = need_int(p.get("totalGlobalMem"))
        except IntOutOfRangeError:
            continue
        if dev is None or str(dev) not in used or str(dev) in out:
            continue
        entry: dict[str, Any] = {"type": "GPU", "name": p["name"], "product_name": p["name"]}
        if major is not None and minor is not None:
            entry["compute_capability"] = f"{major}.{minor}"
        if memory is not None:
            entry["total_memory_bytes"] = memory
        out[str(dev)] = entry
    return out
