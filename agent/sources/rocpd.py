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
``MARKER_CORE_RANGE_API`` regions with ``end > start`` are iterations. Rows are fetched and
yielded in chunks of ``CHUNK_ROWS``. Timestamps are CLOCK_BOOTTIME ns (``TraceContext.clock``).
"""

from __future__ import annotations

import contextlib
import gzip
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .formats import GZIP_MAGIC
from .parsed import ParsedTrace
from .rocprofv3_csv import MARKER_RANGE_DOMAINS, MAX_TIME_NS
from .trace_common import (
    CHUNK_ROWS,
    MAX_NAME_BYTES,
    Agent,
    AgentMap,
    LaunchTable,
    TraceContext,
    empty_iterations,
    empty_kernels,
    iterations_table,
    stamp_kernels,
)

FORMAT = "rocpd"


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    try:
        return {row[1] for row in con.execute(f'PRAGMA table_info("{table}")')}
    except sqlite3.DatabaseError:
        return set()


class _Layout:
    """SQL fragments for one table generation: where times, pid, tid, agent, queue, stream come from."""

    def __init__(self, con: sqlite3.Connection, table: str, alias: str) -> None:
        cols = _columns(con, table)
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
    if not _columns(con, "rocpd_info_agent"):
        return AgentMap()
    agents = []
    for row in con.execute(
        "SELECT id, type, absolute_index, logical_index, type_index, name, product_name FROM rocpd_info_agent"
    ):
        aid, kind, absolute, logical, type_index, name, product = row
        agents.append(
            Agent(absolute, logical, str(kind or "UNK").upper(), type_index, name or None, product or None, aid)
        )
    return AgentMap(AgentMap.with_type_indexes(agents))


def _regions(con: sqlite3.Connection, where: str) -> Iterator[tuple[Any, ...]]:
    """(start, end, pid, tid, correlation_id, name, message, category) of regions matching ``where``."""
    lay = _Layout(con, "rocpd_region", "R")
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


def _launches(con: sqlite3.Connection) -> LaunchTable:
    corr, start, end, pid, tid, name_idx = [], [], [], [], [], []
    names: dict[str, int] = {}
    for s, e, p, t, c, name, _msg, _cat in _regions(con, "C.string LIKE 'HIP\\_%' ESCAPE '\\'"):
        if c is None or s is None or e is None:
            continue
        corr.append(c)
        start.append(s)
        end.append(e)
        pid.append(p if p is not None else -1)
        tid.append(t if t is not None else -1)
        name_idx.append(names.setdefault(name or "hip_api", len(names)))
    if not corr:
        return LaunchTable.empty()

    def arr(v: list[int]) -> np.ndarray:
        return np.array(v, dtype=np.int64)

    return LaunchTable.build(
        arr(corr), arr(start), arr(end), arr(pid), arr(tid), np.array(name_idx, np.int32), list(names)
    )


def _iterations(con: sqlite3.Connection, ctx: TraceContext) -> pa.Table:
    cats = ", ".join(f"'{c}'" for c in MARKER_RANGE_DOMAINS)
    starts, ends, pids, tids, names, keys = [], [], [], [], [], []
    for s, e, p, t, c, name, msg, _cat in _regions(con, f"C.string IN ({cats})"):
        if s is None or e is None or e <= s:
            continue
        starts.append(s + ctx.clock.offset_ns)
        ends.append(e + ctx.clock.offset_ns)
        pids.append(p)
        tids.append(t)
        label = msg if isinstance(msg, str) and msg else (name or "roctx")
        names.append(str(label)[:MAX_NAME_BYTES])
        keys.append(f"roctx:{c}:{s}")
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


_KERNEL_FIELDS = (
    "start",
    "end",
    "pid",
    "tid",
    "agent",
    "queue",
    "stream",
    "corr",
    "name",
    "grid_x",
    "grid_y",
    "grid_z",
    "workgroup_x",
    "workgroup_y",
    "workgroup_z",
)
_COPY_FIELDS = ("start", "end", "pid", "tid", "src", "dst", "queue", "stream", "corr", "name", "bytes")


def _kernel_sql(con: sqlite3.Connection) -> str | None:
    lay = _Layout(con, "rocpd_kernel_dispatch", "K")
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
    lay = _Layout(con, "rocpd_memory_copy", "M")
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


def _ints(values: tuple[Any, ...]) -> pa.Array:
    return pa.array([v if isinstance(v, int) and not isinstance(v, bool) else None for v in values], pa.int64())


def _table(
    rows: list[tuple[Any, ...]],
    kind: str,
    ctx: TraceContext,
    agents: AgentMap,
    launches: LaunchTable,
    skipped: Counter[str],
) -> pa.Table | None:
    fields = _KERNEL_FIELDS if kind == "kernel" else _COPY_FIELDS
    good = []
    for r in rows:
        s, e = r[0], r[1]
        if not isinstance(s, int) or not isinstance(e, int):
            skipped["missing_value"] += 1
        elif s < 0 or e < s or e > MAX_TIME_NS:
            skipped["bad_time"] += 1
        elif isinstance(r[fields.index("name")], str) and len(r[fields.index("name")]) > MAX_NAME_BYTES:
            skipped["name_too_long"] += 1
        else:
            good.append(r)
    if not good:
        return None
    col = dict(zip(fields, zip(*good, strict=True), strict=True))
    n = len(good)
    off = ctx.clock.offset_ns
    start = np.array(col["start"], np.int64)
    end = np.array(col["end"], np.int64)
    corr = _ints(col["corr"])
    out: dict[str, Any] = {
        "start_ns": pa.array(start + off, pa.int64()),
        "end_ns": pa.array(end + off, pa.int64()),
        "pid": _ints(col["pid"]),
        "tid": _ints(col["tid"]),
        "queue_id": _ints(col["queue"]),
        "stream": _ints(col["stream"]),
        "correlation_id": corr,
        "name": pa.array([v if isinstance(v, str) else None for v in col["name"]], pa.string()),
    }
    if kind == "kernel":
        handles = np.array([a if isinstance(a, int) else -1 for a in col["agent"]], np.int64)
        for k in ("grid_x", "grid_y", "grid_z", "workgroup_x", "workgroup_y", "workgroup_z"):
            out[k] = _ints(col[k])
    else:
        names = [v if isinstance(v, str) else "" for v in col["name"]]
        to_host = np.array(["DEVICE_TO_HOST" in v for v in names], dtype=bool)
        src = np.array([a if isinstance(a, int) else -1 for a in col["src"]], np.int64)
        dst = np.array([a if isinstance(a, int) else -1 for a in col["dst"]], np.int64)
        handles = np.where(to_host, src, dst)
        out["bytes"] = _ints(col["bytes"])
    out["device"] = agents.map_handles(handles)
    if len(launches):
        launch = launches.columns(np.asarray(pc.fill_null(corr, -1).to_numpy(), dtype=np.int64), off)
        out["launch_start_ns"] = launch["launch_start_ns"]
        out["launch_end_ns"] = launch["launch_end_ns"]
        out["launch_name"] = launch["launch_name"]
        out["pid"] = pc.coalesce(out["pid"], launch["launch_pid"])
        out["tid"] = pc.coalesce(launch["launch_tid"], out["tid"])
    return stamp_kernels(out, n, ctx, kind)


@contextlib.contextmanager
def _connect(path: Path, max_bytes: int) -> Iterator[sqlite3.Connection]:
    """A read-only connection; a gzip-compressed database is decompressed to a temporary file first."""
    with path.open("rb") as fh:
        gz = fh.read(2) == GZIP_MAGIC
    tmp: tempfile.TemporaryDirectory[str] | None = None
    target = path
    try:
        if gz:
            tmp = tempfile.TemporaryDirectory(prefix="aaco-rocpd-")
            target = Path(tmp.name) / "trace.db"
            with gzip.open(path, "rb") as src, target.open("wb") as dst:
                copied = 0
                while chunk := src.read(1 << 20):
                    copied += len(chunk)
                    if copied > max_bytes:
                        raise ValueError(f"larger than the {max_bytes} byte limit")
                    dst.write(chunk)
        con = sqlite3.connect(f"{target.resolve().as_uri()}?mode=ro", uri=True)
        try:
            yield con
        finally:
            con.close()
    finally:
        if tmp is not None:
            shutil.rmtree(tmp.name, ignore_errors=True)


def parse_rocpd(path: Path, ctx: TraceContext, max_bytes: int = 1 << 40) -> Iterator[ParsedTrace]:
    """Stream a rocpd database as ``ParsedTrace`` chunks (iterations and devices on the first)."""
    with _connect(path, max_bytes) as con:
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"not a readable SQLite database: {exc}") from exc
        agents = _agents(con)
        try:
            launches = _launches(con)
            iterations = _iterations(con, ctx)
            pids = tuple(
                sorted(
                    {r[0] for r in con.execute("SELECT pid FROM rocpd_info_process") if isinstance(r[0], int)}
                    if _columns(con, "rocpd_info_process")
                    else set()
                )
            )
        except sqlite3.DatabaseError as exc:
            raise ValueError(f"not a rocpd database of a known schema: {exc}") from exc
        first = True
        skipped: Counter[str] = Counter()
        for kind, sql in (("kernel", _kernel_sql(con)), ("memcpy", _copy_sql(con))):
            if sql is None:
                continue
            try:
                cur = con.execute(sql)
            except sqlite3.DatabaseError as exc:
                skipped[f"unreadable_{kind}_table"] += 1
                del exc
                continue
            while True:
                try:
                    rows = cur.fetchmany(CHUNK_ROWS)
                except sqlite3.DatabaseError:
                    skipped["corrupt_database"] += 1
                    break
                if not rows:
                    break
                table = _table(rows, kind, ctx, agents, launches, skipped)
                if table is None:
                    continue
                its = iterations if first else iterations.slice(0, 0)
                first = False
                yield ParsedTrace(FORMAT, table, its, ctx.clock, Counter(skipped), pids, dict(agents.used))
                skipped.clear()
        if first or skipped:
            its = iterations if first else iterations.slice(0, 0)
            yield ParsedTrace(FORMAT, empty_kernels(ctx), its, ctx.clock, Counter(skipped), pids, dict(agents.used))
