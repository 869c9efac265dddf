"""rocpd: the SQLite database rocprofv3 writes by default since ROCm 7 (``--output-format rocpd``).

Read with the published schema (rocprofiler-sdk ``source/share/rocprofiler-sdk-rocpd/``:
``rocpd_tables.sql`` creates ``rocpd_<table><uuid>`` tables, ``rocpd_views.sql`` the un-suffixed
views over them that this module queries, ``data_views.sql`` and ``marker_views.sql`` the joins
it mirrors). Two generations of the tables exist and both are read:

- direct (ROCm 7.0 release): ``rocpd_kernel_dispatch`` and ``rocpd_memory_copy`` carry
  ``start``/``end`` ns, ``pid``/``tid`` (ids of ``rocpd_info_process``/``rocpd_info_thread``
  rows), ``agent_id``, ``queue_id``, ``stream_id``; ``rocpd_region`` (host API calls and rocTX
  ranges) the same;
- tracked (later sources): those rows point to ``rocpd_track`` (pid, tid, agent, queue, stream)
  by ``track_id`` and to ``rocpd_timestamp`` rows by ``start_id``/``end_id``.

Common to both: ``rocpd_event`` (``correlation_id``, ``category_id`` -> ``rocpd_string``, and
``extdata.message`` for rocTX), ``rocpd_info_kernel_symbol`` (``display_name``, ``kernel_name``),
``rocpd_info_agent`` (``type``, ``absolute_index``, ``logical_index``, ``type_index``, ``name``,
``product_name``), ``rocpd_string``. Kernels and copies become ``kernels`` rows; regions whose
category starts with ``HIP_`` are their launches (joined by correlation id); ``MARKER_CORE_API`` /
``MARKER_CORE_RANGE_API`` regions with ``end > start`` are iterations (the outermost of each thread,
or the ones ``iteration_ranges`` names: ``tables.iteration_ranges``). Rows are fetched and
yielded in chunks of ``CHUNK_ROWS``. Timestamps are CLOCK_BOOTTIME ns (``TraceContext.clock``).

Numbers in full (``u64``): rocprofiler-sdk's ids and timestamps are unsigned 64-bit,
and SQLite holds signed 64-bit integers. A value at or above 2^63 reaches the database as the
int64 of the same bits (bound as an integer), as REAL (an integer literal past int64, which the
writer's SQL text produces: SQLite keeps its nearest double, so ids that close are already one
id in the file) or as TEXT: each is read back as the unsigned value it stands for (``rocpd_rows.sql_int``).
Joins (correlation id -> launch) and maps (agent id -> device) use the unsigned value; the
``int64`` columns of ``kernels`` (``correlation_id``, ``queue_id``, ``stream``, ...) hold a value
at or above 2^63 as the int64 with the same 64 bits. A row whose needed value does not fit 64 bits
is counted ``int_out_of_range``; one whose times convert outside 1990..2100 ``time_out_of_range``
(``bad_time``: negative, or end before start). Columns nothing reads are never fetched.

The first chunk carries ``model``, from the first ``rocpd_info_process.command`` (see
``model_names.model_from_command``), and ``anchor_raw_ns``, the largest ``fini`` (else ``end``)
of ``rocpd_info_process``, when the database has them.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.agent.sources.traces.context import MAX_NAME_BYTES, TraceContext
from aaco.agent.sources.traces.devices import Agent, AgentMap
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.format import TraceFormat
from aaco.agent.sources.traces.launches import LaunchTable
from aaco.agent.sources.traces.limits import DEFAULT_MAX_BYTES, READ_STEP, TraceLimits, open_trace
from aaco.agent.sources.traces.model_names import model_from_command
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.rocpd_rows import rows_table, small, sql_id, sql_int, sql_u64
from aaco.agent.sources.traces.rocprofv3_csv import MARKER_RANGE_DOMAINS
from aaco.agent.sources.traces.tables import CHUNK_ROWS, empty_iterations, empty_kernels, iterations_table
from aaco.agent.sources.traces.u64 import OUT_OF_RANGE, TimeWindow, int64_column, signed, u64_array

FORMAT = "rocpd"
SQLITE_MAGIC = b"SQLite format 3\x00"


def columns(con: sqlite3.Connection, table: str) -> set[str]:
    """The columns of a table or view (none when the database has no such name)."""
    try:
        return {row[1] for row in con.execute(f'PRAGMA table_info("{table}")')}
    except sqlite3.DatabaseError:
        return set()


class Layout:
    """SQL fragments for one table generation: where times, pid, tid, agent, queue, stream come from."""

    def __init__(self, con: sqlite3.Connection, table: str, alias: str) -> None:
        cols = columns(con, table)
        self.present = bool(cols)
        self.tracked = "track_id" in cols and "start" not in cols
        a = alias
        if self.tracked:
            self.joins = (
                f"LEFT JOIN rocpd_track T ON T.id = {a}.track_id AND T.guid = {a}.guid "
                f"LEFT JOIN rocpd_timestamp DS ON DS.id = {a}.start_id AND DS.guid = {a}.guid "
                f"LEFT JOIN rocpd_timestamp DE ON DE.id = {a}.end_id AND DE.guid = {a}.guid "
            )
            self.start, self.end = "DS.value", "DE.value"
            self.pid, self.tid = "T.pid", "T.tid"  # tracks hold the OS pid and tid
            self.agent, self.queue, self.stream = "T.agent_id", "T.queue_id", "T.stream_id"
        else:
            self.joins = (
                f"LEFT JOIN rocpd_info_process P ON P.id = {a}.pid AND P.guid = {a}.guid "
                f"LEFT JOIN rocpd_info_thread TH ON TH.id = {a}.tid AND TH.guid = {a}.guid "
            )
            self.start, self.end = f'{a}."start"', f'{a}."end"'
            self.pid, self.tid = "P.pid", "TH.tid"
            self.agent = f"{a}.agent_id" if "agent_id" in cols else "NULL"
            self.queue = f"{a}.queue_id" if "queue_id" in cols else "NULL"
            self.stream = f"{a}.stream_id" if "stream_id" in cols else "NULL"


def _agents(con: sqlite3.Connection) -> AgentMap:
    if not columns(con, "rocpd_info_agent"):
        return AgentMap()
    agents = []
    for row in con.execute(
        "SELECT id, type, absolute_index, logical_index, type_index, name, product_name FROM rocpd_info_agent"
    ):
        aid, kind, absolute, logical, type_index, name, product = row
        aid = sql_u64(aid)
        if aid is None or aid is OUT_OF_RANGE:
            continue
        agents.append(
            Agent(
                small(absolute),
                small(logical),
                str(kind or "UNK").upper(),
                small(type_index),
                name or None,
                product or None,
                aid,
            )
        )
    return AgentMap(AgentMap.with_type_indexes(agents))


def _process_info(con: sqlite3.Connection) -> tuple[str | None, int | None]:
    """(model, anchor_raw_ns) from ``rocpd_info_process`` (``command``, ``fini``, ``end``), when present."""
    cols = columns(con, "rocpd_info_process")
    pick = [c for c in ("command", "fini", "end") if c in cols]
    if not pick:
        return None, None
    model: str | None = None
    finis: list[int] = []
    ends: list[int] = []
    sql = "SELECT " + ", ".join(f'"{c}"' for c in pick) + " FROM rocpd_info_process ORDER BY id LIMIT 4096"
    for row in con.execute(sql):
        v = dict(zip(pick, row, strict=True))
        if model is None and isinstance(v.get("command"), str):
            model = model_from_command(_argv(v["command"]))
        for key, out in (("fini", finis), ("end", ends)):
            x = small(v.get(key))
            if x:
                out.append(x)
    return model, max(finis) if finis else (max(ends) if ends else None)


def _argv(command: str) -> list[str] | str:
    """A command as the writer stored it: a JSON list of words, or one string."""
    text = command[:65536]
    if text.lstrip().startswith("["):
        try:
            words = json.loads(text)
        except ValueError:
            return text
        return [w for w in words if isinstance(w, str)] if isinstance(words, list) else text
    return text


def _regions(con: sqlite3.Connection, where: str) -> Iterator[tuple[Any, ...]]:
    """(start, end, pid, tid, correlation_id, name, message, category) of regions matching ``where``."""
    lay = Layout(con, "rocpd_region", "R")
    if not lay.present:
        return
    sql = (
        f"SELECT {lay.start}, {lay.end}, {lay.pid}, {lay.tid}, E.correlation_id, N.string, "
        "JSON_EXTRACT(E.extdata, '$.message'), C.string "
        "FROM rocpd_region R "
        "LEFT JOIN rocpd_event E ON E.id = R.event_id AND E.guid = R.guid "
        "LEFT JOIN rocpd_string C ON C.id = E.category_id AND C.guid = E.guid "
        "LEFT JOIN rocpd_string N ON N.id = R.name_id AND N.guid = R.guid "
        f"{lay.joins} WHERE {where} ORDER BY R.id"
    )
    cur = con.execute(sql)
    while rows := cur.fetchmany(CHUNK_ROWS):
        yield from rows


def _launches(con: sqlite3.Connection, window: TimeWindow, skipped: Counter[str]) -> LaunchTable:
    corr, start, end, pid, tid, name_idx = [], [], [], [], [], []
    names: dict[str, int] = {}
    for raw_s, raw_e, p, t, raw_c, name, _msg, _cat in _regions(con, "C.string LIKE 'HIP\\_%' ESCAPE '\\'"):
        c, s, e = sql_u64(raw_c), sql_int(raw_s), sql_int(raw_e)
        reason = "int_out_of_range" if c is OUT_OF_RANGE else window.reason(s, e)
        if reason is None and c is None:
            reason = "missing_value"
        if reason is not None:
            skipped[reason] += 1
            continue
        corr.append(c)
        start.append(s)
        end.append(e)
        pid.append(sql_id(p))
        tid.append(sql_id(t))
        name_idx.append(names.setdefault(name or "hip_api", len(names)))
    if not corr:
        return LaunchTable.empty()
    return LaunchTable.build(
        u64_array(corr)[0],
        np.array(start, np.int64),
        np.array(end, np.int64),
        int64_column(pid),
        int64_column(tid),
        np.array(name_idx, np.int32),
        list(names),
    )


def _iterations(con: sqlite3.Connection, ctx: TraceContext, skipped: Counter[str]) -> pa.Table:
    cats = ", ".join(f"'{c}'" for c in MARKER_RANGE_DOMAINS)
    window = TimeWindow(ctx.clock.offset_ns)
    starts, ends, pids, tids, names, keys = [], [], [], [], [], []
    for raw_s, raw_e, p, t, c, name, msg, _cat in _regions(con, f"C.string IN ({cats})"):
        s, e = sql_int(raw_s), sql_int(raw_e)
        reason = window.reason(s, e)
        if reason is not None:
            skipped[reason] += 1
            continue
        if e <= s:
            continue  # a mark (roctxMarkA), not a range
        starts.append(s + ctx.clock.offset_ns)
        ends.append(e + ctx.clock.offset_ns)
        pid, tid = sql_id(p), sql_id(t)
        pids.append(None if pid is None else signed(pid))
        tids.append(None if tid is None else signed(tid))
        label = msg if isinstance(msg, str) and msg else (name or "roctx")
        names.append(str(label)[:MAX_NAME_BYTES])
        keys.append(f"roctx:{sql_id(c)}:{s}")
    if not starts:
        return empty_iterations(ctx)
    return iterations_table(
        ctx,
        start_ns=np.array(starts, np.int64),
        end_ns=np.array(ends, np.int64),
        pid=pids,
        tid=tids,
        names=names,
        keys=keys,
    )


def _kernel_sql(con: sqlite3.Connection) -> str | None:
    lay = Layout(con, "rocpd_kernel_dispatch", "K")
    if not lay.present:
        return None
    agent = lay.agent if lay.tracked else "K.agent_id"
    return (
        f"SELECT {lay.start}, {lay.end}, {lay.pid}, {lay.tid}, {agent}, {lay.queue}, {lay.stream}, "
        "E.correlation_id, COALESCE(S.display_name, S.kernel_name), "
        "K.grid_size_x, K.grid_size_y, K.grid_size_z, K.workgroup_size_x, K.workgroup_size_y, K.workgroup_size_z "
        "FROM rocpd_kernel_dispatch K "
        "LEFT JOIN rocpd_info_kernel_symbol S ON S.id = K.kernel_id AND S.guid = K.guid "
        "LEFT JOIN rocpd_event E ON E.id = K.event_id AND E.guid = K.guid "
        f"{lay.joins} ORDER BY K.id"
    )


def _copy_sql(con: sqlite3.Connection) -> str | None:
    lay = Layout(con, "rocpd_memory_copy", "M")
    if not lay.present:
        return None
    return (
        f"SELECT {lay.start}, {lay.end}, {lay.pid}, {lay.tid}, M.src_agent_id, M.dst_agent_id, "
        f"{lay.queue}, {lay.stream}, E.correlation_id, N.string, M.size "
        "FROM rocpd_memory_copy M "
        "LEFT JOIN rocpd_string N ON N.id = M.name_id AND N.guid = M.guid "
        "LEFT JOIN rocpd_event E ON E.id = M.event_id AND E.guid = M.guid "
        f"{lay.joins} ORDER BY M.id"
    )


@contextlib.contextmanager
def connect(path: Path, limits: TraceLimits) -> Iterator[sqlite3.Connection]:
    """A read-only connection; a gzip-compressed database is decompressed to a temporary file first.

    Either way the file is checked and read within ``limits`` (``TraceLimits``: size on disk,
    decompressed size, gzip ratio); past one raises ``TraceLimitError``.
    """
    tmp: tempfile.TemporaryDirectory[str] | None = None
    target = path
    try:
        with open_trace(path, limits, json_guard=False) as src:
            if src.compressed:
                tmp = tempfile.TemporaryDirectory(prefix="aaco-rocpd-")
                target = Path(tmp.name) / "trace.db"
                with target.open("wb") as dst:
                    while chunk := src.read1(READ_STEP):
                        dst.write(chunk)
        con = sqlite3.connect(f"{target.resolve().as_uri()}?mode=ro", uri=True)
        try:
            yield con
        finally:
            con.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp.name, ignore_errors=True)


def parse_rocpd(
    path: Path, ctx: TraceContext, max_bytes: int | None = None, *, limits: TraceLimits | None = None
) -> Iterator[ParsedTrace]:
    """Stream a rocpd database as ``ParsedTrace`` chunks (iterations and devices on the first).

    Read within ``limits`` (None: the defaults), ``max_bytes`` (when given) as its ``max_file_bytes``.
    """
    limits = limits or TraceLimits()
    if max_bytes is not None:
        limits = replace(limits, max_file_bytes=max_bytes)
    with connect(path, limits) as con:
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"not a readable SQLite database: {exc}") from exc
        agents = _agents(con)
        skipped: Counter[str] = Counter()
        try:
            launches = _launches(con, TimeWindow(ctx.clock.offset_ns), skipped)
            iterations = _iterations(con, ctx, skipped)
            model, anchor = _process_info(con)
            pids = _pids(con)
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"not a rocpd database of a known schema: {exc}") from exc
        first = True
        for kind, sql in (("kernel", _kernel_sql(con)), ("memcpy", _copy_sql(con))):
            for rows in _fetch(con, sql, kind, skipped):
                table = rows_table(rows, kind, ctx, agents, launches, skipped)
                if table is None:
                    continue
                its = iterations if first else iterations.slice(0, 0)
                part = ParsedTrace(FORMAT, table, its, ctx.clock, Counter(skipped), pids, dict(agents.used))
                if first:
                    part.model, part.anchor_raw_ns, first = model, anchor, False
                yield part
                skipped.clear()
        if first or skipped:
            its = iterations if first else iterations.slice(0, 0)
            part = ParsedTrace(FORMAT, empty_kernels(ctx), its, ctx.clock, Counter(skipped), pids, dict(agents.used))
            if first:
                part.model, part.anchor_raw_ns = model, anchor
            yield part


def _pids(con: sqlite3.Connection) -> tuple[int, ...]:
    """The traced processes' ids (none when the database has no process table)."""
    if not columns(con, "rocpd_info_process"):
        return ()
    return tuple(
        sorted({p for r in con.execute("SELECT pid FROM rocpd_info_process") if (p := small(r[0])) is not None})
    )


