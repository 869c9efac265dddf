"""Kineto's events folded into columns as they are read: what ``kineto`` builds its tables from.

``collect`` takes a batch of events (dicts, as orjson reads them) and folds them into ``Events``:
GPU work, launches, operator names, ProfilerStep ranges, metadata, the ends of timed events. The
events of each role go a column at a time (``kineto_columns``) or, when a column holds a value the
per-event rules count, drop or convert, one by one (``_add_gpu`` ...): those rules are the one
statement of what the values mean (the module doc of ``kineto`` lists them), and every faster path
(``kineto_columns``, ``kineto_arrow``) gives exactly what they give or leaves the batch to them.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aaco.agent.sources.traces import kineto_columns
from aaco.agent.sources.traces.json_values import (
    INT_OUT_OF_RANGE,
    IntOutOfRangeError,
    name_ok,
    name_reason,
    need_int,
    num,
    opt_int,
)
from aaco.agent.sources.traces.kineto_categories import Unrecognised, gpu_kind, role
from aaco.agent.sources.traces.kineto_columns import F64, I64, STR, Chunks
from aaco.agent.sources.traces.kineto_comms import Comms
from aaco.agent.sources.traces.kineto_process import ProcessInfo

STEP_PREFIX = "ProfilerStep#"
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_GRID, _WORKGROUP = ("grid_x", "grid_y", "grid_z"), ("workgroup_x", "workgroup_y", "workgroup_z")
INT_COLS = ("correlation_id", "bytes", "grid_x", "grid_y", "grid_z", "workgroup_x", "workgroup_y", "workgroup_z")


@dataclass
class Events:
    """What one pass over ``traceEvents`` keeps, still in trace microseconds."""

    gpu: Chunks = field(
        default_factory=lambda: Chunks(
            {"name": STR, "kind": STR, "device": I64, "stream": I64, "ext": I64, **dict.fromkeys(INT_COLS, I64)}
            | {"ts": F64, "dur": F64}
        )
    )
    launch: Chunks = field(
        default_factory=lambda: Chunks({"corr": I64, "pid": I64, "tid": I64, "ts": F64, "dur": F64, "name": STR})
    )
    ops: dict[int, str] = field(default_factory=dict)
    comms: Comms = field(default_factory=Comms)  # collectives' arguments (``kineto_comms``)
    steps: list[tuple[int, float, float, int | None, int | None]] = field(default_factory=list)
    ends: list[float] = field(default_factory=list)  # of events read one by one
    end_chunks: list[np.ndarray] = field(default_factory=list)  # of batches read a column at a time
    launch_pids: set[int] = field(default_factory=set)
    op_pids: set[int] = field(default_factory=set)
    gpu_lanes: set[int] = field(default_factory=set)
    procs: ProcessInfo = field(default_factory=ProcessInfo)
    unknown: Unrecognised = field(default_factory=Unrecognised)
    names: dict[str, str] = field(default_factory=dict)  # one copy of each name (they repeat: memory)


def _need(v: Any) -> int | None:
    """``need_int``, its common case (an int within int64) first: this runs for every event."""
    if type(v) is int and _I64_MIN <= v <= _I64_MAX:
        return v
    return need_int(v)


def _opt(v: Any, skipped: Counter[str]) -> int | None:
    """``opt_int``, its common case first."""
    if type(v) is int and _I64_MIN <= v <= _I64_MAX:
        return v
    return opt_int(v, skipped)


def _num(v: Any) -> float | None:
    """``num``, its common case (a finite float) first."""
    if type(v) is float and v - v == 0.0:
        return v
    return num(v)


def _dims(v: Any, skipped: Counter[str]) -> tuple[int | None, int | None, int | None]:
    if isinstance(v, list) and len(v) == 3:
        return (_opt(v[0], skipped), _opt(v[1], skipped), _opt(v[2], skipped))
    return (None, None, None)


def collect(events: list[Any], skipped: Counter[str], out: Events) -> None:
    """(A batch of) the events into ``out``: GPU work, launches, operator names, steps, metadata.

    The events of each role go a column at a time (``_fast``) or, when a column holds a value the
    per-event rules count, drop or convert, one by one; each role's events keep their order.
    """
    evs = [ev for ev in events if isinstance(ev, dict)]
    if len(evs) < len(events):
        skipped["not_an_event"] += len(events) - len(evs)
    phs = [ev.get("ph") for ev in evs]
    if "M" in phs:
        for ev, ph in zip(evs, phs, strict=True):
            if ph == "M":
                out.procs.add(ev, skipped)
    xs = [ev for ev, ph in zip(evs, phs, strict=True) if ph == "X"]
    roles = [role(ev.get("cat")) for ev in xs]
    if None in roles:
        out.unknown.add(ev for ev, r in zip(xs, roles, strict=True) if r is None)
    for kind in ("gpu", "launch", "op", "ann"):
        if kind not in roles:
            continue
        group = [ev for ev, r in zip(xs, roles, strict=True) if r == kind]
        if kind == "op":
            steps_among_ops(group, skipped, out)
            out.comms.add_ops(group)
        elif kind == "gpu":
            out.comms.add_kernels(group)
        if _fast(kind, group, out):
            continue
        for ev in group:
            _one(kind, ev, skipped, out)
        (out.gpu if kind == "gpu" else out.launch).flush()


def steps_among_ops(ops: list[dict[str, Any]], skipped: Counter[str], out: Events) -> None:
    """``ProfilerStep#N`` written as an operator (PyTorch 1.8 and 1.9: ``cat: "Operator"``): an iteration too.

    A bad time is counted once, by the operator path that reads the same event.
    """
    for ev in ops:
        name = ev.get("name")
        if type(name) is not str or not name.startswith(STEP_PREFIX):
            continue
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
        if ts is None or dur is None or dur < 0:
            continue
        try:
            add_step(out, ev, ts, dur, {}, skipped)
        except IntOutOfRangeError:
            skipped[INT_OUT_OF_RANGE] += 1


def _fast(role: str, group: list[dict[str, Any]], out: Events) -> bool:
    """The events of one role a column at a time (``kineto_columns``); False: read them one by one."""
    if role == "gpu":
        got, dest, pids = kineto_columns.gpu_columns(group), out.gpu, out.gpu_lanes
    elif role == "launch":
        got, dest, pids = kineto_columns.launch_columns(group), out.launch, out.launch_pids
    elif role == "op":
        got, dest, pids = kineto_columns.op_names(group, out.ops, out.names), None, out.op_pids
    else:
        return False
    if got is None:
        return False
    if dest is not None:
        dest.add(got[0])
    pids |= got[1]
    out.end_chunks.append(got[2])
    return True


def _one(role: str, ev: dict[str, Any], skipped: Counter[str], out: Events) -> None:
    """One event of a known role (its ``_add_*``), with its time checked first."""
    ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
    if ts is None or dur is None or dur < 0:
        skipped["bad_time"] += 1
        return
    out.ends.append(ts + dur)
    args = ev.get("args")
    try:
        _ADD.get(role, add_step)(out, ev, ts, dur, args if isinstance(args, dict) else {}, skipped)
    except IntOutOfRangeError:
        skipped[INT_OUT_OF_RANGE] += 1


def _add_gpu(
    out: Events, ev: dict[str, Any], ts: float, dur: float, args: dict[str, Any], skipped: Counter[str]
) -> None:
    """A kernel, memcpy or memset on a GPU lane."""
    name = ev.get("name")
    if not isinstance(name, str):
        skipped["bad_name"] += 1
        return
    if not name_ok(name):
        skipped[name_reason(name)] += 1
        return
    gpu = out.gpu.rows
    corr = _need(args.get("correlation"))
    lane, lane_tid = _need(ev.get("pid")), _need(ev.get("tid"))
    device, stream = _need(args.get("device")), _need(args.get("stream"))
    if lane is not None:
        out.gpu_lanes.add(lane)
    gpu["name"].append(out.names.setdefault(name, name))
    gpu["kind"].append(gpu_kind(ev["cat"]))
    gpu["device"].append(device if device is not None else lane)
    gpu["stream"].append(stream if stream is not None else lane_tid)
    gpu["correlation_id"].append(corr)
    gpu["ext"].append(_opt(args.get("External id", args.get("external id")), skipped))
    gpu["bytes"].append(_opt(args.get("bytes"), skipped))
    for keys, value in ((_GRID, args.get("grid")), (_WORKGROUP, args.get("block"))):
        for key, v in zip(keys, _dims(value, skipped), strict=True):
            gpu[key].append(v)
    gpu["ts"].append(ts)
    gpu["dur"].append(dur)


def _add_launch(
    out: Events, ev: dict[str, Any], ts: float, dur: float, args: dict[str, Any], skipped: Counter[str]
) -> None:
    """A runtime call that launched GPU work (by correlation id)."""
    pid = _need(ev.get("pid"))
    if pid is not None:
        out.launch_pids.add(pid)
    corr, tid = _need(args.get("correlation")), _need(ev.get("tid"))
    if corr is None:
        return
    name = ev.get("name")
    if isinstance(name, str) and not name_ok(name):
        skipped[name_reason(name)] += 1
        name = None
    row = (corr, pid, tid, ts, dur, out.names.setdefault(name, name) if isinstance(name, str) else None)
    for values, value in zip(out.launch.rows.values(), row, strict=True):
        values.append(value)


def _add_op(
    out: Events, ev: dict[str, Any], ts: float, dur: float, args: dict[str, Any], skipped: Counter[str]
) -> None:
    """A framework operator: its name, by External id, for the kernels it ran."""
    pid = _need(ev.get("pid"))
    if pid is not None:
        out.op_pids.add(pid)
    ext, name = _need(args.get("External id")), ev.get("name")
    if ext is not None and isinstance(name, str) and ext not in out.ops:
        if name_ok(name):
            out.ops[ext] = out.names.setdefault(name, name)
        else:
            skipped[name_reason(name)] += 1


def add_step(
    out: Events, ev: dict[str, Any], ts: float, dur: float, args: dict[str, Any], skipped: Counter[str]
) -> None:
    """A ``ProfilerStep#N`` annotation: an iteration."""
    name = ev.get("name")
    if not isinstance(name, str) or not name.startswith(STEP_PREFIX):
        return
    if not name_ok(name):
        skipped[name_reason(name)] += 1
        return
    m = _STEP.match(name)
    if m is None:
        return
    if len(m.group(1)) > 19:
        raise IntOutOfRangeError(m.group(1))
    step = need_int(m.group(1))
    out.steps.append((step or 0, ts, dur, need_int(ev.get("pid")), need_int(ev.get("tid"))))


_ADD = {"gpu": _add_gpu, "launch": _add_launch, "op": _add_op}
