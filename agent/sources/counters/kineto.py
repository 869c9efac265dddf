"""Kineto traces taken in CUPTI profiler mode: ``cuda_profiler_range`` events carry each kernel's counters.

PyTorch's profiler with ``experimental_config=_ExperimentalConfig(profiler_metrics=[...])`` writes, in
place of ``kernel`` events, one ``cuda_profiler_range`` event per kernel whose ``args`` are the
counters collected for it (``smsp__sass_thread_inst_executed_op_ffma_pred_on.sum`` ...). The
launches are not linked to them by correlation id; as HTA's ``CuptiCounterAnalysis`` does, the
i-th range in time is the i-th ``cudaLaunchKernel``, and the operators around that launch on its
thread (``cpu_op`` events containing it, outermost first) name the kernel's top-level and innermost
operators. Times: ``baseTimeNanoseconds`` + ``ts`` µs, or ``ts`` as epoch µs; 0 (the file's time)
otherwise.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from aaco.agent.sources.counters.files import WorkloadError, load_json
from aaco.contract.counters import CounterRow

CATEGORY: Final = "cuda_profiler_range"
EPOCH_US_FLOOR: Final = 1e15  # 2001-09-09 in microseconds: a ts above it is epoch-based


def read_kineto_counters(
    path: Path, problems: list[str] | None = None, meta: dict[str, str] | None = None
) -> Iterator[CounterRow]:
    """Every counter of every ``cuda_profiler_range`` event, with the operators that launched its kernel.

    ``meta`` receives ``arch``, the GPU's compute capability as ``sm_<major><minor>``, where the
    trace's ``deviceProperties`` give it (before the first row is yielded).
    """
    said = problems if problems is not None else []
    root = load_json(path, said)
    if root is None:
        return
    events = root.get("traceEvents") if isinstance(root, dict) else None
    if not isinstance(events, list):
        raise WorkloadError("not a Kineto trace: no traceEvents list", subject=path)
    if meta is not None and (arch := _arch(root)):
        meta["arch"] = arch
    ranges = sorted((e for e in events if isinstance(e, dict) and e.get("cat") == CATEGORY), key=_ts)
    if not ranges:
        return
    launches = sorted(
        (
            e
            for e in events
            if isinstance(e, dict) and e.get("cat") == "cuda_runtime" and e.get("name") == "cudaLaunchKernel"
        ),
        key=_ts,
    )
    if len(launches) != len(ranges):
        said.append(
            f"{path}: {len(ranges)} profiler ranges and {len(launches)} kernel launches: kernels not tied to operators"
        )
        launches = []
    ops = _ops_by_thread(events)
    base = root.get("baseTimeNanoseconds")
    for i, r in enumerate(ranges):
        bottom = top = ""
        if launches:
            stack = _stack(ops, launches[i])
            if stack:
                top, bottom = stack[0], stack[-1]
        start = _ns(r.get("ts"), base)
        end = start + int(float(r.get("dur") or 0) * 1000) if start else 0
        pid = launches[i].get("pid") if launches else None
        for name, value in (r.get("args") or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                yield CounterRow(
                    start,
                    end,
                    pid if isinstance(pid, int) else None,
                    str(r.get("pid", "")),
                    i,
                    None,
                    str(r.get("name", "")),
                    name,
                    float(value),
                    bottom,
                    top,
                )


def _arch(root: dict[str, Any]) -> str:
    """``sm_80`` from the first device's ``computeMajor``/``computeMinor`` ("" when absent)."""
    devices = root.get("deviceProperties")
    first = devices[0] if isinstance(devices, list) and devices and isinstance(devices[0], dict) else {}
    major, minor = first.get("computeMajor"), first.get("computeMinor")
    return f"sm_{major}{minor}" if isinstance(major, int) and isinstance(minor, int) else ""


def _ts(e: dict[str, Any]) -> float:
    ts = e.get("ts")
    return float(ts) if isinstance(ts, (int, float)) else 0.0


def _ns(ts: Any, base: Any) -> int:
    if not isinstance(ts, (int, float)):
        return 0
    if isinstance(base, int) and base > 0:
        return base + int(ts * 1000)
    return int(ts * 1000) if ts >= EPOCH_US_FLOOR else 0


_Ops = dict[tuple[Any, Any], tuple[list[float], list[dict[str, Any]]]]


def _ops_by_thread(events: list[Any]) -> _Ops:
    """The ``cpu_op`` events of each (pid, tid), by start."""
    found: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if isinstance(e, dict) and e.get("cat") == "cpu_op" and isinstance(e.get("ts"), (int, float)):
            found[(e.get("pid"), e.get("tid"))].append(e)
    out: _Ops = {}
    for key, ops in found.items():
        ops.sort(key=lambda o: (_ts(o), -float(o.get("dur") or 0)))
        out[key] = ([_ts(o) for o in ops], ops)
    return out


def _stack(ops: _Ops, launch: dict[str, Any]) -> list[str]:
    """The operators containing ``launch`` on its thread, outermost first."""
    starts, found = ops.get((launch.get("pid"), launch.get("tid")), ([], []))
    at = _ts(launch)
    return [
        str(o.get("name", ""))
        for o in found[: bisect.bisect_right(starts, at)]
        if _ts(o) + float(o.get("dur") or 0) >= at
    ]
