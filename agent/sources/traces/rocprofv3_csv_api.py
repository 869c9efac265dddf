"""rocprofv3 CSV companions: API traces (HIP launches, rocTX ranges) and ``agent_info.csv``.

See ``rocprofv3_csv`` for the layouts. Integer columns are read in full (``u64``):
correlation ids join as ``uint64``; a row whose needed integer does not fit 64 bits is counted
``int_out_of_range``; a raw time at or above 2^63 ns is ``time_out_of_range`` (whatever the clock
offset, it is no time of this century), and the launches a kernel is joined with are checked
against the trace's own window when joined (``LaunchTable.columns``).
"""

from __future__ import annotations

import csv
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.context import BadRow, TraceContext
from aaco.agent.sources.traces.csv_rows import CsvChunk, CsvRowReader
from aaco.agent.sources.traces.devices import Agent, AgentMap
from aaco.agent.sources.traces.launches import LaunchTable
from aaco.agent.sources.traces.limits import TraceLimits
from aaco.agent.sources.traces.rocprofv3_csv_layout import (
    DICT,
    DICT_COLUMNS,
    FORMAT_API,
    I64,
    LAUNCH_DOMAIN_PREFIX,
    MARKER_RANGE_DOMAINS,
    REQUIRED,
    companions,
    parse_header,
    read_bytes,
)
from aaco.agent.sources.traces.tables import iterations_table
from aaco.agent.sources.traces.u64 import TimeWindow, U64Column
from aaco.contract.errors import TraceFormatError


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
    """An API trace CSV (HIP, HSA, marker, ...): launches, rocTX ranges, the processes seen.

    ``ranges``: Function, Process_Id, Thread_Id, Correlation_Id (int64, the 64 bits),
    Start_Timestamp, End_Timestamp (raw ns) of the marker rows with end > start.
    """

    launches: LaunchTable
    ranges: pa.Table
    pids: tuple[int, ...]
    skipped: Counter[str] = field(default_factory=Counter)
    bad_rows: list[BadRow] = field(default_factory=list)


def reject_in_order(chunk: CsvChunk, checks: list[tuple[str, np.ndarray]]) -> np.ndarray:
    """Reject each row for the first check it fails (masks over the chunk's rows); the mask of rows kept."""
    n = chunk.table.num_rows
    alive = np.ones(n, dtype=bool)
    for reason, bad in checks:
        drop = bad & alive
        if drop.any():
            chunk.reject(drop[alive], reason)
            alive &= ~drop
    return alive


def _ids_out_of_range(ints: dict[str, U64Column], n: int) -> np.ndarray:
    over = np.zeros(n, dtype=bool)
    for col in ints.values():
        over |= col.over
    return over


def time_checks(start: U64Column, end: U64Column, window: TimeWindow | None) -> list[tuple[str, np.ndarray]]:
    """``missing_value``, ``bad_time`` and ``time_out_of_range`` masks of raw start and end columns.

    Without a window (no clock known yet) only raw times at or above 2^63 are out of range.
    """
    s, e = start.unsigned, end.unsigned
    in_range = (s < np.uint64(1 << 63)) & (e < np.uint64(1 << 63)) if window is None else window.mask(s, e)
    return [
        ("missing_value", ~(start.valid | start.over) | ~(end.valid | end.over)),
        ("bad_time", start.negative | end.negative | (e < s)),
        ("time_out_of_range", ~in_range),
    ]


