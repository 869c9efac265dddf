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

First, a file of the documented shape and at most 256 MiB is read whole by the fast path
(``rocprofv3_json_fast``: its record arrays by Arrow's JSON reader, at about 0.6-0.9x a bare
``orjson.loads`` and under a third of its memory); what follows is the streaming path, which reads
every other file and gives the same rows.

Why streaming, and how: these files reach tens to hundreds of MB (one object per dispatch, about
700 bytes each, indented), and a whole-file object tree costs ~10x the file in memory. ``ijson``
with its yajl2 C backend parses incrementally (``ijson.parse`` events); two passes over the file:

1. the small parts and the host-side records, whatever their order in the file: processes,
   agents, kernel symbols, strings, HIP launches (compact numpy arrays by correlation id, for the
   join) and rocTX ranges (iterations: ``tables.iteration_ranges`` says which);
2. ``kernel_dispatch`` and ``memory_copy`` records, turned into columns and yielded as
   ``ParsedTrace`` chunks of at most ``CHUNK_ROWS`` rows (iterations on the first), so memory
   stays flat in the number of dispatches.

Only leaf values at known paths are kept (a dict lookup per event), never a record's subtree. A
record without a start or end, with end before start, or with an unknown kernel id is counted
in ``skipped``; a file cut short yields everything before the cut and counts ``truncated_json``
(``json_too_deep`` where it nests deeper than ``max_json_depth``: the records before are kept).
Timestamps are CLOCK_BOOTTIME ns, converted with ``TraceContext.clock``. Pass 1 lives in
``rocprofv3_json_meta``.

Numbers in full (``u64``): ijson runs without ``use_float``, so integers of any size
come as Python ints and other numbers as ``Decimal`` (``1e999`` included), behind a
``NumberGuard`` that defuses the few numbers ijson's C backend cannot convert without crashing.
Handles, ids and timestamps are unsigned 64-bit: agents map to devices and dispatches join their
HIP launches on the unsigned values (numpy ``uint64``); the ``int64`` columns of ``kernels``
(``correlation_id``, ``queue_id``, ``stream``, ``tid``, grid and workgroup sizes, ``bytes``)
hold a value at or above 2^63 as the int64 with the same 64 bits (``value - 2^64``), so equal
ids stay equal. A record with a field it needs beyond 64 bits is counted ``int_out_of_range``,
one whose times convert outside 1990..2100 ``time_out_of_range`` (``bad_time``: negative, or
end before start); fields nothing reads (``hive_id``, code objects, anything unknown) never lose
a record or the file, whatever they hold.

