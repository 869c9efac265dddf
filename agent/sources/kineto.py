"""Kineto (PyTorch profiler) Chrome-trace JSON, from CUDA (CUPTI) and ROCm (roctracer) builds alike.

- GPU work: ``cat`` ``kernel``, ``gpu_memcpy``, ``gpu_memset`` (complete events, ``ph: X``). Their
  ``pid`` is the device and ``tid`` the stream; ``args.device`` / ``args.stream`` say it outright
  when present.
- Launches: ``cuda_runtime`` / ``cuda_driver`` events (HIP calls on ROCm builds) with the same
  ``args.correlation``: they give the kernel its host pid and tid and its launch interval.
- Operators: ``cpu_op`` events share ``args["External id"]`` with the launches; the op's name
  becomes the kernel's ``op_name``.
- Iterations: ``user_annotation`` events named ``ProfilerStep#N``.
- Time: ``ts``/``dur`` are microseconds (floats on ROCm builds). With ``baseTimeNanoseconds``,
  ``ts`` counts from it (Kineto writes ``(t - baseTime) / 1000``) and epoch ns = base + ts * 1000.
  Without it, older Kineto wrote epoch microseconds, recognised by magnitude (after 2001); anything
  smaller is anchored so the trace ends at the file's modification time. The method used is
  recorded with the events.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.agent.pipeline.clock import ClockOffset, us_to_ns
from aaco.agent.pipeline.ids import span_id, trace_id

from .parsed import ParsedTrace

GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")
EPOCH_US_FLOOR = 1e15  # 2001-09-09 in microseconds: a ts above it is epoch-based
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _num(v: Any) -> float | int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        try:
            return float(v) if any(c in v for c in ".eE") else int(v)
        except ValueError:
            return None
    return None


def _int(v: Any) -> int | None:
    n = _num(v)
    return int(n) if n is not None else None


def _dims(v: Any) -> tuple[int | None, int | None, int | None]:
    if isinstance(v, list) and len(v) == 3:
        return (_int(v[0]), _int(v[1]), _int(v[2]))
    return (None, None, None)


def kineto_clock(doc: dict[str, Any], max_end_us: float, file_mtime_ns: int) -> ClockOffset:
    """How this trace's microseconds map to epoch ns."""
    base = _int(doc.get("baseTimeNanoseconds"))
    if base is not None and base > 0:
        return ClockOffset(base, 500, "kineto-baseTimeNanoseconds")
    if max_end_us > EPOCH_US_FLOOR:
        return ClockOffset(0, 500, "kineto-epoch-us")
    return ClockOffset(file_mtime_ns - round(max_end_us * 1000), 10**9, "file-mtime")


