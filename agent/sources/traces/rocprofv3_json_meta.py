"""rocprofv3 JSON, first pass: the event walker, and what the file says besides its GPU records.

``_Walker`` routes ``ijson.parse`` events of the wanted sections to per-item dicts of leaf values
(see ``rocprofv3_json`` for the layout and why streaming). ``read_metadata`` runs it once over the
small parts and the host-side records: processes (``metadata.pid``, ``command``, ``fini_time``),
agents, kernel symbols, strings, HIP launches (packed into a ``LaunchTable`` per process) and
rocTX ranges. Numbers are read in full (``u64``).
"""

from __future__ import annotations

import zlib
from array import array
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import ijson
import numpy as np
import pyarrow as pa

from aaco.agent.sources.traces.context import MAX_NAME_BYTES, TraceContext
from aaco.agent.sources.traces.devices import Agent, AgentMap
from aaco.agent.sources.traces.launches import LaunchTable
from aaco.agent.sources.traces.limits import TraceLimits, open_trace
from aaco.agent.sources.traces.model_names import model_from_command
from aaco.agent.sources.traces.rocprofv3_csv import MARKER_RANGE_DOMAINS
from aaco.agent.sources.traces.tables import const, empty_iterations, iterations_table
from aaco.agent.sources.traces.u64 import (
    INT64_MIN,
    OUT_OF_RANGE,
    U64_MASK,
    NumberGuard,
    TimeWindow,
    as_int,
    signed,
    u64,
    u64_values,
)

ROOTS = ("rocprofiler-sdk-tool.item", "rocprofiler-sdk-tool")
_LIST = "[]"  # marks a field collected as a list
_SCALAR_EVENTS = frozenset({"string", "number", "boolean", "null"})
MAX_ARGV = 256  # command-line words kept from metadata.command
MAX_ARG_CHARS = 4096
# What a damaged or cut file raises from ijson or the decompressor (never a crash: see NumberGuard).
PARSE_ERRORS = (ijson.JSONError, ValueError, ArithmeticError, EOFError, OSError, zlib.error)
_INT63 = (1 << 63) - 1

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
SCALARS_META = {
    "metadata.pid": "pid",
    "metadata.fini_time": "fini",
    "metadata.command": "command",  # a string in some writers
    "metadata.command.item": "argv",  # the argv list rocprofiler-sdk writes
}


class Walker:
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

    def walk(self, fh: IO[bytes] | NumberGuard) -> Iterator[tuple[int, str, Any]]:
        """Feed ``fh`` through (behind a ``NumberGuard``), yielding ``(process, section, values)`` per finished item.

        Wanted scalars outside the arrays come as ``(process, "=" + name, value)``.
        """
        process = -1
        current: dict[str, Any] | None = None
        items, fields, scalars = self.items, self.fields, self.scalars
        stream = fh if isinstance(fh, NumberGuard) else NumberGuard(fh)
        for prefix, event, value in ijson.parse(stream):
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
            elif prefix in scalars and event in _SCALAR_EVENTS:
                yield max(process, 0), "=" + scalars[prefix], value


def small(v: Any) -> int | None:
    """A non-negative int that fits int64 (pid, node index, kind index), else None."""
    x = as_int(v)
    return x if isinstance(x, int) and 0 <= x <= _INT63 else None


def handle(v: Any) -> int | None:
    """An unsigned 64-bit handle or id, else None (absent, not a number, beyond 64 bits)."""
    x = u64(v)
    return None if x is OUT_OF_RANGE else x  # type: ignore[return-value]


@dataclass
class Process:
    """One process of the file: what pass 1 found, then its agent map and launches."""

    pid: int | None = None
    argv: list[str] = field(default_factory=list)
    fini: int | None = None
    agents: list[Agent] = field(default_factory=list)
    symbols: dict[int, str] = field(default_factory=dict)
    kinds: list[tuple[str, list[str]]] = field(default_factory=list)
    messages: dict[int, str] = field(default_factory=dict)
    # HIP calls, one per launch: as many as dispatches, so packed (8 bytes a value, not a tuple each):
    # corr (int64 of its 64 bits), start, end (raw, in the time window), tid, kind, op (INT64_MIN: none)
    hip: array = field(default_factory=lambda: array("q"))
    markers: list[tuple[int, int, int, int | None, int, int]] = field(default_factory=list)
    last_end: int | None = None
    agent_map: AgentMap | None = None
    launches: LaunchTable | None = None

    def kind_name(self, kind: int | None) -> str | None:
        """The name of a record kind index (``strings.buffer_records``)."""
        if kind is None or not 0 <= kind < len(self.kinds):
            return None
        return self.kinds[kind][0]

    def op_name(self, kind: int | None, op: int | None) -> str | None:
        """The name of an operation index of a record kind."""
        if kind is None or op is None or not 0 <= kind < len(self.kinds):
            return None
        ops = self.kinds[kind][1]
        return ops[op] if 0 <= op < len(ops) and isinstance(ops[op], str) else None