The first chunk carries ``model``, from the first process's ``metadata.command`` (the argv
rocprofiler-sdk reads from ``/proc/<pid>/cmdline``, see ``model_names.model_from_command``: the
script of an interpreter or launcher, else the program's base name), and ``anchor_raw_ns``: the
largest ``metadata.fini_time`` (the tool's finalisation, raw clock), else the last end among the
host API records (pass 1 has them; the GPU records come in pass 2, after the first chunk).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.context import BadRow, TraceContext
from aaco.agent.sources.traces.devices import AgentMap
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.format import TraceFormat
from aaco.agent.sources.traces.limits import TraceLimits, open_trace
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.rocprofv3_json_fast import Prepared, prepare
from aaco.agent.sources.traces.rocprofv3_json_meta import (
    PARSE_ERRORS,
    Metadata,
    Process,
    Walker,
    iterations,
    read_metadata,
)
from aaco.agent.sources.traces.tables import CHUNK_ROWS, empty_kernels, stamp_kernels
from aaco.agent.sources.traces.u64 import (
    OUT_OF_RANGE,
    U64_MASK,
    NumberGuard,
    TimeWindow,
    as_int,
    int64_column,
    u64,
    u64_array,
    u64_values,
)

FORMAT = "rocprofv3_json"

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
SECTION_KERNELS = "buffer_records.kernel_dispatch"
SECTION_COPIES = "buffer_records.memory_copy"
SECTIONS_GPU: dict[str, dict[str, str]] = {
    SECTION_KERNELS: _DISPATCH,
    SECTION_COPIES: {
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
# The fields each section's rows need (besides start and end), all unsigned 64-bit.
_DIMS = ("wg_x", "wg_y", "wg_z", "grid_x", "grid_y", "grid_z")
FIELDS = {
    SECTION_KERNELS: ("corr", "tid", "stream", "agent", "queue", "kernel_id", *_DIMS),
    SECTION_COPIES: ("corr", "tid", "stream", "op", "src", "dst", "bytes"),
}


class _Batch:
    """Columns of GPU records of one process and section, as Python lists until flushed."""

    def __init__(self, process: int, section: str) -> None:
        self.process = process
        self.section = section
        self.keys = FIELDS[section]
        self.start: list[int] = []  # epoch ns
        self.end: list[int] = []
        self.cols: dict[str, list[Any]] = {k: [] for k in self.keys}
        self.n = 0

    @classmethod
    def of_columns(cls, section: str, cols: dict[str, list[Any]], start: list[int], end: list[int]) -> _Batch:
        """A batch of the first process from whole columns (the fast path's; values already unsigned 64-bit)."""
        batch = cls(0, section)
        batch.cols = {k: cols[k] for k in batch.keys}
        batch.start, batch.end, batch.n = start, end, len(start)
        return batch

    def add(self, v: dict[str, Any], start_ns: int, end_ns: int) -> bool:
        """Add a record; False (nothing added) when a field it needs does not fit 64 bits."""
        row = [x if (type(x) is int and 0 <= x <= U64_MASK) or x is None else u64(x) for x in map(v.get, self.keys)]
        if OUT_OF_RANGE in row:
            return False
        for col, x in zip(self.cols.values(), row, strict=True):
            col.append(x)
        self.start.append(start_ns)
        self.end.append(end_ns)
        self.n += 1
        return True


def _table(batch: _Batch, proc: Process, ctx: TraceContext, skipped: Counter[str]) -> pa.Table:
    c = batch.cols
    n = batch.n
    off = ctx.clock.offset_ns
    corr, corr_ok = u64_array(c["corr"])
    agents = proc.agent_map or AgentMap()
    cols: dict[str, Any] = {
        "start_ns": pa.array(np.array(batch.start, dtype=np.int64), pa.int64()),
        "end_ns": pa.array(np.array(batch.end, dtype=np.int64), pa.int64()),
        "correlation_id": pa.array(corr.view(np.int64), pa.int64(), mask=None if corr_ok is None else ~corr_ok),
        "stream": int64_column(c["stream"]),
    }
    tid = int64_column(c["tid"])
    if batch.section == SECTION_KERNELS:
        kind: str = "kernel"
        symbols = proc.symbols
        unknown = sum(1 for k in c["kernel_id"] if k not in symbols)
        if unknown:
            skipped["unknown_kernel_id"] += unknown  # kept, named by id: the event itself is sound
        cols["name"] = pa.array(
            [symbols.get(k, f"kernel_id:{k}") if k is not None else "unknown" for k in c["kernel_id"]], pa.string()
        )
        cols["device"] = agents.map_handles(*u64_array(c["agent"]))
        cols["queue_id"] = int64_column(c["queue"])
        for axis in "xyz":
            cols[f"grid_{axis}"] = int64_column(c[f"grid_{axis}"])
            cols[f"workgroup_{axis}"] = int64_column(c[f"wg_{axis}"])
    else:
        kind = "memcpy"
        kind_ids = {proc.kind_name(i): i for i in range(len(proc.kinds))}
        mc = kind_ids.get("MEMORY_COPY")
        ops = [proc.op_name(mc, op) for op in c["op"]]
        cols["name"] = pa.array([name or "MEMORY_COPY" for name in ops], pa.string())
        to_host = np.array(["DEVICE_TO_HOST" in (name or "") for name in ops], dtype=bool)
        src, src_ok = u64_array(c["src"])
        dst, dst_ok = u64_array(c["dst"])
        ok = None if src_ok is None and dst_ok is None else np.where(to_host, _ones(src_ok, n), _ones(dst_ok, n))
        cols["device"] = agents.map_handles(np.where(to_host, src, dst), ok)
        cols["bytes"] = int64_column(c["bytes"])
    if proc.launches is not None and len(proc.launches):
        launch = proc.launches.columns(corr, off, corr_ok)
        cols["launch_start_ns"] = launch["launch_start_ns"]
        cols["launch_end_ns"] = launch["launch_end_ns"]
        cols["launch_name"] = launch["launch_name"]
        tid = pc.coalesce(launch["launch_tid"], tid)
    cols["pid"] = pa.array([proc.pid] * n, pa.int64())
    cols["tid"] = tid
    return stamp_kernels(cols, n, ctx, kind)


def _ones(mask: np.ndarray | None, n: int) -> np.ndarray:
    return np.ones(n, dtype=bool) if mask is None else mask


def parse_rocprofv3_json(path: Path, ctx: TraceContext, *, limits: TraceLimits | None = None) -> Iterator[ParsedTrace]:
    """Stream a rocprofv3 JSON file as ``ParsedTrace`` chunks (iterations, devices, model, anchor on the first).

    Both passes read within ``limits`` (``TraceLimits``; None: the defaults): a file or content past
    ``max_file_bytes`` or a gzip bomb raises ``TraceLimitError``; nesting past ``max_json_depth`` ends
    the records there, counted ``json_too_deep``.
    """
    limits = limits or TraceLimits()
    fast = prepare(path, ctx, limits)
    if fast is not None:
        yield from _fast_chunks(fast, ctx)
        return
    out = _Chunks(read_metadata(path, ctx, limits), ctx)
    batch: _Batch | None = None
    window = TimeWindow(ctx.clock.offset_ns)
    off = ctx.clock.offset_ns
    with open_trace(path, limits) as raw:
        fh = NumberGuard(raw)
        try:
            for p, section, v in Walker(SECTIONS_GPU, {}).walk(fh):
                s, e = as_int(v.get("start")), as_int(v.get("end"))
                reason = window.reason(s, e)
                if reason is not None:
                    out.skipped[reason] += 1
                    continue
                if batch is None or batch.process != p or batch.section != section:
                    yield from out.emit(batch)
                    batch = _Batch(p, section)
                if not batch.add(v, s + off, e + off):  # type: ignore[operator]
                    out.skipped["int_out_of_range"] += 1
                    continue
                if batch.n >= CHUNK_ROWS:
                    yield from out.emit(batch)
                    batch = None
        except PARSE_ERRORS as exc:
            reason = getattr(exc, "reason", "truncated_json")  # a depth refusal names itself (json_too_deep)
            out.skipped[reason] += 1
            out.bad.append(BadRow(_position(fh), str(exc).encode("utf-8", "replace")[:200], reason))
    yield from out.emit(batch)
    if out.first or out.skipped or out.bad:  # nothing at all, or problems after the last chunk: still say so
        yield out.part(empty_kernels(ctx))


def _fast_chunks(fast: Prepared, ctx: TraceContext) -> Iterator[ParsedTrace]:
    """The fast path's columns as chunks, each record kept or skipped as ``parse_rocprofv3_json`` does."""
    out = _Chunks(fast.meta, ctx)
    window = TimeWindow(ctx.clock.offset_ns)
    off = ctx.clock.offset_ns
    for name, cols in fast.arrays:
        section = f"buffer_records.{name}"
        paths = SECTIONS_GPU[section]
        # dispatch_info's fields where both places are read (the fast path left no record with the other)
        ordered = sorted(cols.items(), key=lambda kv: kv[0].startswith("dispatch_info."))
        fields = {paths[c]: v for c, v in ordered}
        (start, start_given), (end, end_given) = u64_values(fields["start"]), u64_values(fields["end"])
        keep, why = window.keep(start, end, start_given & end_given)
        out.skipped.update(why)
        mask = pa.array(keep)
        kept = {k: v.filter(mask) for k, v in fields.items()}
        for at in range(0, len(kept["start"]), CHUNK_ROWS):  # Python values one chunk at a time
            part = {k: v.slice(at, CHUNK_ROWS).to_pylist() for k, v in kept.items()}
            starts = [s + off for s in part["start"]]
            ends = [e + off for e in part["end"]]
            yield from out.emit(_Batch.of_columns(section, part, starts, ends))
    if out.first or out.skipped:
        yield out.part(empty_kernels(ctx))


class _Chunks:
    """Turns batches into chunks: iterations, model and anchor on the first, problems since the last on each."""

    def __init__(self, meta: Metadata, ctx: TraceContext) -> None:
        self.meta, self.ctx = meta, ctx
        self.iterations = iterations(meta, ctx)
        self.pids = tuple(sorted({p.pid for p in meta.processes.values() if p.pid is not None}))
        self.skipped: Counter[str] = Counter(meta.skipped)
        self.bad: list[BadRow] = []
        self.first = True

    def devices(self) -> dict[str, dict[str, Any]]:
        """The devices the kernels so far ran on, by every process's agent map."""
        d: dict[str, dict[str, Any]] = {}
        for proc in self.meta.processes.values():
            if proc.agent_map is not None:
                d.update(proc.agent_map.used)
        return d

    def part(self, kernels: pa.Table) -> ParsedTrace:
        """A chunk of ``kernels``, taking the counts and bad rows gathered since the last one."""
        its = self.iterations if self.first else self.iterations.slice(0, 0)
        out = ParsedTrace(FORMAT, kernels, its, self.ctx.clock)
        out.skipped, out.pids, out.devices, out.bad_rows = (
            Counter(self.skipped),
            self.pids,
            self.devices(),
            list(self.bad),
        )
        if self.first:
            out.model, out.anchor_raw_ns = self.meta.model, self.meta.anchor_raw_ns
        self.first = False
        self.skipped.clear()
        self.bad.clear()
        return out

    def emit(self, batch: _Batch | None) -> Iterator[ParsedTrace]:
        """The chunk of a batch that holds rows (nothing for an empty one)."""
        if batch is not None and batch.n:
            yield self.part(_table(batch, self.meta.proc(batch.process), self.ctx, self.skipped))


def _position(fh: NumberGuard | IO[bytes]) -> int:
    try:
        return int(fh.tell())
    except (OSError, ValueError):
        return -1


# rocprofv3 --output-format json: {"rocprofiler-sdk-tool": [...]} (or an object in some releases).
_HEAD = re.compile(rb'^\{\s*"rocprofiler-sdk-tool"\s*:\s*[\[{]')


def sniff(head: bytes) -> str | None:
    """``rocprofv3_json`` for a JSON object that opens with ``rocprofiler-sdk-tool``."""
    return FORMAT if _HEAD.match(head.lstrip()) else None


def parse_file(tf: TraceFile, ctx: TraceContext, limits: TraceLimits) -> Iterator[ParsedTrace]:
    """A rocprofv3 JSON file, streamed (``parse_rocprofv3_json``)."""
    return parse_rocprofv3_json(tf.path, ctx, limits=limits)


TRACE_FORMAT = TraceFormat((FORMAT,), sniff, parse_file, boottime=True)
