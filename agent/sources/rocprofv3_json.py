"""rocprofv3 JSON output (``--output-format json``), streamed.

Layout (rocprofiler-sdk ``source/docs/how-to/using-rocprofv3.rst``, "JSON output schema", and the
writer ``source/lib/output/generateJSON.cpp``): ``{"rocprofiler-sdk-tool": [process, ...]}`` (an
object instead of the list in some releases), each process holding ``metadata`` (``pid``),
``agents`` (``id.handle``, ``type`` 1 CPU / 2 GPU, ``node_id``, ``logical_node_id``,
``logical_node_type_id``, ``name``, ``product_name``), ``strings`` (``buffer_records``: per record
kind, its ``kind`` name and ``operations`` names, indexed by the records' integer ``kind`` and
``operation``; ``marker_api``: rocTX messages by correlation id), ``kernel_symbols`` (``kernel_id``
-> ``formatted_kernel_name`` / ``demangled_kernel_name`` / ``kernel_name``), and
``buffer_records``: ``kernel_dispatch`` (``thread_id``, ``correlation_id.internal``,
``start_timestamp``, ``end_timestamp``, ``dispatch_info.{agent_id.handle, queue_id.handle,
kernel_id, workgroup_size, grid_size}``, ``stream_id``), ``memory_copy`` (``src_agent_id``,
``dst_agent_id``, ``bytes``, ``operation`` = direction), ``hip_api`` and ``marker_api`` (thread,
correlation id, start, end, kind, operation).

Why streaming, and how: these files reach tens to hundreds of MB (one object per dispatch, about
700 bytes each, indented), and a whole-file object tree costs ~10x the file in memory. ``ijson``
with its yajl2 C backend parses incrementally (``ijson.parse`` events); two passes over the file:

1. the small parts and the host-side records, whatever their order in the file: processes,
   agents, kernel symbols, strings, HIP launches (compact numpy arrays by correlation id, for the
   join) and rocTX ranges (iterations);
2. ``kernel_dispatch`` and ``memory_copy`` records, turned into columns and yielded as
   ``ParsedTrace`` chunks of at most ``CHUNK_ROWS`` rows (iterations on the first), so memory
   stays flat in the number of dispatches.

Only leaf values at known paths are kept (a dict lookup per event), never a record's subtree. A
record without a start or end, with end before start, or with an unknown kernel id is counted
in ``skipped``; a file cut short yields everything before the cut and counts ``truncated_json``.
Timestamps are CLOCK_BOOTTIME ns, converted with ``TraceContext.clock``.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .formats import _open
from .parsed import ParsedTrace
from .rocprofv3_csv import MARKER_RANGE_DOMAINS, MAX_TIME_NS
from .trace_common import (
    CHUNK_ROWS,
    MAX_NAME_BYTES,
    Agent,
    AgentMap,
    BadRow,
    LaunchTable,
    TraceContext,
    empty_iterations,
    empty_kernels,
    iterations_table,
    stamp_kernels,
)

FORMAT = "rocprofv3_json"
ROOTS = ("rocprofiler-sdk-tool.item", "rocprofiler-sdk-tool")
_LIST = "[]"  # marks a field collected as a list

# section -> {path inside one item: field}
SECTIONS_META: dict[str, dict[str, str]] = {
    "agents": {
        "id.handle": "handle",
        "type": "type",
        "node_id": "node_id",
        "logical_node_id": "logical_node_id",
        "logical_node_type_id": "type_index",
        "name": "name",
        "product_name": "product_name",
    },
    "kernel_symbols": {
        "kernel_id": "kernel_id",
        "formatted_kernel_name": "formatted",
        "demangled_kernel_name": "demangled",
        "truncated_kernel_name": "truncated",
        "kernel_name": "mangled",
    },
    "strings.buffer_records": {"kind": "kind", "operations.item": "operations" + _LIST},
    "strings.marker_api": {"key": "key", "value": "value"},
}
_API = {
    "thread_id": "tid",
    "correlation_id.internal": "corr",
    "start_timestamp": "start",
    "end_timestamp": "end",
    "kind": "kind",
    "operation": "op",
}
SECTIONS_HOST: dict[str, dict[str, str]] = {"buffer_records.hip_api": _API, "buffer_records.marker_api": _API}
_DISPATCH = {
    "thread_id": "tid",
    "correlation_id.internal": "corr",
    "start_timestamp": "start",
    "end_timestamp": "end",
    "stream_id.handle": "stream",
    "stream_id": "stream",
}
for _base in ("dispatch_info.", ""):  # documented inside dispatch_info; accepted beside it too
    _DISPATCH.update(
        {
            f"{_base}agent_id.handle": "agent",
            f"{_base}queue_id.handle": "queue",
            f"{_base}kernel_id": "kernel_id",
            **{f"{_base}workgroup_size.{a}": f"wg_{a}" for a in "xyz"},
            **{f"{_base}grid_size.{a}": f"grid_{a}" for a in "xyz"},
        }
    )
SECTIONS_GPU: dict[str, dict[str, str]] = {
    "buffer_records.kernel_dispatch": _DISPATCH,
    "buffer_records.memory_copy": {
        "thread_id": "tid",
        "correlation_id.internal": "corr",
        "start_timestamp": "start",
        "end_timestamp": "end",
        "kind": "kind",
        "operation": "op",
        "src_agent_id.handle": "src",
        "dst_agent_id.handle": "dst",
        "bytes": "bytes",
        "stream_id.handle": "stream",
        "stream_id": "stream",
    },
}


class _Walker:
    """Routes ``ijson.parse`` events of the wanted sections to per-item dicts of leaf values."""

    def __init__(self, sections: dict[str, dict[str, str]], scalars: dict[str, str]) -> None:
        self.items: dict[str, tuple[str, int]] = {}  # item prefix -> (section, root index)
        self.fields: dict[str, tuple[str, str]] = {}  # leaf prefix -> (section, field)
        self.scalars: dict[str, str] = {}  # leaf prefix outside arrays (metadata.pid) -> name
        for r, root in enumerate(ROOTS):
            for section, paths in sections.items():
                item = f"{root}.{section}.item"
                self.items[item] = (section, r)
                for rel, name in paths.items():
                    self.fields[f"{item}.{rel}"] = (section, name)
            for rel, name in scalars.items():
                self.scalars[f"{root}.{rel}"] = name

    def walk(self, fh: IO[bytes]) -> Iterator[tuple[int, str, Any]]:
        """Feed ``fh`` through, yielding ``(process, section, values)`` per finished item.

        Wanted scalars outside the arrays come as ``(process, "=" + name, value)``.
        """
        process = -1
        current: dict[str, Any] | None = None
        items, fields, scalars = self.items, self.fields, self.scalars
        for prefix, event, value in ijson.parse(fh, use_float=True):
            hit = fields.get(prefix)
            if hit is not None:
                if current is not None and event not in ("start_map", "end_map", "start_array", "end_array"):
                    name = hit[1]
                    if name.endswith(_LIST):
                        current.setdefault(name, []).append(value)
                    else:
                        current[name] = value
                continue
            if event == "start_map":
                if prefix in items:
                    current = {}
                elif prefix in ROOTS and (prefix == ROOTS[0] or process < 0):
                    process += 1
            elif event == "end_map" and prefix in items and current is not None:
                yield max(process, 0), items[prefix][0], current
                current = None
            elif prefix in scalars:
                yield max(process, 0), "=" + scalars[prefix], value


def _num(v: Any) -> int | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and np.isfinite(v):
        return int(v)
    return None


@dataclass
class _Process:
    pid: int | None = None
    agents: list[Agent] = field(default_factory=list)
    symbols: dict[int, str] = field(default_factory=dict)
    kinds: list[tuple[str, list[str]]] = field(default_factory=list)
    messages: dict[int, str] = field(default_factory=dict)
    # HIP calls, one per launch: as many as dispatches, so packed (8 bytes a value, not a tuple each)
    hip: array = field(default_factory=lambda: array("q"))  # corr, start, end, tid, kind, op, repeated
    markers: list[tuple[int, int, int, int, int, int]] = field(default_factory=list)
    agent_map: AgentMap | None = None
    launches: LaunchTable | None = None

    def kind_name(self, kind: int | None) -> str | None:
        if kind is None or not 0 <= kind < len(self.kinds):
            return None
        return self.kinds[kind][0]

    def op_name(self, kind: int | None, op: int | None) -> str | None:
        if kind is None or op is None or not 0 <= kind < len(self.kinds):
            return None
        ops = self.kinds[kind][1]
        return ops[op] if 0 <= op < len(ops) and isinstance(ops[op], str) else None


@dataclass
class _Metadata:
    processes: dict[int, _Process] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
    bad_rows: list[BadRow] = field(default_factory=list)

    def proc(self, i: int) -> _Process:
        return self.processes.setdefault(i, _Process())


def _agent(values: dict[str, Any]) -> Agent | None:
    handle = _num(values.get("handle"))
    if handle is None:
        return None
    t = values.get("type")
    kind = {1: "CPU", 2: "GPU"}.get(t, str(t).upper() if isinstance(t, str) else "UNK")  # type: ignore[arg-type]
    name, product = values.get("name"), values.get("product_name")
    return Agent(
        _num(values.get("node_id")),
        _num(values.get("logical_node_id")),
        kind,
        _num(values.get("type_index")),
        name if isinstance(name, str) else None,
        product if isinstance(product, str) else None,
        handle,
    )


def _read_metadata(path: Path) -> _Metadata:
    meta = _Metadata()

    def on_item(p: int, section: str, v: Any) -> None:
        proc = meta.proc(p)
        if section == "=pid":
            proc.pid = _num(v)
        elif section == "agents":
            a = _agent(v)
            if a is not None:
                proc.agents.append(a)
        elif section == "kernel_symbols":
            kid = _num(v.get("kernel_id"))
            names = [v.get(k) for k in ("formatted", "demangled", "truncated", "mangled")]
            name = next((s for s in names if isinstance(s, str) and s), None)
            if kid is not None and name is not None:
                proc.symbols[kid] = name
        elif section == "strings.buffer_records":
            ops = v.get("operations" + _LIST) or []
            proc.kinds.append((str(v.get("kind", "")), [o if isinstance(o, str) else "" for o in ops]))
        elif section == "strings.marker_api":
            key, value = _num(v.get("key")), v.get("value")
            if key is not None and isinstance(value, str):
                proc.messages[key] = value
        else:
            rec = tuple(_num(v.get(k)) for k in ("corr", "start", "end", "tid", "kind", "op"))
            if rec[1] is None or rec[2] is None:
                meta.skipped["bad_record"] += 1
                return
            row = tuple(-1 if x is None else x for x in rec)
            if section == "buffer_records.hip_api":
                proc.hip.extend(row)  # type: ignore[arg-type]
            else:
                proc.markers.append(row)  # type: ignore[arg-type]

    walker = _Walker({**SECTIONS_META, **SECTIONS_HOST}, {"metadata.pid": "pid"})
    with _open(path) as fh:
        try:
            for p, section, v in walker.walk(fh):
                on_item(p, section, v)
        except (ijson.JSONError, ValueError, EOFError, OSError):
            pass  # counted by the second pass, which stops at the same place
    for proc in meta.processes.values():
        proc.agent_map = AgentMap(AgentMap.with_type_indexes(proc.agents))
        if proc.hip:
            h = np.frombuffer(proc.hip, dtype=np.int64).reshape(-1, 6)
            keep = h[:, 0] >= 0
            h = h[keep]
            pairs, inverse = np.unique(h[:, 4:6], axis=0, return_inverse=True)  # few (kind, operation) pairs
            names = [proc.op_name(int(k), int(o)) or "hip_api" for k, o in pairs]
            name_idx = np.asarray(inverse, dtype=np.int32).reshape(-1)
            pid = np.full(len(h), proc.pid if proc.pid is not None else -1, dtype=np.int64)
            proc.launches = LaunchTable.build(h[:, 0], h[:, 1], h[:, 2], pid, h[:, 3], name_idx, names)
            proc.hip = array("q")
    return meta


def _iterations(meta: _Metadata, ctx: TraceContext) -> pa.Table:
    starts, ends, pids, tids, names, keys = [], [], [], [], [], []
    for p, proc in sorted(meta.processes.items()):
        for corr, start, end, tid, kind, op in proc.markers:
            kname = proc.kind_name(kind)
            if end <= start or (kname is not None and kname not in MARKER_RANGE_DOMAINS):
                continue
            name = proc.messages.get(corr) or proc.op_name(kind, op) or "roctx"
            starts.append(start + ctx.clock.offset_ns)
            ends.append(end + ctx.clock.offset_ns)
            pids.append(proc.pid)
            tids.append(tid if tid >= 0 else None)
            names.append(name[:MAX_NAME_BYTES])
            keys.append(f"roctx:{p}:{corr}:{start}")
    if not starts:
        return empty_iterations(ctx)
    return iterations_table(
        ctx,
        start_ns=np.array(starts, dtype=np.int64),
        end_ns=np.array(ends, dtype=np.int64),
        pid=pids,
        tid=tids,
        names=names,
        keys=keys,
    )


_DISPATCH_FIELDS = ("start", "end", "corr", "tid", "agent", "queue", "kernel_id", "stream", "bytes", "src", "dst", "op")
_DIMS = ("wg_x", "wg_y", "wg_z", "grid_x", "grid_y", "grid_z")


class _Batch:
    """Columns of GPU records of one process and section, as Python lists until flushed."""

    def __init__(self, process: int, section: str) -> None:
        self.process = process
        self.section = section
        self.cols: dict[str, list[Any]] = {k: [] for k in (*_DISPATCH_FIELDS, *_DIMS)}
        self.n = 0

    def add(self, v: dict[str, Any]) -> None:
        for k, col in self.cols.items():
            col.append(_num(v.get(k)))
        self.n += 1


def _table(batch: _Batch, proc: _Process, ctx: TraceContext, skipped: Counter[str]) -> pa.Table:
    c = batch.cols
    n = batch.n
    off = ctx.clock.offset_ns
    start = np.array(c["start"], dtype=np.int64)
    end = np.array(c["end"], dtype=np.int64)
    corr = np.array([x if x is not None else -1 for x in c["corr"]], dtype=np.int64)
    agents = proc.agent_map or AgentMap()
    cols: dict[str, Any] = {
        "start_ns": pa.array(start + off, pa.int64()),
        "end_ns": pa.array(end + off, pa.int64()),
        "correlation_id": pa.array(c["corr"], pa.int64()),
        "tid": pa.array(c["tid"], pa.int64()),
        "stream": pa.array(c["stream"], pa.int64()),
    }
    if batch.section == "buffer_records.kernel_dispatch":
        kind: str = "kernel"
        unknown = sum(1 for k in c["kernel_id"] if k not in proc.symbols)
        if unknown:
            skipped["unknown_kernel_id"] += unknown  # kept, named by id: the event itself is sound
        cols["name"] = pa.array(
            [proc.symbols.get(k, f"kernel_id:{k}") if k is not None else "unknown" for k in c["kernel_id"]],
            pa.string(),
        )
        cols["device"] = agents.map_handles(np.array([a if a is not None else -1 for a in c["agent"]], np.int64))
        cols["queue_id"] = pa.array(c["queue"], pa.int64())
        for axis in "xyz":
            cols[f"grid_{axis}"] = pa.array(c[f"grid_{axis}"], pa.int64())
            cols[f"workgroup_{axis}"] = pa.array(c[f"wg_{axis}"], pa.int64())
    else:
        kind = "memcpy"
        kind_ids = {proc.kind_name(i): i for i in range(len(proc.kinds))}
        mc = kind_ids.get("MEMORY_COPY")
        cols["name"] = pa.array([proc.op_name(mc, op) or "MEMORY_COPY" for op in c["op"]], pa.string())
        to_host = np.array(["DEVICE_TO_HOST" in (proc.op_name(mc, op) or "") for op in c["op"]], dtype=bool)
        gpu_side = np.where(
            to_host,
            np.array([x if x is not None else -1 for x in c["src"]], np.int64),
            np.array([x if x is not None else -1 for x in c["dst"]], np.int64),
        )
        cols["device"] = agents.map_handles(gpu_side)
        cols["bytes"] = pa.array(c["bytes"], pa.int64())
    tid = cols["tid"]
    pid = pa.array([proc.pid] * n, pa.int64())
    if proc.launches is not None and len(proc.launches):
        launch = proc.launches.columns(corr, off)
        cols["launch_start_ns"] = launch["launch_start_ns"]
        cols["launch_end_ns"] = launch["launch_end_ns"]
        cols["launch_name"] = launch["launch_name"]
        tid = pc.coalesce(launch["launch_tid"], tid)
    cols["pid"] = pid
    cols["tid"] = tid
    return stamp_kernels(cols, n, ctx, kind)


def parse_rocprofv3_json(path: Path, ctx: TraceContext) -> Iterator[ParsedTrace]:
    """Stream a rocprofv3 JSON file as ``ParsedTrace`` chunks (iterations and devices on the first)."""
    meta = _read_metadata(path)
    iterations = _iterations(meta, ctx)
    pids = tuple(sorted({p.pid for p in meta.processes.values() if p.pid is not None}))
    skipped: Counter[str] = Counter(meta.skipped)
    bad: list[BadRow] = list(meta.bad_rows)
    first = True

    def devices() -> dict[str, dict[str, Any]]:
        d: dict[str, dict[str, Any]] = {}
        for proc in meta.processes.values():
            if proc.agent_map is not None:
                d.update(proc.agent_map.used)
        return d

    def emit(batch: _Batch | None) -> Iterator[ParsedTrace]:
        nonlocal first
        if batch is None or not batch.n:
            return
        table = _table(batch, meta.proc(batch.process), ctx, skipped)
        its = iterations if first else iterations.slice(0, 0)
        first = False
        yield ParsedTrace(FORMAT, table, its, ctx.clock, Counter(skipped), pids, devices(), list(bad))
        skipped.clear()
        bad.clear()

    batch: _Batch | None = None
    walker = _Walker(SECTIONS_GPU, {})
    with _open(path) as fh:
        try:
            for p, section, v in walker.walk(fh):
                s, e = _num(v.get("start")), _num(v.get("end"))
                if s is None or e is None:
                    skipped["missing_value"] += 1
                    continue
                if s < 0 or e < s or e > MAX_TIME_NS:
                    skipped["bad_time"] += 1
                    continue
                if batch is None or batch.process != p or batch.section != section:
                    yield from emit(batch)
                    batch = _Batch(p, section)
                batch.add(v)
                if batch.n >= CHUNK_ROWS:
                    yield from emit(batch)
                    batch = None
        except (ijson.JSONError, ValueError, EOFError, OSError) as exc:
            skipped["truncated_json"] += 1
            bad.append(BadRow(_position(fh), str(exc).encode("utf-8", "replace")[:200], "truncated_json"))
    yield from emit(batch)
    if first or skipped or bad:  # nothing at all, or problems after the last chunk: still say so
        its = iterations if first else iterations.slice(0, 0)
        yield ParsedTrace(FORMAT, empty_kernels(ctx), its, ctx.clock, Counter(skipped), pids, devices(), bad)


def _position(fh: IO[bytes]) -> int:
    try:
        return int(fh.tell())
    except (OSError, ValueError):
        return -1