def read_api_trace(data: bytes, base_offset: int = 0) -> ApiTrace:
    """Decode a whole API trace CSV (header included)."""
    names = parse_header(data) or []
    if not all(c in names for c in REQUIRED[FORMAT_API]):
        raise ValueError("not a rocprofv3 API trace (expected Domain, Function, Process_Id, ... columns)")
    header, _, body = data.partition(b"\n")
    types = {c: (DICT if c in DICT_COLUMNS else I64) for c in REQUIRED[FORMAT_API]}
    widen = tuple(c for c, t in types.items() if t == I64)
    reader = CsvRowReader(names, types, header_line=header, widen=widen)
    chunk = reader.read(body, base_offset + len(header) + 1)
    n = chunk.table.num_rows
    ints = {c: U64Column(chunk.table[c]) for c in widen}
    start, end = ints["Start_Timestamp"], ints["End_Timestamp"]
    checks = [("int_out_of_range", _ids_out_of_range(ints, n)), *time_checks(start, end, None)]
    alive = reject_in_order(chunk, checks)
    t = chunk.table
    domain = t["Domain"].combine_chunks()
    domain_s = domain.cast(pa.string()) if pa.types.is_dictionary(domain.type) else domain
    is_launch = np.asarray(pc.starts_with(domain_s, LAUNCH_DOMAIN_PREFIX).to_numpy(zero_copy_only=False), dtype=bool)
    is_marker = np.asarray(pc.is_in(domain_s, pa.array(MARKER_RANGE_DOMAINS)).to_numpy(zero_copy_only=False), bool)
    s, e = start.bits[alive], end.bits[alive]
    corr, pid, tid = ints["Correlation_Id"], ints["Process_Id"], ints["Thread_Id"]
    corr_ok = corr.valid[alive]
    func = pc.dictionary_encode(t["Function"].combine_chunks().cast(pa.string()))
    rows = np.flatnonzero(is_launch & corr_ok)
    take = pa.array(rows)
    launches = LaunchTable.build(
        corr.unsigned[alive][rows],
        s[rows],
        e[rows],
        _known(pid, alive).take(take),
        _known(tid, alive).take(take),
        np.asarray(func.indices.to_numpy(zero_copy_only=False), dtype=np.int32)[rows],
        func.dictionary.to_pylist(),
    )
    ranges_rows = pa.array(is_marker & (e > s))
    ranges = pa.table(
        {
            "Function": t["Function"],
            "Process_Id": _known(pid, alive),
            "Thread_Id": _known(tid, alive),
            "Correlation_Id": corr.arrow(alive),
            "Start_Timestamp": pa.array(s, I64),
            "End_Timestamp": pa.array(e, I64),
        }
    ).filter(ranges_rows)
    pid_ok = pid.valid[alive] & ~pid.negative[alive]
    pids = tuple(sorted({int(p) for p in np.unique(pid.bits[alive][pid_ok])}))
    return ApiTrace(launches, ranges, pids, chunk.skipped, chunk.bad_rows)


def _known(col: U64Column, keep: np.ndarray) -> pa.Array:
    """A pid or tid column: null where absent or negative (as rocprofv3 writes them, -1 is unknown)."""
    ok = col.valid[keep] & ~col.negative[keep]
    return pa.array(col.bits[keep], I64, mask=~ok)


def api_iterations(api: ApiTrace, ctx: TraceContext) -> pa.Table:
    """The rocTX ranges of an API trace, as iterations (ranges outside 1990..2100 counted in ``api.skipped``)."""
    r = api.ranges
    raw_s = np.asarray(r["Start_Timestamp"].to_numpy(), dtype=np.int64)
    raw_e = np.asarray(r["End_Timestamp"].to_numpy(), dtype=np.int64)
    inside = TimeWindow(ctx.clock.offset_ns).mask(raw_s.view(np.uint64), raw_e.view(np.uint64))
    if not inside.all():
        api.skipped["time_out_of_range"] += int((~inside).sum())
        r = r.filter(pa.array(inside))
        raw_s, raw_e = raw_s[inside], raw_e[inside]
    name = r["Function"].combine_chunks().cast(pa.string()).to_pylist()
    pid = r["Process_Id"].to_pylist()
    tid = r["Thread_Id"].to_pylist()
    corr = r["Correlation_Id"].to_pylist()
    start = raw_s + ctx.clock.offset_ns
    end = raw_e + ctx.clock.offset_ns
    keys: list[object] = [f"roctx:{c}:{s}" for c, s in zip(corr, start.tolist(), strict=True)]
    return iterations_table(ctx, start_ns=start, end_ns=end, pid=pid, tid=tid, names=name, keys=keys)


@dataclass
class CsvCompanions:
    """What the files beside a kernel or copy trace add: agents, launches, the traced process."""

    agents: AgentMap
    launches: LaunchTable
    pid: int | None


def pid_from_name(path: Path) -> int | None:
    """The pid rocprofv3 puts in front of its file names by default (``1234_kernel_trace.csv``)."""
    m = re.match(r"^(\d{1,18})_", path.name)
    return int(m.group(1)) if m else None


def load_companions(path: Path, max_bytes: int, limits: TraceLimits | None = None) -> CsvCompanions:
    """Read ``agent_info.csv`` and ``hip_api_trace.csv`` beside ``path`` within ``limits``.

    Missing, broken or oversized ones (``TraceFormatError``: past a limit, not a regular file) are skipped.
    """
    found = companions(path)
    agents = AgentMap()
    if "agent_info.csv" in found:
        try:
            agents = read_agent_info(read_bytes(found["agent_info.csv"], max_bytes, limits))
        except (OSError, EOFError, ValueError, csv.Error, zlib.error, TraceFormatError):
            agents = AgentMap()
    launches = LaunchTable.empty()
    pids: tuple[int, ...] = ()
    for suffix in ("hip_api_trace.csv", "marker_api_trace.csv"):
        if suffix not in found:
            continue
        try:
            api = read_api_trace(read_bytes(found[suffix], max_bytes, limits))
        except (OSError, EOFError, ValueError, csv.Error, zlib.error, TraceFormatError):
            continue
        if suffix == "hip_api_trace.csv":
            launches = api.launches
        pids = pids or api.pids
    pid = pids[0] if len(pids) == 1 else pid_from_name(path)
    return CsvCompanions(agents, launches, pid)