def parse_kineto(
    doc: Any,
    *,
    node: str,
    identity: str,
    run_id: str,
    model: str,
    file_mtime_ns: int,
    source: str = "kineto",
) -> ParsedTrace:
    """Turn a loaded Kineto trace into kernels (with launches) and ProfilerStep iterations."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError("a Kineto trace is a JSON object with a traceEvents list")
    skipped: Counter[str] = Counter()
    launches: dict[int, tuple[int | None, int | None, float, float, str]] = {}
    ops: dict[int, str] = {}
    gpu: list[tuple[dict[str, Any], float, float]] = []
    steps: list[tuple[int, float, float, int | None, int | None]] = []
    cpu_pids: set[int] = set()
    max_end = 0.0
    for ev in doc["traceEvents"]:
        if not isinstance(ev, dict):
            skipped["not_an_event"] += 1
            continue
        cat = ev.get("cat")
        if ev.get("ph") != "X" or not isinstance(cat, str):
            continue
        if cat not in GPU_KINDS and cat not in LAUNCH_CATS and cat not in ("cpu_op", "user_annotation"):
            continue
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
        if ts is None or dur is None or dur < 0:
            skipped["bad_time"] += 1
            continue
        max_end = max(max_end, ts + dur)
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        name = ev.get("name")
        if cat in GPU_KINDS:
            if not isinstance(name, str):
                skipped["bad_name"] += 1
                continue
            gpu.append((ev, ts, dur))
        elif cat in LAUNCH_CATS:
            corr = _int(args.get("correlation"))
            if corr is not None:
                launches[corr] = (_int(ev.get("pid")), _int(ev.get("tid")), ts, dur, str(name))
                if (pid := _int(ev.get("pid"))) is not None:
                    cpu_pids.add(pid)
        elif cat == "cpu_op":
            ext = _int(args.get("External id"))
            if ext is not None and isinstance(name, str):
                ops.setdefault(ext, name)
        elif isinstance(name, str) and (m := _STEP.match(name)):
            steps.append((int(m.group(1)), ts, dur, _int(ev.get("pid")), _int(ev.get("tid"))))

    clock = kineto_clock(doc, max_end, file_mtime_ns)
    default_pid = next(iter(cpu_pids)) if len(cpu_pids) == 1 else None

    n = len(gpu)
    ts_arr = np.array([g[1] for g in gpu]) if n else np.zeros(0, dtype=np.int64)
    dur_arr = np.array([g[2] for g in gpu]) if n else np.zeros(0, dtype=np.int64)
    start_ns = clock.offset_ns + us_to_ns(ts_arr)
    end_ns = start_ns + us_to_ns(dur_arr) if n else start_ns  # the duration exactly as the trace states it
    cols: dict[str, list[Any]] = {
        k: []
        for k in (
            "pid",
            "tid",
            "device",
            "stream",
            "name",
            "kind",
            "correlation_id",
            "launch_start_ns",
            "launch_end_ns",
            "launch_name",
            "op_name",
            "bytes",
            "grid_x",
            "grid_y",
            "grid_z",
            "workgroup_x",
            "workgroup_y",
            "workgroup_z",
        )
    }
    for ev, _, _ in gpu:
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        corr = _int(args.get("correlation"))
        launch = launches.get(corr) if corr is not None else None
        device = _int(args.get("device"))
        stream = _int(args.get("stream"))
        cols["pid"].append(launch[0] if launch else default_pid)
        cols["tid"].append(launch[1] if launch else None)
        cols["device"].append(str(device if device is not None else _int(ev.get("pid"))))
        cols["stream"].append(stream if stream is not None else _int(ev.get("tid")))
        cols["name"].append(ev["name"])
        cols["kind"].append(GPU_KINDS[ev["cat"]])
        cols["correlation_id"].append(corr)
        cols["launch_start_ns"].append(clock.offset_ns + round(launch[2] * 1000) if launch else None)
        cols["launch_end_ns"].append(clock.offset_ns + round((launch[2] + launch[3]) * 1000) if launch else None)
        cols["launch_name"].append(launch[4] if launch else None)
        cols["op_name"].append(ops.get(_int(args.get("External id")) or -1))
        cols["bytes"].append(_int(args.get("bytes")))
        grid, block = _dims(args.get("grid")), _dims(args.get("block"))
        for axis, g, b in zip("xyz", grid, block, strict=True):
            cols[f"grid_{axis}"].append(g)
            cols[f"workgroup_{axis}"].append(b)
    strings = ("device", "name", "kind", "launch_name", "op_name")
    kernels = pa.table(
        {
            "start_ns": pa.array(start_ns, type=pa.int64()),
            "end_ns": pa.array(end_ns, type=pa.int64()),
            **{k: pa.array(v, type=pa.string() if k in strings else pa.int64()) for k, v in cols.items()},
            "node": pa.array([node] * n, type=pa.string()),
            "source": pa.array([source] * n, type=pa.string()),
            "run_id": pa.array([run_id] * n, type=pa.string()),
        }
    )
    if n:
        kernels = kernels.take(pa.array(np.argsort(start_ns, kind="stable")))

    steps.sort()
    m = len(steps)
    st = np.array([s[1] for s in steps]) if m else np.zeros(0)
    sd = np.array([s[2] for s in steps]) if m else np.zeros(0)
    iterations = pa.table(
        {
            "start_ns": pa.array(clock.offset_ns + us_to_ns(st), type=pa.int64()),
            "end_ns": pa.array(clock.offset_ns + us_to_ns(st) + us_to_ns(sd), type=pa.int64()),
            "pid": pa.array([s[3] if s[3] is not None else default_pid for s in steps], type=pa.int64()),
            "tid": pa.array([s[4] for s in steps], type=pa.int64()),
            "iteration": pa.array([s[0] for s in steps], type=pa.int64()),
            "name": pa.array([f"ProfilerStep#{s[0]}" for s in steps], type=pa.string()),
            "trace_id": pa.array([trace_id(node, identity, f"ProfilerStep#{s[0]}") for s in steps], type=pa.string()),
            "span_id": pa.array([span_id(node, identity, f"ProfilerStep#{s[0]}") for s in steps], type=pa.string()),
            "node": pa.array([node] * m, type=pa.string()),
            "model": pa.array([model] * m, type=pa.string()),
            "run_id": pa.array([run_id] * m, type=pa.string()),
            "source": pa.array([source] * m, type=pa.string()),
        }
    )
    return ParsedTrace("kineto", kernels, iterations, clock, skipped, tuple(sorted(cpu_pids)))
