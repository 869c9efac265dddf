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
"""

from __future__ import annotations

import bisect
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.agent.pipeline.clock import ClockOffset
from aaco.agent.pipeline.ids import span_id, trace_id

from .parsed import ParsedTrace

NS = 1000
CPU_PROVIDER = "CPUExecutionProvider"


def _num(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and np.isfinite(v):
        return round(v)
    if isinstance(v, str):
        try:
            return round(float(v))
        except ValueError:
            return None
    return None


def _int_arg(args: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        if k in args:
            return _num(args[k])
    return None


def profile_extent_us(events: list[Any]) -> int:
    """The end of the last event, in profile microseconds (for anchoring a replayed file)."""
    end = 0
    for ev in events:
        if isinstance(ev, dict):
            ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
            if ts is not None:
                end = max(end, ts + (dur or 0))
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
        ts, dur = _num(ev.get("ts")), _num(ev.get("dur"))
        if ts is None or dur is None or dur < 0:
            skipped["bad_time"] += 1
            continue
        name = ev.get("name")
        if not isinstance(name, str):
            skipped["bad_name"] += 1
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        pid, tid = _num(ev.get("pid")), _num(ev.get("tid"))
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
                        "op": args.get("op_name"),
                        "provider": args.get("provider"),
                    }
                )
        else:
            kernels.append({"ts": ts, "dur": dur, "pid": pid, "tid": tid, "name": name, "args": args})

    runs.sort()
    kept_runs = runs[skip_runs:]
    first_ts = kept_runs[0][0] if kept_runs else None
    if skip_runs and not kept_runs:
        # Every run was warmup (a cycle stopped before its timed runs): nothing of it is published.
        nodes, kernels = [], []
    off = clock.offset_ns

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
        if first_ts is not None and nd["ts"] < first_ts:
            continue
        if nd["provider"] == CPU_PROVIDER or not gpu_kernels_present:
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
        else:
            launches.setdefault(nd["node"], []).append(nd)
    for lst in launches.values():
        lst.sort(key=lambda e: e["ts"])
    launch_ts = {name: [nd["ts"] for nd in lst] for name, lst in launches.items()}
    for k in sorted(kernels, key=lambda e: e["ts"]):
        if first_ts is not None and k["ts"] < first_ts:
            continue
        args = k["args"]
        parent = args.get("parent_name")
        launch = None
        if isinstance(parent, str) and parent in launches:
            # the latest launch of this node that started before the kernel: its own run's launch
            i = bisect.bisect_right(launch_ts[parent], k["ts"]) - 1
            if i >= 0:
                nd = launches[parent][i]
                launch = (nd["ts"], nd["ts"] + nd["dur"])
        device = _int_arg(args, "device", "device_id")
        add(
            k["ts"],
            k["dur"],
            k["pid"],
            k["tid"],
            str(device) if device is not None else "0",
            _int_arg(args, "stream", "stream_id"),
            k["name"],
            args.get("op_name"),
            parent,
            launch,
            (_int_arg(args, "grid_x"), _int_arg(args, "grid_y"), _int_arg(args, "grid_z")),
            (_int_arg(args, "block_x"), _int_arg(args, "block_y"), _int_arg(args, "block_z")),
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
    pids = tuple(sorted({r[2] for r in kept_runs}))
    return ParsedTrace("ort_profile", table, iterations, clock, skipped, pids)
