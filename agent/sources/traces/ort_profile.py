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

Bad input is counted in ``skipped`` and left out, never raised (``json_values``): a time that is
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
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.format import TraceFormat
from aaco.agent.sources.traces.json_values import (
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
from aaco.agent.sources.traces.tables import const, typed_table
from aaco.agent.sources.traces.whole import load_whole_json, rechunk
from aaco.contract.clock import EPOCH_CEIL_NS, EPOCH_FLOOR_NS, ClockOffset
from aaco.contract.ids import span_id, trace_id
from aaco.contract.schemas import ITERATIONS, KERNELS

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


_CATEGORIES = ("Session", "Node", "Kernel")
_NODE_SUFFIX = "_kernel_time"
_NO_DIMS: tuple[int | None, ...] = (None, None, None)


@dataclass(frozen=True)
class _Labels:
    """What every row of one profile carries (the caller's names for it)."""

    node: str
    identity: str
    run_id: str
    model: str
    source: str
    graph_nodes: int | None
    graph_nodes_optimized: int | None
    provider: str | None


@dataclass
class _Events:
    """The events of a profile that count, by category (times in profile microseconds)."""

    runs: list[tuple[int, int, int, int]] = field(default_factory=list)  # ts, dur, pid, tid
    nodes: list[dict[str, Any]] = field(default_factory=list)
    kernels: list[dict[str, Any]] = field(default_factory=list)


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
    labels = _Labels(node, identity, run_id, model, source, graph_nodes, graph_nodes_optimized, provider)
    skipped: Counter[str] = Counter()
    off = clock.offset_ns
    found = _collect(events, off, skipped)
    window = _RunWindow(found.runs, skip_runs, skipped)
    if window.all_warmup:  # a cycle stopped before its timed runs: nothing of it is published
        found.nodes, found.kernels = [], []
    rows = _KernelRows(off)
    launches = _node_rows(found, window, rows)
    _gpu_kernel_rows(found.kernels, launches, window, rows)
    pids = tuple(sorted({r[2] for r in window.kept_runs if r[2] >= 0}))
    return ParsedTrace(FORMAT, rows.table(labels), _iterations(window.kept_runs, off, labels), clock, skipped, pids)


def _usable(ev: Any, off: int, skipped: Counter[str]) -> tuple[str, int, int, str, dict[str, Any]] | None:
    """(category, ts, dur, name, args) of an event of a category that counts; None, counted when bad."""
    if not isinstance(ev, dict):
        skipped["not_an_event"] += 1
        return None
    cat = ev.get("cat")
    if cat not in _CATEGORIES:
        return None
    ts, dur = _us(ev.get("ts")), _us(ev.get("dur"))
    if ts is None or dur is None or ts < 0 or dur < 0:
        skipped["bad_time"] += 1
        return None
    if ts + dur > MAX_PROFILE_US or not (_in_epoch(off + ts * NS) and _in_epoch(off + (ts + dur) * NS)):
        skipped[TIME_OUT_OF_RANGE] += 1
        return None
    name = ev.get("name")
    if not isinstance(name, str):
        skipped["bad_name"] += 1
        return None
    if not name_ok(name):
        skipped[name_reason(name)] += 1
        return None
    args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
    return cat, ts, dur, name, args


def _collect(events: list[Any], off: int, skipped: Counter[str]) -> _Events:
    """Runs, operator nodes and GPU kernels of the profile, bad events counted and left out."""
    out = _Events()
    for ev in events:
        if (usable := _usable(ev, off, skipped)) is None:
            continue
        cat, ts, dur, name, args = usable
        try:
            pid, tid = need_int(ev.get("pid")), need_int(ev.get("tid"))
            device = _int_arg(args, None, "device", "device_id") if cat == "Kernel" else None
            stream = _int_arg(args, None, "stream", "stream_id") if cat == "Kernel" else None
        except IntOutOfRangeError:
            skipped[INT_OUT_OF_RANGE] += 1
            continue
        common = {"ts": ts, "dur": dur, "pid": pid, "tid": tid, "op": None}
        if cat == "Session":
            if name == "model_run":
                out.runs.append((ts, dur, pid if pid is not None else -1, tid if tid is not None else -1))
        elif cat == "Node":
            if name.endswith(_NODE_SUFFIX):
                node = {**common, "node": name[: -len(_NODE_SUFFIX)], "provider": args.get("provider")}
                node["op"] = _aux_name(args.get("op_name"), skipped)
                out.nodes.append(node)
        else:
            kernel = {**common, "name": name, "device": device, "stream": stream}
            kernel["op"] = _aux_name(args.get("op_name"), skipped)
            kernel["parent"] = _aux_name(args.get("parent_name"), skipped)
            kernel["grid"] = tuple(_int_arg(args, skipped, f"grid_{a}") for a in "xyz")
            kernel["block"] = tuple(_int_arg(args, skipped, f"block_{a}") for a in "xyz")
            out.kernels.append(kernel)
    return out


class _RunWindow:
    """Which work counts: from the first kept run on.

    Earlier work is warmup left out on request (from the first warmup run on) or work before every
    run (counted ``before_first_run``).
    """

    def __init__(self, runs: list[tuple[int, int, int, int]], skip_runs: int, skipped: Counter[str]) -> None:
        runs = sorted(runs)
        self.kept_runs = runs[skip_runs:]
        self.first_ts = self.kept_runs[0][0] if self.kept_runs else None
        self.all_warmup = bool(skip_runs) and not self.kept_runs
        self.warm_from = runs[0][0] if skip_runs and runs else self.first_ts
        self._skipped = skipped

    def kept(self, ts: int) -> bool:
        """Whether work starting at ``ts`` counts (work before every run is counted as skipped)."""
        if self.first_ts is None or ts >= self.first_ts:
            return True
        if self.warm_from is None or ts < self.warm_from:
            self._skipped["before_first_run"] += 1
        return False


def _iterations(runs: list[tuple[int, int, int, int]], off: int, labels: _Labels) -> pa.Table:
    """One iteration per kept ``model_run``, in time order."""
    n = len(runs)
    return typed_table(
        ITERATIONS,
        {
            "start_ns": [off + ts * NS for ts, _, _, _ in runs],
            "end_ns": [off + (ts + dur) * NS for ts, dur, _, _ in runs],
            "pid": [r[2] for r in runs],
            "tid": [r[3] for r in runs],
            "iteration": list(range(n)),
            "trace_id": [trace_id(labels.node, labels.identity, i) for i in range(n)],
            "span_id": [span_id(labels.node, labels.identity, i) for i in range(n)],
            "node": const(labels.node, n),
            "model": const(labels.model, n),
            "run_id": const(labels.run_id, n),
            "source": const(labels.source, n),
            "name": const("model_run", n),
            "graph_nodes": const(labels.graph_nodes, n, pa.int64()),
            "graph_nodes_optimized": const(labels.graph_nodes_optimized, n, pa.int64()),
            "provider": const(labels.provider, n),
        },
    )


class _KernelRows:
    """Kernel rows gathered as the columns of the kernels schema, times converted to epoch ns."""

    _COLUMNS = (
        *("start_ns", "end_ns", "pid", "tid", "device", "stream", "name", "kind", "op_name", "graph_node"),
        *("launch_start_ns", "launch_end_ns", "grid_x", "grid_y", "grid_z"),
        *("workgroup_x", "workgroup_y", "workgroup_z"),
    )

    def __init__(self, off: int) -> None:
        self.off = off
        self.cols: dict[str, list[Any]] = {k: [] for k in self._COLUMNS}

    def add(self, ev: dict[str, Any], *, device: str, name: str, graph_node: Any, launch: Any = None) -> None:
        """One row from an event (``ts``, ``dur``, ``pid``, ``tid``, ``op``; ``stream``, ``grid``, ``block``)."""
        c, off, op = self.cols, self.off, ev["op"]
        c["start_ns"].append(off + ev["ts"] * NS)
        c["end_ns"].append(off + (ev["ts"] + ev["dur"]) * NS)
        c["pid"].append(ev["pid"])
        c["tid"].append(ev["tid"])
        c["device"].append(device)
        c["stream"].append(ev.get("stream"))
        c["name"].append(name)
        c["kind"].append("memcpy" if "memcpy" in name.lower() else "kernel")
        c["op_name"].append(op if isinstance(op, str) else None)
        c["graph_node"].append(graph_node if isinstance(graph_node, str) else None)
        c["launch_start_ns"].append(None if launch is None else off + launch[0] * NS)
        c["launch_end_ns"].append(None if launch is None else off + launch[1] * NS)
        for axis, g, b in zip("xyz", ev.get("grid", _NO_DIMS), ev.get("block", _NO_DIMS), strict=True):
            c[f"grid_{axis}"].append(g)
            c[f"workgroup_{axis}"].append(b)

    def table(self, labels: _Labels) -> pa.Table:
        """The rows in start order, with the columns every row carries."""
        n = len(self.cols["start_ns"])
        order = np.argsort(np.asarray(self.cols["start_ns"], dtype=np.int64), kind="stable") if n else np.arange(0)
        cols: dict[str, Any] = {
            **self.cols,
            "node": const(labels.node, n),
            "source": const(labels.source, n),
            "run_id": const(labels.run_id, n),
            "correlation_id": pa.nulls(n, pa.int64()),
        }
        return typed_table(KERNELS, cols).take(pa.array(order))


def _node_rows(found: _Events, window: _RunWindow, rows: _KernelRows) -> dict[str, list[dict[str, Any]]]:
    """Rows for the nodes that are the kernels (CPU provider, or no GPU kernels in the profile).

    Returns the other nodes, the launches of GPU kernels: node name -> its launches in time order.
    """
    launches: dict[str, list[dict[str, Any]]] = {}
    for nd in found.nodes:
        if nd["provider"] == CPU_PROVIDER or not found.kernels:
            if window.kept(nd["ts"]):
                device = "cpu" if nd["provider"] in (CPU_PROVIDER, None) else "gpu"
                name = nd["op"] if isinstance(nd["op"], str) else nd["node"]
                rows.add(nd, device=device, name=name, graph_node=nd["node"])
        elif window.first_ts is None or nd["ts"] >= window.first_ts:
            launches.setdefault(nd["node"], []).append(nd)
    for lst in launches.values():
        lst.sort(key=lambda e: e["ts"])
    return launches


def _gpu_kernel_rows(
    kernels: list[dict[str, Any]], launches: dict[str, list[dict[str, Any]]], window: _RunWindow, rows: _KernelRows
) -> None:
    """Rows for the GPU kernels, each with the launch of its parent node in its own run."""
    launch_ts = {name: [nd["ts"] for nd in lst] for name, lst in launches.items()}
    for k in sorted(kernels, key=lambda e: e["ts"]):
        if not window.kept(k["ts"]):
            continue
        parent, launch = k["parent"], None
        if parent is not None and parent in launches:
            # the latest launch of this node that started before the kernel: its own run's launch
            i = bisect.bisect_right(launch_ts[parent], k["ts"]) - 1
            if i >= 0:
                nd = launches[parent][i]
                launch = (nd["ts"], nd["ts"] + nd["dur"])
        device = str(k["device"]) if k["device"] is not None else "0"
        rows.add(k, device=device, name=k["name"], graph_node=parent, launch=launch)


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