@dataclass
class Metadata:
    """Pass 1's result: processes by index, what was skipped, the model and the raw anchor."""

    processes: dict[int, Process] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)
    model: str | None = None
    anchor_raw_ns: int | None = None

    def proc(self, i: int) -> Process:
        """The process of index ``i`` (created on first use)."""
        return self.processes.setdefault(i, Process())


def _agent(values: dict[str, Any]) -> Agent | None:
    h = handle(values.get("handle"))
    if h is None:
        return None
    t = values.get("type")
    kind = {1: "CPU", 2: "GPU"}.get(t, str(t).upper() if isinstance(t, str) else "UNK")  # type: ignore[arg-type]
    name, product = values.get("name"), values.get("product_name")
    return Agent(
        small(values.get("node_id")),
        small(values.get("logical_node_id")),
        kind,
        small(values.get("type_index")),
        name if isinstance(name, str) else None,
        product if isinstance(product, str) else None,
        h,
    )


def _opt(v: Any) -> int:
    """An id packed into an int64 slot: its 64 bits, or INT64_MIN when absent or beyond 64 bits."""
    if type(v) is int and 0 <= v <= _INT63:
        return v
    x = handle(v)
    return INT64_MIN if x is None else signed(x)


class _Reader:
    """The callbacks of pass 1."""

    def __init__(self, meta: Metadata, window: TimeWindow) -> None:
        self.meta = meta
        self.window = window

    def on_item(self, p: int, section: str, v: Any) -> None:
        proc = self.meta.proc(p)
        if section.startswith("="):
            self.on_scalar(proc, section[1:], v)
        elif section == "agents":
            a = _agent(v)
            if a is not None:
                proc.agents.append(a)
        elif section == "kernel_symbols":
            kid = handle(v.get("kernel_id"))
            names = [v.get(k) for k in ("formatted", "demangled", "truncated", "mangled")]
            name = next((s for s in names if isinstance(s, str) and s), None)
            if kid is not None and name is not None:
                proc.symbols[kid] = name
        elif section == "strings.buffer_records":
            ops = v.get("operations" + _LIST) or []
            proc.kinds.append((str(v.get("kind", "")), [o if isinstance(o, str) else "" for o in ops]))
        elif section == "strings.marker_api":
            key, value = handle(v.get("key")), v.get("value")
            if key is not None and isinstance(value, str):
                proc.messages[key] = value
        else:
            self.on_host_record(proc, section, v)

    def on_scalar(self, proc: Process, name: str, v: Any) -> None:
        if name == "pid":
            proc.pid = small(v)
        elif name == "fini":
            proc.fini = small(v)
        elif name == "command" and isinstance(v, str):
            proc.argv = v[:MAX_ARG_CHARS].split()[:MAX_ARGV]
        elif name == "argv" and isinstance(v, str) and len(proc.argv) < MAX_ARGV:
            proc.argv.append(v[:MAX_ARG_CHARS])

    def on_host_record(self, proc: Process, section: str, v: dict[str, Any]) -> None:
        corr = v.get("corr")
        if not (type(corr) is int and 0 <= corr <= U64_MASK):
            corr = handle(corr)
        start, end = as_int(v.get("start")), as_int(v.get("end"))
        if corr is None or start is None or end is None:
            self.meta.skipped["bad_record"] += 1
            return
        reason = self.window.reason(start, end)
        if reason is not None:
            self.meta.skipped[reason] += 1
            return
        assert isinstance(start, int) and isinstance(end, int)
        proc.last_end = end if proc.last_end is None else max(proc.last_end, end)
        tid, kind, op = _opt(v.get("tid")), _opt(v.get("kind")), _opt(v.get("op"))
        if section == "buffer_records.hip_api":
            proc.hip.extend((signed(corr), start, end, tid, kind, op))
        else:
            proc.markers.append((corr, start, end, None if tid == INT64_MIN else tid, kind, op))


