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
  message; instant marks (``roctxMarkA``, start == end) and control calls are not iterations.
- ``agent_info.csv``: ``Node_Id, Logical_Node_Id, Agent_Type, ..., Name, Vendor_Name,
  Product_Name, Model_Name`` (53 columns, ``generateCSV.cpp``): maps agents to GPU ordinals and
  names (see ``trace_common``).

Each file is parsed on its own (kernel and copy traces into kernels, marker traces into
iterations); HIP API and agent files are companions, read when a kernel or copy trace beside them
with the same prefix is parsed. So a spool directory replayed or tailed file by file yields every
event once. Timestamps are CLOCK_BOOTTIME ns, converted with ``TraceContext.clock``.

``Rocprofv3CsvDecoder`` decodes chunks of complete lines (the tail reader's unit) with
``csv_rows.CsvRowReader``: vectorised, bad rows reported with their byte offset.
"""

from __future__ import annotations

import csv
import re
import zlib
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .csv_rows import CsvRowReader
from .formats import _open
from .parsed import ParsedTrace
from .trace_common import (
    MAX_NAME_BYTES,
    Agent,
    AgentMap,
    BadRow,
    LaunchTable,
    TraceContext,
    chunks,
    empty_kernels,
    iterations_table,
    stamp_kernels,
)

FORMAT_KERNEL = "rocprofv3_kernel_csv"
FORMAT_MEMCPY = "rocprofv3_memcpy_csv"
FORMAT_API = "rocprofv3_api_csv"
FORMAT_AGENTS = "rocprofv3_agent_info_csv"
FORMATS = (FORMAT_KERNEL, FORMAT_MEMCPY, FORMAT_API, FORMAT_AGENTS)

_TIMES = ("Correlation_Id", "Start_Timestamp", "End_Timestamp")
REQUIRED = {
    FORMAT_KERNEL: ("Kind", "Agent_Id", "Queue_Id", "Kernel_Name", *_TIMES),
    FORMAT_MEMCPY: ("Kind", "Direction", "Source_Agent_Id", "Destination_Agent_Id", *_TIMES),
    FORMAT_API: ("Domain", "Function", "Process_Id", "Thread_Id", *_TIMES),
    FORMAT_AGENTS: ("Node_Id", "Logical_Node_Id", "Agent_Type"),
}
# Companion file names: <prefix><suffix>[.gz]
SUFFIXES = {
    "kernel_trace.csv": FORMAT_KERNEL,
    "memory_copy_trace.csv": FORMAT_MEMCPY,
    "hip_api_trace.csv": FORMAT_API,
    "marker_api_trace.csv": FORMAT_API,
    "agent_info.csv": FORMAT_AGENTS,
}
MARKER_RANGE_DOMAINS = ("MARKER_CORE_API", "MARKER_CORE_RANGE_API")
LAUNCH_DOMAIN_PREFIX = "HIP_"
MAX_TIME_NS = 1 << 62  # BOOTTIME ns beyond this is damage (146 years of uptime)
READ_BLOCK = 8 << 20  # bytes of complete lines decoded at a time by parse_csv_file
MAX_LINE_BYTES = 64 << 20  # a "line" this long without a newline is handed on as one bad row

I64 = pa.int64()
DICT = pa.dictionary(pa.int32(), pa.string())
_INT_COLUMNS = (
    "Queue_Id",
    "Stream_Id",
    "Thread_Id",
    "Process_Id",
    "Dispatch_Id",
    "Kernel_Id",
    "Correlation_Id",
    "Start_Timestamp",
    "End_Timestamp",
    "Workgroup_Size_X",
    "Workgroup_Size_Y",
    "Workgroup_Size_Z",
    "Grid_Size_X",
    "Grid_Size_Y",
    "Grid_Size_Z",
    "Size",
)
_DICT_COLUMNS = ("Kind", "Agent_Id", "Direction", "Source_Agent_Id", "Destination_Agent_Id", "Domain", "Function")


def parse_header(head: bytes) -> list[str] | None:
    """The column names of a CSV whose content starts with ``head`` (None if the first line is not text)."""
    first = head.split(b"\n", 1)[0].rstrip(b"\r")
    if not first or b"\x00" in first:
        return None
    try:
        text = first.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        return None
    try:
        cols = next(csv.reader([text]))
    except (csv.Error, StopIteration):
        return None
    return [c.strip() for c in cols]


def sniff_csv(head: bytes) -> str | None:
    """Which rocprofv3 CSV this is, from its header (None if none)."""
    names = parse_header(head)
    if not names:
        return None
    have = set(names)
    for fmt in (FORMAT_KERNEL, FORMAT_MEMCPY, FORMAT_API, FORMAT_AGENTS):
        if all(c in have for c in REQUIRED[fmt]):
            return fmt
    return None


def companions(path: Path) -> dict[str, Path]:
    """Files beside ``path`` from the same rocprofv3 run: suffix (e.g. ``hip_api_trace.csv``) -> path."""
    name = path.name.removesuffix(".gz")
    prefix = None
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            prefix = name[: -len(suffix)]
            break
    if prefix is None:
        return {}
    out: dict[str, Path] = {}
    for suffix in SUFFIXES:
        for cand in (path.parent / f"{prefix}{suffix}", path.parent / f"{prefix}{suffix}.gz"):
            if cand.is_file():
                out[suffix] = cand
                break
    return out


def _read_bytes(path: Path, max_bytes: int) -> bytes:
    with _open(path) as fh:
        return fh.read(max_bytes)


def _to_np(col: pa.ChunkedArray | pa.Array, fill: int = -1) -> np.ndarray:
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return np.asarray(pc.fill_null(col, fill).to_numpy(zero_copy_only=False), dtype=np.int64)


# --- companions ----------------------------------------------------------------------------------


def read_agent_info(data: bytes) -> AgentMap:
    """Agents of an ``agent_info.csv`` (unreadable rows are left out: the map is a convenience)."""
    text = data.decode("utf-8", "replace").lstrip("\ufeff")
    agents: list[Agent] = []
    for row in csv.DictReader(text.splitlines()):
        try:
            node = int(row["Node_Id"])
            logical = int(row["Logical_Node_Id"])
        except (KeyError, TypeError, ValueError):
            continue
        kind = (row.get("Agent_Type") or "UNK").strip().upper()
        agents.append(Agent(node, logical, kind, None, row.get("Name") or None, row.get("Product_Name") or None, node))
    return AgentMap(AgentMap.with_type_indexes(agents))


@dataclass
class ApiTrace:
    """An API trace CSV (HIP, HSA, marker, ...): launches, rocTX ranges, the processes seen."""

    launches: LaunchTable
    ranges: pa.Table  # Function, Process_Id, Thread_Id, Correlation_Id, Start_Timestamp, End_Timestamp
    pids: tuple[int, ...]
    skipped: Counter[str] = field(default_factory=Counter)
    bad_rows: list[BadRow] = field(default_factory=list)


def read_api_trace(data: bytes, base_offset: int = 0) -> ApiTrace:
    """Decode a whole API trace CSV (header included)."""
    names = parse_header(data) or []
    if not all(c in names for c in REQUIRED[FORMAT_API]):
        raise ValueError("not a rocprofv3 API trace (expected Domain, Function, Process_Id, ... columns)")
    header, _, body = data.partition(b"\n")
    types = {c: (DICT if c in _DICT_COLUMNS else I64) for c in REQUIRED[FORMAT_API]}
    reader = CsvRowReader(names, types, header_line=header)
    chunk = reader.read(body, base_offset + len(header) + 1)
    t = chunk.table
    start, end = _to_np(t["Start_Timestamp"]), _to_np(t["End_Timestamp"])
    chunk.reject((start < 0) | (end < start) | (end > MAX_TIME_NS), "bad_time")
    t = chunk.table
    domain = t["Domain"].combine_chunks()
    domain_s = domain.cast(pa.string()) if pa.types.is_dictionary(domain.type) else domain
    is_launch = np.asarray(pc.starts_with(domain_s, LAUNCH_DOMAIN_PREFIX).to_numpy(zero_copy_only=False), dtype=bool)
    is_marker = np.asarray(pc.is_in(domain_s, pa.array(MARKER_RANGE_DOMAINS)).to_numpy(zero_copy_only=False), bool)
    start, end = _to_np(t["Start_Timestamp"]), _to_np(t["End_Timestamp"])
    corr = _to_np(t["Correlation_Id"])
    func = pc.dictionary_encode(t["Function"].combine_chunks().cast(pa.string()))
    launch_rows = np.flatnonzero(is_launch & (corr >= 0))
    launches = LaunchTable.build(
        corr[launch_rows],
        start[launch_rows],
        end[launch_rows],
        _to_np(t["Process_Id"])[launch_rows],
        _to_np(t["Thread_Id"])[launch_rows],
        np.asarray(func.indices.to_numpy(zero_copy_only=False), dtype=np.int32)[launch_rows],
        func.dictionary.to_pylist(),
    )
    ranges = t.filter(pa.array(is_marker & (end > start)))
    pids = tuple(sorted({int(p) for p in _to_np(t["Process_Id"]) if p >= 0}))
    return ApiTrace(launches, ranges, pids, chunk.skipped, chunk.bad_rows)


def api_iterations(api: ApiTrace, ctx: TraceContext) -> pa.Table:
    """The rocTX ranges of an API trace, as iterations."""
    r = api.ranges
    name = r["Function"].combine_chunks().cast(pa.string()).to_pylist()
    pid = [p if p is not None and p >= 0 else None for p in r["Process_Id"].to_pylist()]
    tid = [t if t is not None and t >= 0 else None for t in r["Thread_Id"].to_pylist()]
    corr = r["Correlation_Id"].to_pylist()
    start = _to_np(r["Start_Timestamp"]) + ctx.clock.offset_ns
    end = _to_np(r["End_Timestamp"]) + ctx.clock.offset_ns
    keys: list[object] = [f"roctx:{c}:{s}" for c, s in zip(corr, start.tolist(), strict=True)]
    return iterations_table(ctx, start_ns=start, end_ns=end, pid=pid, tid=tid, names=name, keys=keys)


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
        self.agents = agents or AgentMap()
        self.launches = launches if launches is not None else LaunchTable.empty()
        types: dict[str, pa.DataType] = {}
        for c in names:
            if c in _INT_COLUMNS:
                types[c] = I64
            elif c in _DICT_COLUMNS:
                types[c] = DICT
            elif c == "Kernel_Name":
                types[c] = pa.string()
        first = header.split(b"\n", 1)[0]
        kind_token = b"KERNEL_DISPATCH" if fmt == FORMAT_KERNEL else b"MEMORY_COPY"
        self._kind = kind_token.decode()
        self.reader = CsvRowReader(names, types, row_prefixes=(b'"' + kind_token + b'"', kind_token), header_line=first)

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
        if t.num_rows:
            start, end = t["Start_Timestamp"], t["End_Timestamp"]
            missing = pc.or_(pc.is_null(start), pc.is_null(end))
            chunk.reject(missing, "missing_value")
            t = chunk.table
            start, end = t["Start_Timestamp"], t["End_Timestamp"]
            bad_time = pc.or_(
                pc.or_(pc.less(start, 0), pc.less(end, start)),
                pc.greater(end, MAX_TIME_NS),
            )
            chunk.reject(bad_time, "bad_time")
            t = chunk.table
        if t.num_rows and self.format == FORMAT_KERNEL:
            chunk.reject(pc.greater(pc.binary_length(t["Kernel_Name"]), MAX_NAME_BYTES), "name_too_long")
            t = chunk.table
        table = self._columns(t) if t.num_rows else empty_kernels(self.ctx)
        return DecodeResult(table, chunk.skipped, chunk.bad_rows)

    def _columns(self, t: pa.Table) -> pa.Table:
        n = t.num_rows
        off = self.ctx.clock.offset_ns
        have = set(t.column_names)
        cols: dict[str, Any] = {
            "start_ns": pc.add(t["Start_Timestamp"], off),
            "end_ns": pc.add(t["End_Timestamp"], off),
            "correlation_id": t["Correlation_Id"],
        }
        if self.format == FORMAT_KERNEL:
            cols["name"] = t["Kernel_Name"]
            cols["device"] = self.agents.map_labels(t["Agent_Id"])
            cols["queue_id"] = t["Queue_Id"]
            for axis in "xyz":
                if f"Grid_Size_{axis.upper()}" in have:
                    cols[f"grid_{axis}"] = t[f"Grid_Size_{axis.upper()}"]
                if f"Workgroup_Size_{axis.upper()}" in have:
                    cols[f"workgroup_{axis}"] = t[f"Workgroup_Size_{axis.upper()}"]
            kind: str = "kernel"
        else:
            direction = t["Direction"].combine_chunks().cast(pa.string())
            cols["name"] = direction
            from_device = pc.match_substring(direction, "DEVICE_TO_HOST")
            src = self.agents.map_labels(t["Source_Agent_Id"])
            dst = self.agents.map_labels(t["Destination_Agent_Id"])
            cols["device"] = pc.if_else(from_device, src, dst)
            if "Size" in have:
                cols["bytes"] = t["Size"]
            kind = "memcpy"
        if "Stream_Id" in have:
            cols["stream"] = t["Stream_Id"]
        tid = t["Thread_Id"] if "Thread_Id" in have else pa.nulls(n, I64)
        pid: Any = pa.repeat(pa.scalar(self.ctx.pid, I64), n) if self.ctx.pid is not None else pa.nulls(n, I64)
        if len(self.launches):
            launch = self.launches.columns(_to_np(t["Correlation_Id"]), off)
            cols["launch_start_ns"] = launch["launch_start_ns"]
            cols["launch_end_ns"] = launch["launch_end_ns"]
            cols["launch_name"] = launch["launch_name"]
            pid = pc.coalesce(launch["launch_pid"], pid)
            tid = pc.coalesce(launch["launch_tid"], tid)
        cols["pid"] = pid
        cols["tid"] = tid
        return stamp_kernels(cols, n, self.ctx, kind)


# --- whole files ---------------------------------------------------------------------------------


def _pid_from_name(path: Path) -> int | None:
    m = re.match(r"^(\d+)_", path.name)
    return int(m.group(1)) if m else None


def _ctx_with_pid(ctx: TraceContext, pid: int | None) -> TraceContext:
    if ctx.pid is not None or pid is None:
        return ctx
    return TraceContext(ctx.node, ctx.identity, ctx.run_id, ctx.model, ctx.source, ctx.clock, ctx.file_mtime_ns, pid)


@dataclass
class CsvCompanions:
    """What the files beside a kernel or copy trace add: agents, launches, the traced process."""

    agents: AgentMap
    launches: LaunchTable
    pid: int | None


def load_companions(path: Path, max_bytes: int) -> CsvCompanions:
    """Read ``agent_info.csv`` and ``hip_api_trace.csv`` beside ``path`` (missing or broken ones are skipped)."""
    found = companions(path)
    agents = AgentMap()
    if "agent_info.csv" in found:
        try:
            agents = read_agent_info(_read_bytes(found["agent_info.csv"], max_bytes))
        except (OSError, EOFError, ValueError, csv.Error):
            agents = AgentMap()
    launches = LaunchTable.empty()
    pids: tuple[int, ...] = ()
    for suffix in ("hip_api_trace.csv", "marker_api_trace.csv"):
        if suffix not in found:
            continue
        try:
            api = read_api_trace(_read_bytes(found[suffix], max_bytes))
        except (OSError, EOFError, ValueError, csv.Error):
            continue
        if suffix == "hip_api_trace.csv":
            launches = api.launches
        pids = pids or api.pids
    pid = pids[0] if len(pids) == 1 else _pid_from_name(path)
    return CsvCompanions(agents, launches, pid)


class _Cut:
    """Set when a compressed file ends before its end (the good lines before the cut are kept)."""

    truncated = False


def _blocks(path: Path, cut: _Cut, block: int = READ_BLOCK) -> Iterator[tuple[bytes, int]]:
    """(complete lines, offset) pieces of a file of at most about ``block`` bytes.

    Reads in 1 MiB steps, so a gzip stream cut short loses at most the step it ends in. A "line"
    longer than ``MAX_LINE_BYTES`` is handed on as it is (it will be a bad row), bounding memory.
    """
    offset = 0
    pending = b""
    with _open(path) as fh:
        while True:
            try:
                data = fh.read(min(block, 1 << 20))
            except (EOFError, OSError, zlib.error):
                cut.truncated = True
                break
            if not data:
                break
            pending += data
            if len(pending) < block and len(pending) < MAX_LINE_BYTES:
                continue
            end = pending.rfind(b"\n") + 1
            if end == 0 and len(pending) < MAX_LINE_BYTES:
                continue
            end = end or len(pending)
            yield pending[:end], offset
            offset += end
            pending = pending[end:]
    if pending:
        yield pending, offset


def parse_csv_file(path: Path, ctx: TraceContext, max_bytes: int) -> Iterator[ParsedTrace]:
    """Parse a whole rocprofv3 kernel, memory-copy, API or agent CSV (with its companions) in chunks."""
    with _open(path) as fh:
        head = fh.read(64 * 1024)
    fmt = sniff_csv(head)
    if fmt == FORMAT_AGENTS:
        agents = read_agent_info(_read_bytes(path, max_bytes))
        devices = {a.device: a.describe() for a in agents.agents}
        yield from chunks(fmt, ctx, empty_kernels(ctx), devices=devices)
        return
    if fmt == FORMAT_API:
        api = read_api_trace(_read_bytes(path, max_bytes))
        its = api_iterations(api, ctx)
        yield from chunks(fmt, ctx, empty_kernels(ctx), its, skipped=api.skipped, bad_rows=api.bad_rows, pids=api.pids)
        return
    if fmt not in (FORMAT_KERNEL, FORMAT_MEMCPY):
        raise ValueError("not a rocprofv3 CSV trace")
    comp = load_companions(path, max_bytes)
    ctx = _ctx_with_pid(ctx, comp.pid)
    header_end = head.find(b"\n") + 1 or len(head)
    decoder = Rocprofv3CsvDecoder(head[:header_end], ctx, comp.agents, comp.launches)
    pids = (ctx.pid,) if ctx.pid is not None else ()
    seen = 0
    cut = _Cut()
    for block, block_offset in _blocks(path, cut):
        data, offset = (block[header_end:], header_end) if block_offset == 0 else (block, block_offset)
        seen += len(data)
        if seen > max_bytes:
            raise ValueError(f"larger than the {max_bytes} byte limit")
        res = decoder.decode(data, offset)
        yield from chunks(
            fmt, ctx, res.table, skipped=res.skipped, bad_rows=res.bad_rows, pids=pids, devices=decoder.devices
        )
    if cut.truncated:
        yield from chunks(fmt, ctx, empty_kernels(ctx), skipped=Counter({"truncated_file": 1}), pids=pids)