def _fetch(con: sqlite3.Connection, sql: str | None, kind: str, skipped: Counter[str]) -> Iterator[list[Any]]:
    """The rows of ``sql`` in chunks; an unreadable table or a corrupt page ends them, counted."""
    if sql is None:
        return
    try:
        cur = con.execute(sql)
    except sqlite3.DatabaseError:
        skipped[f"unreadable_{kind}_table"] += 1
        return
    while True:
        try:
            rows = cur.fetchmany(CHUNK_ROWS)
        except sqlite3.DatabaseError:
            skipped["corrupt_database"] += 1
            return
        if not rows:
            return
        yield rows


def sniff(head: bytes) -> str | None:
    """``rocpd`` for an SQLite database whose head names rocpd tables."""
    return FORMAT if head.startswith(SQLITE_MAGIC) and b"rocpd_" in head else None


def parse_file(tf: TraceFile, ctx: TraceContext, limits: TraceLimits) -> Iterator[ParsedTrace]:
    """A rocpd database (``parse_rocpd``)."""
    max_bytes = limits.max_file_bytes if limits.max_file_bytes is not None else DEFAULT_MAX_BYTES
    return parse_rocpd(tf.path, ctx, max_bytes, limits=limits)


TRACE_FORMAT = TraceFormat((FORMAT,), sniff, parse_file, boottime=True)