def read_metadata(path: Path, ctx: TraceContext, limits: TraceLimits | None = None) -> Metadata:
    """Pass 1 over the file within ``limits`` (see the module doc); a damaged file gives what came before it."""
    with open_trace(path, limits or TraceLimits()) as fh:
        return metadata_of(fh, ctx)


def metadata_of(fh: IO[bytes], ctx: TraceContext, host: Mapping[str, pa.ChunkedArray] | None = None) -> Metadata:
    """Pass 1 over an open document, then ``host``: the ``hip_api`` records of its first process as columns.

    (``host`` is the fast path's, which reads that array apart: ``rocprofv3_json_fast``.)
    """
    meta = Metadata()
    reader = _Reader(meta, TimeWindow(ctx.clock.offset_ns))
    walker = Walker({**SECTIONS_META, **SECTIONS_HOST}, SCALARS_META)
    try:
        for p, section, v in walker.walk(fh):
            reader.on_item(p, section, v)
    except PARSE_ERRORS:
        pass  # counted by the second pass, which stops at the same place
    if host is not None:
        _hip_columns(meta, reader.window, host)
    for _, proc in sorted(meta.processes.items()):
        proc.agent_map = AgentMap(AgentMap.with_type_indexes(proc.agents))
        if proc.hip:
            proc.launches = _launches(proc)
            proc.hip = array("q")
        if meta.model is None:
            meta.model = model_from_command(proc.argv)
    finis = [p.fini for p in meta.processes.values() if p.fini]
    ends = [p.last_end for p in meta.processes.values() if p.last_end is not None]
    meta.anchor_raw_ns = max(finis) if finis else (max(ends) if ends else None)
    return meta


def _hip_columns(meta: Metadata, window: TimeWindow, cols: Mapping[str, pa.ChunkedArray]) -> None:
    """``on_host_record`` for whole columns of unsigned 64-bit values (null where a record lacks one)."""
    proc = meta.proc(0)
    names = ("correlation_id.internal", "start_timestamp", "end_timestamp", "thread_id", "kind", "operation")
    values, given = zip(*(u64_values(cols[n]) for n in names), strict=True)
    whole = given[0] & given[1] & given[2]  # a correlation id and both times, else a bad record
    meta.skipped["bad_record"] += int((~whole).sum())
    keep, why = window.keep(values[1][whole], values[2][whole], np.ones(int(whole.sum()), dtype=bool))
    meta.skipped.update(why)
    if not keep.any():
        return
    rows = np.column_stack([v.view(np.int64)[whole][keep] for v in values])  # _opt: the value's 64 bits ...
    for j, present in enumerate(given[3:], start=3):
        rows[~present[whole][keep], j] = INT64_MIN  # ... INT64_MIN where absent
    last = int(rows[:, 2].max())
    proc.last_end = last if proc.last_end is None else max(proc.last_end, last)
    proc.hip.frombytes(np.ascontiguousarray(rows).tobytes())


def _launches(proc: Process) -> LaunchTable:
    h = np.frombuffer(proc.hip, dtype=np.int64).reshape(-1, 6)
    pairs, inverse = np.unique(h[:, 4:6], axis=0, return_inverse=True)  # few (kind, operation) pairs
    names = [proc.op_name(int(k), int(o)) or "hip_api" for k, o in pairs]
    name_idx = np.asarray(inverse, dtype=np.int32).reshape(-1)
    tid = pa.array(h[:, 3], pa.int64(), mask=h[:, 3] == INT64_MIN)
    pid = const(proc.pid, len(h), pa.int64())
    return LaunchTable.build(h[:, 0].view(np.uint64), h[:, 1], h[:, 2], pid, tid, name_idx, names)


def iterations(meta: Metadata, ctx: TraceContext) -> pa.Table:
    """The rocTX ranges of every process, as iterations (marks, start == end, are not ranges)."""
    off = ctx.clock.offset_ns
    starts, ends, pids, tids, names, keys = [], [], [], [], [], []
    for p, proc in sorted(meta.processes.items()):
        for corr, start, end, tid, kind, op in proc.markers:
            kname = proc.kind_name(kind)
            if end <= start or (kname is not None and kname not in MARKER_RANGE_DOMAINS):
                continue
            name = proc.messages.get(corr) or proc.op_name(kind, op) or "roctx"
            starts.append(start + off)
            ends.append(end + off)
            pids.append(proc.pid)
            tids.append(tid)
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
