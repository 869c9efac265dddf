"""rocprofv3 CSV output (``--output-format csv``): kernel and memory-copy traces, API traces, agents.

rocprofv3 writes one file per domain, named ``<prefix>_<domain>.csv`` (the prefix is the pid by
default). Columns are read by name, so every layout below is one code path. The layouts come from
the rocprofiler-sdk sources and documentation (repository ROCm/rocprofiler-sdk): the writer
``source/lib/output/generateCSV.cpp`` and the examples in ``source/docs/how-to/using-rocprofv3.rst``
and ``source/docs/data/*.csv``:

- ``kernel_trace.csv``, current 22-column layout (``generateCSV.cpp``; sample
  ``source/docs/data/kernel_trace.csv``): ``Kind, Agent_Id, Queue_Id, Stream_Id, Thread_Id,
  Dispatch_Id, Kernel_Id, Kernel_Name, Correlation_Id, Start_Timestamp, End_Timestamp,
  LDS_Block_Size, Scratch_Size, VGPR_Count, Accum_VGPR_Count, SGPR_Count, Workgroup_Size_X/Y/Z,
  Grid_Size_X/Y/Z``; ``Agent_Id`` is ``Agent <node index>`` (or ``GPU <n>`` with
  ``--agent-index type-relative``).
- ``kernel_trace.csv``, older layouts (ROCm 6.2-6.4, as printed in the rocprofv3 guide of those
  releases): 18 columns ``Kind, Agent_Id, Queue_Id, Thread_Id, Dispatch_Id, Kernel_Id,
  Kernel_Name, Correlation_Id, Start_Timestamp, End_Timestamp, Private_Segment_Size,
  Group_Segment_Size, Workgroup_Size_X/Y/Z, Grid_Size_X/Y/Z`` (19 with ``Stream_Id``; 16 in the
  first release, without ``Thread_Id`` and ``Dispatch_Id``), ``Agent_Id`` a bare node id.
- ``memory_copy_trace.csv``: ``Kind, Direction, Stream_Id, Source_Agent_Id,
  Destination_Agent_Id, Correlation_Id, Start_Timestamp, End_Timestamp`` (``Direction`` e.g.
  ``MEMORY_COPY_HOST_TO_DEVICE``). Each copy becomes a ``kernels`` row of kind ``memcpy`` named by
  its direction, on the GPU side of the copy.
- ``hip_api_trace.csv`` and ``marker_api_trace.csv`` (and HSA, RCCL): ``Domain, Function,
  Process_Id, Thread_Id, Correlation_Id, Start_Timestamp, End_Timestamp``. HIP calls are the
  launches of the GPU work with the same ``Correlation_Id`` (``launch_start_ns``,
  ``launch_end_ns``, ``launch_name``, and the kernel's pid and tid are the launching thread's).
  Marker rows of ``MARKER_CORE_API`` / ``MARKER_CORE_RANGE_API`` with ``End > Start`` are rocTX
  ranges (``roctxRangePush/Pop``, ``roctxRangeStart/Stop``): they become iterations named by the
  message (the outermost of each thread, or the ones ``iteration_ranges`` names:
  ``tables.iteration_ranges``); instant marks (``roctxMarkA``, start == end) and control calls are
  not iterations.
- ``agent_info.csv``: ``Node_Id, Logical_Node_Id, Agent_Type, ..., Name, Vendor_Name,
  Product_Name, Model_Name`` (53 columns, ``generateCSV.cpp``): maps agents to GPU ordinals and
  names (see ``traces``).

Each file is parsed on its own (kernel and copy traces into kernels, marker traces into
iterations); HIP API and agent files are companions, read when a kernel or copy trace beside them
with the same prefix is parsed. So a spool directory replayed or tailed file by file yields every
event once. Timestamps are CLOCK_BOOTTIME ns, converted with ``TraceContext.clock``.

``Rocprofv3CsvDecoder`` decodes chunks of complete lines (the tail reader's unit) with
``csv_rows.CsvRowReader``: vectorised, bad rows reported with their byte offset. Constants and the
header parser are in ``rocprofv3_csv_layout``, API traces and agents in ``rocprofv3_csv_api``.

Numbers in full (``u64``): the integer columns are read as ``int64`` and widened to
``uint64`` (or ``decimal128``) only in a reader that meets a value past int64 (``csv_rows``), so
the usual file keeps pyarrow's fastest path. Ids, handles and timestamps are unsigned 64-bit:
correlation ids join their launches as ``uint64``; the ``int64`` columns of ``kernels``
(``correlation_id``, ``queue_id``, ``stream``, ``tid``, sizes) hold a value at or above 2^63 as
the int64 with the same 64 bits. A row whose needed integer does not fit 64 bits is counted
``int_out_of_range``; one whose times convert outside 1990..2100 ``time_out_of_range``
(``bad_time``: negative, or end before start). Columns no row needs (``Kernel_Id``,
``Dispatch_Id``, register counts) are never converted. The CSVs carry no command line:
``model`` stays None; ``anchor_raw_ns`` (first chunk) is the largest raw end among the last
complete lines of an uncompressed file (one read of its last ``TAIL_BYTES``), None for gzip.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.context import MAX_NAME_BYTES, BadRow, TraceContext
from aaco.agent.sources.traces.csv_rows import CsvRowReader
from aaco.agent.sources.traces.devices import AgentMap
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.format import TraceFormat
from aaco.agent.sources.traces.launches import LaunchTable
from aaco.agent.sources.traces.limits import DEFAULT_MAX_BYTES, GZIP_MAGIC, TraceLimits, open_trace
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.rocprofv3_csv_api import (
    ApiTrace,
    CsvCompanions,
    api_iterations,
    load_companions,
    read_agent_info,
    read_api_trace,
    reject_in_order,
    time_checks,
)
from aaco.agent.sources.traces.rocprofv3_csv_layout import (
    DICT,
    FORMAT_AGENTS,
    FORMAT_API,
    FORMAT_KERNEL,
    FORMAT_MEMCPY,
    FORMATS,
    I64,
    INT_COLUMNS,
    LAUNCH_DOMAIN_PREFIX,
    MARKER_RANGE_DOMAINS,
    MAX_TIME_NS,
    REQUIRED,
    SUFFIXES,
    column_types,
    companions,
    parse_header,
    read_bytes,
    sniff_csv,
)
from aaco.agent.sources.traces.tables import chunks, empty_kernels, stamp_kernels
from aaco.agent.sources.traces.u64 import TimeWindow, U64Column

__all__ = [
    "DICT",
    "FORMATS",
    "FORMAT_AGENTS",
    "FORMAT_API",
    "FORMAT_KERNEL",
    "FORMAT_MEMCPY",
    "LAUNCH_DOMAIN_PREFIX",
    "MARKER_RANGE_DOMAINS",
    "MAX_TIME_NS",
    "REQUIRED",
    "SUFFIXES",
    "ApiTrace",
    "CsvCompanions",
    "DecodeResult",
    "Rocprofv3CsvDecoder",
    "api_iterations",
    "companions",
    "load_companions",
    "parse_csv_file",
    "parse_header",
    "read_agent_info",
    "read_api_trace",
    "sniff_csv",
]

READ_BLOCK = 8 << 20  # bytes of complete lines decoded at a time by parse_csv_file
TAIL_BYTES = 64 << 10  # read from the end of an uncompressed trace for its anchor
MAX_LINE_BYTES = 64 << 20  # a "line" this long without a newline is handed on as one bad row


# --- the incremental decoder ---------------------------------------------------------------------


@dataclass
class DecodeResult:
    """Kernels rows decoded from one chunk, what was skipped (by reason) and the bad rows themselves."""

    table: pa.Table
    skipped: Counter[str]
    bad_rows: list[BadRow]


class Rocprofv3CsvDecoder:
    """Decodes chunks of complete lines of a rocprofv3 kernel or memory-copy trace into ``kernels`` rows.

    ``header`` is the file's first line (a chunk starting with the file's first bytes also works).
    ``agents`` (from ``agent_info.csv``) turn agent labels into GPU ordinals; ``launches`` (from the
    HIP API trace) give each row its launch and the launching pid/tid; without them the pid is
    ``ctx.pid`` and the tid the trace's ``Thread_Id``. Rows come out in file order.
    """

    def __init__(
        self,
        header: bytes,
        ctx: TraceContext,
        agents: AgentMap | None = None,
        launches: LaunchTable | None = None,
    ) -> None:
        names = parse_header(header)
        fmt = sniff_csv(header) if names else None
        if fmt not in (FORMAT_KERNEL, FORMAT_MEMCPY) or names is None:
            raise ValueError(
                "not a rocprofv3 kernel or memory copy trace header (expected Kind, Agent_Id, Kernel_Name, "
                "Correlation_Id, Start_Timestamp, End_Timestamp, ... or Kind, Direction, Source_Agent_Id, ...)"
            )
        self.format = fmt
        self.names = names
        self.ctx = ctx
        self.window = TimeWindow(ctx.clock.offset_ns)
        self.agents = agents or AgentMap()
        self.launches = launches if launches is not None else LaunchTable.empty()
        types = column_types(names)
        self._ints = tuple(c for c in types if c in INT_COLUMNS)
        first = header.split(b"\n", 1)[0]
        kind_token = b"KERNEL_DISPATCH" if fmt == FORMAT_KERNEL else b"MEMORY_COPY"
        self._kind = kind_token.decode()
        self.reader = CsvRowReader(
            names, types, row_prefixes=(b'"' + kind_token + b'"', kind_token), header_line=first, widen=self._ints
        )

    @property
    def devices(self) -> dict[str, dict[str, Any]]:
        """The devices seen so far, with what ``agent_info.csv`` says about them."""
        return dict(self.agents.used)

    def decode(self, data: bytes, base_offset: int) -> DecodeResult:
        """Decode ``data`` (complete lines, no header needed) found at byte ``base_offset`` of the file."""
        chunk = self.reader.read(data, base_offset)
        t = chunk.table
        if t.num_rows:
            kind = t["Kind"].combine_chunks()
            chunk.reject(pc.invert(pc.equal(kind.cast(pa.string()), self._kind)), "bad_kind")
            t = chunk.table
        if not t.num_rows:
            return DecodeResult(empty_kernels(self.ctx), chunk.skipped, chunk.bad_rows)
        n = t.num_rows
        ints = {c: U64Column(t[c]) for c in self._ints}
        over = np.zeros(n, dtype=bool)
        for col in ints.values():
            over |= col.over
        checks = [("int_out_of_range", over)]
        checks += time_checks(ints["Start_Timestamp"], ints["End_Timestamp"], self.window)
        if self.format == FORMAT_KERNEL:
            too_long = pc.greater(pc.binary_length(t["Kernel_Name"]), MAX_NAME_BYTES)
            checks.append(("name_too_long", np.asarray(pc.fill_null(too_long, True).to_numpy(zero_copy_only=False))))
        alive = reject_in_order(chunk, checks)
        t = chunk.table
        if not t.num_rows:
            return DecodeResult(empty_kernels(self.ctx), chunk.skipped, chunk.bad_rows)
        keep = None if alive.all() else alive
        return DecodeResult(self._columns(t, ints, keep), chunk.skipped, chunk.bad_rows)

    def _columns(self, t: pa.Table, ints: dict[str, U64Column], keep: np.ndarray | None) -> pa.Table:
        n = t.num_rows
        off = self.ctx.clock.offset_ns

        def bits(c: str) -> np.ndarray:
            return ints[c].bits if keep is None else ints[c].bits[keep]

        corr = ints["Correlation_Id"]
        cols: dict[str, Any] = {
            "start_ns": pa.array(bits("Start_Timestamp") + off, I64),
            "end_ns": pa.array(bits("End_Timestamp") + off, I64),
            "correlation_id": corr.arrow(keep),
        }
        if self.format == FORMAT_KERNEL:
            cols["name"] = t["Kernel_Name"]
            cols["device"] = self.agents.map_labels(t["Agent_Id"])
            cols["queue_id"] = ints["Queue_Id"].arrow(keep)
            for axis in "xyz":
                for src, dst in (("Grid_Size", "grid"), ("Workgroup_Size", "workgroup")):
                    if f"{src}_{axis.upper()}" in ints:
                        cols[f"{dst}_{axis}"] = ints[f"{src}_{axis.upper()}"].arrow(keep)
            kind: str = "kernel"
        else:
            direction = t["Direction"].combine_chunks().cast(pa.string())
            cols["name"] = direction
            from_device = pc.match_substring(direction, "DEVICE_TO_HOST")
            src = self.agents.map_labels(t["Source_Agent_Id"])
            dst = self.agents.map_labels(t["Destination_Agent_Id"])
            cols["device"] = pc.if_else(from_device, src, dst)
            if "Size" in ints:
                cols["bytes"] = ints["Size"].arrow(keep)
            kind = "memcpy"
        if "Stream_Id" in ints:
            cols["stream"] = ints["Stream_Id"].arrow(keep)
        tid = ints["Thread_Id"].arrow(keep) if "Thread_Id" in ints else pa.nulls(n, I64)
        pid: Any = pa.repeat(pa.scalar(self.ctx.pid, I64), n) if self.ctx.pid is not None else pa.nulls(n, I64)
        if len(self.launches):
            valid = corr.valid if keep is None else corr.valid[keep]
            launch = self.launches.columns(corr.unsigned if keep is None else corr.unsigned[keep], off, valid)
            cols["launch_start_ns"] = launch["launch_start_ns"]
            cols["launch_end_ns"] = launch["launch_end_ns"]
            cols["launch_name"] = launch["launch_name"]
            pid = pc.coalesce(launch["launch_pid"], pid)
            tid = pc.coalesce(launch["launch_tid"], tid)
        cols["pid"] = pid
        cols["tid"] = tid
        return stamp_kernels(cols, n, self.ctx, kind)


# --- whole files ---------------------------------------------------------------------------------


def _ctx_with_pid(ctx: TraceContext, pid: int | None) -> TraceContext:
    if ctx.pid is not None or pid is None:
        return ctx
    return replace(ctx, pid=pid)


class _Cut:
    """Set when a compressed file ends before its end (the good lines before the cut are kept)."""

    truncated = False


def _blocks(path: Path, cut: _Cut, limits: TraceLimits, block: int = READ_BLOCK) -> Iterator[tuple[bytes, int]]:
    """(complete lines, offset) pieces of a file of at most about ``block`` bytes, read within ``limits``.

    Reads at most 1 MiB a step (``read1``), so a gzip stream cut short loses at most the step it ends in. A "line"
    longer than ``MAX_LINE_BYTES`` is handed on as it is (it will be a bad row), bounding memory.
    """
    offset = 0
    parts: list[bytes] = []  # joined once a block is full: appending to one bytes object would copy it each step
    size = 0
    with open_trace(path, limits, json_guard=False) as fh:
        while True:
            try:
                data = fh.read1(min(block, 1 << 20))  # one step at a time: a cut loses only its own step
            except (EOFError, OSError, zlib.error):
                cut.truncated = True
                break
            if not data:
                break
            parts.append(data)
            size += len(data)
            if size < block and size < MAX_LINE_BYTES:
                continue
            # the last newline, in the latest step that has one: the block is cut there as it is joined
            # (one copy of it; joining first and slicing the lines off would copy it twice)
            i = len(parts) - 1
            while i >= 0 and (nl := parts[i].rfind(b"\n")) < 0:
                i -= 1
            if i < 0 and size < MAX_LINE_BYTES:
                continue
            if i < 0:
                lines, parts = b"".join(parts), []
            else:
                lines = b"".join([*parts[:i], parts[i][: nl + 1]])
                parts = [p for p in (parts[i][nl + 1 :], *parts[i + 1 :]) if p]
            yield lines, offset
            offset += len(lines)
            size = sum(map(len, parts))
    if parts:
        yield b"".join(parts), offset


def _anchor(path: Path, decoder: Rocprofv3CsvDecoder) -> int | None:
    """The largest raw end among the last complete lines of an uncompressed file (None for gzip)."""
    with path.open("rb") as fh:
        if fh.read(2) == GZIP_MAGIC:
            return None
        size = fh.seek(0, 2)
        start = max(0, size - TAIL_BYTES)
        fh.seek(start)
        tail = fh.read(TAIL_BYTES)
    cut = tail.find(b"\n") + 1  # the first line is partial, or the header
    ends = decoder.decode(tail[cut:], start + cut).table["end_ns"]
    last = pc.max(ends).as_py()
    return None if last is None else int(last) - decoder.ctx.clock.offset_ns


def parse_csv_file(
    path: Path, ctx: TraceContext, max_bytes: int | None = None, *, limits: TraceLimits | None = None
) -> Iterator[ParsedTrace]:
    """Parse a whole rocprofv3 kernel, memory-copy, API or agent CSV (with its companions) in chunks.

    Every file is read within ``limits`` (``TraceLimits``; None: the defaults), ``max_bytes`` (when
    given) as its ``max_file_bytes``: past a limit raises ``TraceLimitError``, rows before it yielded.
    """
    limits = limits or TraceLimits()
    if max_bytes is not None:
        limits = replace(limits, max_file_bytes=max_bytes)
    max_bytes = limits.max_file_bytes or DEFAULT_MAX_BYTES
    head = read_bytes(path, 64 * 1024, limits)
    fmt = sniff_csv(head)
    if fmt == FORMAT_AGENTS:
        agents = read_agent_info(read_bytes(path, max_bytes, limits))
        devices = {a.device: a.describe() for a in agents.agents}
        yield from chunks(fmt, ctx, empty_kernels(ctx), devices=devices)
        return
    if fmt == FORMAT_API:
        api = read_api_trace(read_bytes(path, max_bytes, limits))
        its = api_iterations(api, ctx)
        yield from chunks(fmt, ctx, empty_kernels(ctx), its, skipped=api.skipped, bad_rows=api.bad_rows, pids=api.pids)
        return
    if fmt not in (FORMAT_KERNEL, FORMAT_MEMCPY):
        raise ValueError("not a rocprofv3 CSV trace")
    comp = load_companions(path, max_bytes, limits)
    ctx = _ctx_with_pid(ctx, comp.pid)
    header_end = head.find(b"\n") + 1 or len(head)
    decoder = Rocprofv3CsvDecoder(head[:header_end], ctx, comp.agents, comp.launches)
    pids = (ctx.pid,) if ctx.pid is not None else ()
    anchor = _anchor(path, Rocprofv3CsvDecoder(head[:header_end], ctx))
    cut = _Cut()
    first = True
    for block, block_offset in _blocks(path, cut, limits):
        data, offset = (block[header_end:], header_end) if block_offset == 0 else (block, block_offset)
        res = decoder.decode(data, offset)
        for part in chunks(
            fmt, ctx, res.table, skipped=res.skipped, bad_rows=res.bad_rows, pids=pids, devices=decoder.devices
        ):
            if first:
                part.anchor_raw_ns, first = anchor, False
            yield part
    if cut.truncated or first:
        skipped = Counter({"truncated_file": 1} if cut.truncated else {})
        for part in chunks(fmt, ctx, empty_kernels(ctx), skipped=skipped, pids=pids):
            if first:
                part.anchor_raw_ns, first = anchor, False
            yield part


def parse_file(tf: TraceFile, ctx: TraceContext, limits: TraceLimits) -> Iterator[ParsedTrace]:
    """A rocprofv3 CSV of any domain, with its companions (``parse_csv_file``)."""
    max_bytes = limits.max_file_bytes if limits.max_file_bytes is not None else DEFAULT_MAX_BYTES
    return parse_csv_file(tf.path, ctx, max_bytes, limits=limits)


TRACE_FORMAT = TraceFormat(
    FORMATS,
    sniff_csv,
    parse_file,
    boottime=True,
    iterations_first=frozenset({FORMAT_API}),
    tailable=frozenset({FORMAT_KERNEL, FORMAT_MEMCPY}),
)
