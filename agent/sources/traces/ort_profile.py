"""ONNX Runtime profile JSON: a list of Chrome-trace events, categories Session, Node and Kernel.

- ``Session`` ``model_run`` events are iterations (one per ``InferenceSession.run``).
- ``Node`` events named ``<node>_kernel_time`` are an operator executing; ``args`` carry ``op_name``
  and ``provider``. On the CPU execution provider they are the kernels (device ``cpu``). On a GPU
  provider they are the CPU side that launches the GPU work, and the GPU kernels are ``Kernel``
  events whose ``args.parent_name`` names the node; the node's time becomes the kernel's launch.
  (``_fence_before``/``_fence_after`` node events of older releases are bookkeeping and ignored.)
- ``ts`` and ``dur`` are integer microseconds since the profiling start, which
  ``InferenceSession.get_profiling_start_time_ns()`` gives in Unix-epoch ns. A profile replayed from
  a file has no such anchor: it is anchored so its last event ends at the file's modification time
  (ONNX Runtime writes the file when profiling ends), and the method is recorded as ``file-mtime``.

Bad input is counted in ``skipped`` and left out, never raised (``kineto_values``): a time that is
not a finite number, a negative time or duration (``bad_time``: times count from the profiling start);
an operator or kernel before every run (``before_first_run``; the warmup runs left out on request are
not counted); an event ending more than ``MAX_PROFILE_US`` after the profiling start (a profile is one
session's, kept in memory until it ends: such a time is damage, and it never anchors the file) or
landing outside 1990..2100 once converted (``time_out_of_range``); a pid, tid, device or stream beyond
int64 (``int_out_of_range``); an event or kernel name that is not a string (``bad_name``) or longer
than ``MAX_NAME_BYTES`` (``name_too_long``). Values a kernel can do without become null instead: grid
and block sizes beyond int64 (``int_out_of_range``), an ``op_name`` or ``parent_name`` too long (``name_too_long``;
without its parent a GPU kernel has no launch).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.format import TraceFormat
from aaco.agent.sources.traces.kineto_values import (
    INT_OUT_OF_RANGE,
    TIME_OUT_OF_RANGE,
    IntOutOfRangeError,
    name_ok,
    name_reason,
    need_int,
    num,
    opt_int,
)
from aaco.agent.sources.traces.limits import TraceLimits
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.whole import load_whole_json, rechunk
from aaco.contract.clock import EPOCH_CEIL_NS, EPOCH_FLOOR_NS, ClockOffset
from aaco.contract.ids import span_id, trace_id

FORMAT = "ort_profile"
NS = 1000
CPU_PROVIDER = "CPUExecutionProvider"
MAX_PROFILE_US = 366 * 86_400 * 10**6  # a year of profiling: beyond it a time is damage


def _us(v: Any) -> int | None:
    """A time or duration in whole microseconds (ONNX Runtime writes integers), or None."""
    f = num(v)
    return None if f is None else round(f)


def _int_arg(args: dict[str, Any], skipped: Counter[str] | None, *keys: str) -> int | None:
    """The first of ``keys`` present in ``args``: needed (raises beyond int64) without ``skipped``."""
    for k in keys:
        if k in args:
            return need_int(args[k]) if skipped is None else opt_int(args[k], skipped)
    return None


def _aux_name(v: Any, skipped: Counter[str]) -> str | None:
    """An auxiliary name (op, parent node): None when not a string, or too long (counted)."""
    if not isinstance(v, str):
        return None
    if not name_ok(v):
        skipped[name_reason(v)] += 1
        return None
    return v


def _in_epoch(ns: int) -> bool:
    return EPOCH_FLOOR_NS <= ns < EPOCH_CEIL_NS


def profile_extent_us(events: list[Any]) -> int:
    """The end of the last event, in profile microseconds (for anchoring a replayed file).

    Ends beyond ``MAX_PROFILE_US`` are not the profile's (the parser leaves those events out).
    """
    end = 0
    for ev in events:
        if isinstance(ev, dict):
            ts, dur = _us(ev.get("ts")), _us(ev.get("dur"))
            if ts is not None and (e := ts + (dur if dur is not None and dur > 0 else 0)) <= MAX_PROFILE_US:
                end = max(end, e)
    return end


def parse_ort_profile(
    events: list[Any],
    *,
    clock: ClockOffset,
    node: str,
    identity: str,
    run_id: str,
    model: str,
    skip_runs: int = 0,
    graph_nodes: int | None = None,
    graph_nodes_optimized: int | None = None,
    provider: str | None = None,
    source: str = "ort",
) -> ParsedTrace:
    """Turn profile events into iterations and kernels (``skip_runs`` first runs are warmup, left out)."""
    if not isinstance(events, list):
        raise ValueError("an ONNX Runtime profile is a JSON list of events")
    skipped: Counter[str] = Counter()
    off = clock.offset_ns
    runs: list[tuple[int, int, int, int]] = []  # ts, dur, pid, tid
    nodes: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    for ev in events:
        if not isinstance(ev, dict):
            skipped["not_an_event"] += 1
            continue
        cat = ev.get("cat")
        if cat not in ("Session", "Node", "Kernel"):
            continue
        ts, dur = _us(ev.get("ts")), _us(ev.get("dur"))
        if ts is None or dur is None or ts < 0 or dur < 0:
            skipped["bad_time"] += 1
            continue
        if ts + dur > MAX_PROFILE_US or not (_in_epoch(off + ts * NS) and _in_epoch(off + (ts + dur) * NS)):
            skipped[TIME_OUT_OF_RANGE] += 1
            continue
        name = ev.get("name")
        if not isinstance(name, str):
            skipped["bad_name"] += 1
            continue
        if not name_ok(name):
            skipped[name_reason(name)] += 1
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        try:
            pid, tid = need_int(ev.get("pid")), need_int(ev.get("tid"))
            device = _int_arg(args, None, "device", "device_id") if cat == "Kernel" else None
            stream = _int_arg(args, None, "stream", "stream_id") if cat == "Kernel" else None
        except IntOutOfRangeError:
            skipped[INT_OUT_OF_RANGE] += 1
            continue
        if cat == "Session":
            if name == "model_run":
                runs.append((ts, dur, pid if pid is not None else -1, tid if tid is not None else -1))
        elif cat == "Node":
            if name.endswith("_kernel_time"):
                nodes.append(
                    {
                        "ts": ts,
                        "dur": dur,
                        "pid": pid,
                        "tid": tid,
                        "node": name[: -len("_kernel_time")],
                        "op": _aux_name(args.get("op_name"), skipped),
                        "provider": args.get("provider"),
                    }
                )
        else:
            kernels.append(
                {
                    "ts": ts,
                    "dur": dur,
                    "pid": pid,
                    "tid": tid,
                    "name": name,
                    "device": device,
                    "stream": stream,
                    "op": _aux_name(args.get("op_name"), skipped),
                    "parent": _aux_name(args.get("parent_name"), skipped),
                    "grid": tuple(_int_arg(args, skipped, f"grid_{a}") for a in "xyz"),
                    "block": tuple(_int_arg(args, skipped, f"block_{a}") for a in "xyz"),
                }
            )

    runs.sort()
    kept_runs = runs[skip_runs:]
    first_ts = kept_runs[0][0] if kept_runs else None
    if skip_runs and not kept_runs:
        # Every run was warmup (a cycle stopped before its timed runs): nothing of it is published.
        nodes, kernels = [], []
    # Work from the first warmup run on is warmup, left out by request; work before every run is counted.
    warm_from = runs[0][0] if skip_runs and runs else first_ts

    def kept(ts: int) -> bool:
        if first_ts is None or ts >= first_ts:
            return True
        if warm_from is None or ts < warm_from:
            skipped["before_first_run"] += 1
        return False

    it_rows = {k: [] for k in ("start_ns", "end_ns", "pid", "tid", "iteration", "trace_id", "span_id")}
    for i, (ts, dur, pid, tid) in enumerate(kept_runs):
        it_rows["start_ns"].append(off + ts * NS)
        it_rows["end_ns"].append(off + (ts + dur) * NS)
        it_rows["pid"].append(pid)
        it_rows["tid"].append(tid)
        it_rows["iteration"].append(i)
        it_rows["trace_id"].append(trace_id(node, identity, i))
        it_rows["span_id"].append(span_id(node, identity, i))
    n_it = len(kept_runs)
    iterations = pa.table(
        {
            **{k: pa.array(v, type=pa.int64()) for k, v in it_rows.items() if k not in ("trace_id", "span_id")},
            "trace_id": pa.array(it_rows["trace_id"], type=pa.string()),
            "span_id": pa.array(it_rows["span_id"], type=pa.string()),
            "node": pa.array([node] * n_it, type=pa.string()),
            "model": pa.array([model] * n_it, type=pa.string()),
            "run_id": pa.array([run_id] * n_it, type=pa.string()),
            "source": pa.array([source] * n_it, type=pa.string()),
            "name": pa.array(["model_run"] * n_it, type=pa.string()),
            "graph_nodes": pa.array([graph_nodes] * n_it, type=pa.int64()),
            "graph_nodes_optimized": pa.array([graph_nodes_optimized] * n_it, type=pa.int64()),
            "provider": pa.array([provider] * n_it, type=pa.string()),
        }
    )

    rows: dict[str, list[Any]] = {
        k: []
        for k in (
            "start_ns",
            "end_ns",
            "pid",
            "tid",
            "device",
            "stream",
            "name",
            "kind",
            "op_name",
            "graph_node",
            "launch_start_ns",
            "launch_end_ns",
            "grid_x",
            "grid_y",
            "grid_z",
            "workgroup_x",
            "workgroup_y",
            "workgroup_z",
        )
    }

    def add(
        ts: int,
        dur: int,
        pid: Any,
        tid: Any,
        device: str,
        stream: int | None,
        name: str,
        op: Any,
        gnode: Any,
        launch: tuple[int, int] | None,
        grid: tuple,
        block: tuple,
    ) -> None:
        rows["start_ns"].append(off + ts * NS)
        rows["end_ns"].append(off + (ts + dur) * NS)
        rows["pid"].append(pid)
        rows["tid"].append(tid)
        rows["device"].append(device)
        rows["stream"].append(stream)
        rows["name"].append(name)
        rows["kind"].append("memcpy" if "memcpy" in name.lower() else "kernel")
        rows["op_name"].append(op if isinstance(op, str) else None)
        rows["graph_node"].append(gnode if isinstance(gnode, str) else None)
        rows["launch_start_ns"].append(None if launch is None else off + launch[0] * NS)
        rows["launch_end_ns"].append(None if launch is None else off + launch[1] * NS)
        for axis, v in zip("xyz", grid, strict=True):
            rows[f"grid_{axis}"].append(v)
        for axis, v in zip("xyz", block, strict=True):
            rows[f"workgroup_{axis}"].append(v)

    gpu_kernels_present = bool(kernels)
    launches: dict[str, list[dict[str, Any]]] = {}  # node name -> its launches in time order
    for nd in nodes:
        if nd["provider"] == CPU_PROVIDER or not gpu_kernels_present:
            if not kept(nd["ts"]):
                continue
            device = "cpu" if nd["provider"] in (CPU_PROVIDER, None) else "gpu"
            op = nd["op"]
            add(
                nd["ts"],
                nd["dur"],
                nd["pid"],
                nd["tid"],
                device,
                None,
                op if isinstance(op, str) else nd["node"],
                op,
                nd["node"],
                None,
                (None,) * 3,
                (None,) * 3,
            )
        elif first_ts is None or nd["ts"] >= first_ts:
            launches.setdefault(nd["node"], []).append(nd)
    for lst in launches.values():
        lst.sort(key=lambda e: e["ts"])
    launch_ts = {name: [nd["ts"] for nd in lst] for name, lst in launches.items()}
    for k in sorted(kernels, key=lambda e: e["ts"]):
        if not kept(k["ts"]):
            continue
        parent = k["parent"]
        launch = None
        if parent is not None and parent in launches:
            # the latest launch of this node that started before the kernel: its own run's launch
            i = bisect.bisect_right(launch_ts[parent], k["ts"]) - 1
            if i >= 0:
                nd = launches[parent][i]
                launch = (nd["ts"], nd["ts"] + nd["dur"])
        add(
            k["ts"],
            k["dur"],
            k["pid"],
            k["tid"],
            str(k["device"]) if k["device"] is not None else "0",
            k["stream"],
            k["name"],
            k["op"],
            parent,
            launch,
            k["grid"],
            k["block"],
        )
    n = len(rows["start_ns"])
    order = np.argsort(np.asarray(rows["start_ns"], dtype=np.int64), kind="stable") if n else np.arange(0)
    table = pa.table(
        {
            **{
                k: pa.array(v, type=pa.int64())
                for k, v in rows.items()
                if k not in ("device", "name", "kind", "op_name", "graph_node")
            },
            **{k: pa.array(rows[k], type=pa.string()) for k in ("device", "name", "kind", "op_name", "graph_node")},
            "node": pa.array([node] * n, type=pa.string()),
            "source": pa.array([source] * n, type=pa.string()),
            "run_id": pa.array([run_id] * n, type=pa.string()),
            "correlation_id": pa.nulls(n, type=pa.int64()),
        }
    ).take(pa.array(order))
    pids = tuple(sorted({r[2] for r in kept_runs if r[2] >= 0}))
    return ParsedTrace(FORMAT, table, iterations, clock, skipped, pids)


# Categories ONNX Runtime writes into its profile (a JSON list of Chrome-trace events).
_HEAD = re.compile(rb'^\s*\[\s*\{[^\[\]]*"cat"\s*:\s*"(Session|Node|Kernel)"', re.S)


def sniff(head: bytes) -> str | None:
    """``ort_profile`` when ``head`` opens a JSON list whose first event has an ONNX Runtime category."""
    return FORMAT if _HEAD.match(head.lstrip()) else None


def parse_file(tf: TraceFile, ctx: TraceContext, limits: TraceLimits) -> Iterator[ParsedTrace]:
    """A profile file, anchored so its last event ends at the file's mtime (``file-mtime``)."""
    loaded = load_whole_json(tf, limits)
    doc = loaded.doc
    extent = profile_extent_us(doc) if isinstance(doc, list) else 0
    clock = ClockOffset(tf.mtime_ns - extent * NS, 10**9, "file-mtime")
    parsed = parse_ort_profile(
        doc,
        clock=clock,
        node=ctx.node,
        identity=ctx.identity,
        run_id=ctx.run_id,
        model=ctx.model,
        source=ctx.source,
    )
    yield from rechunk(parsed, ctx, loaded)


TRACE_FORMAT = TraceFormat((FORMAT,), sniff, parse_file)
