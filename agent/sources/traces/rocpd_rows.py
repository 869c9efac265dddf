"""rocpd rows to ``kernels`` columns: SQLite values read as unsigned 64-bit, checked, counted.

See ``rocpd`` for how the values reach the database and the convention (``u64``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.context import MAX_NAME_BYTES, TraceContext
from aaco.agent.sources.traces.devices import AgentMap
from aaco.agent.sources.traces.launches import LaunchTable
from aaco.agent.sources.traces.tables import stamp_kernels
from aaco.agent.sources.traces.u64 import OUT_OF_RANGE, U64_MASK, TimeWindow, as_int, int64_column, u64_array

_DIGITS = re.compile(r"\s*[-+]?\d{1,40}\s*")
_INT63 = (1 << 63) - 1


def sql_int(v: Any) -> Any:
    """An SQLite value as a Python int (``u64.as_int``); TEXT that is an integer counts too."""
    if type(v) is int:
        return v
    if isinstance(v, str):
        return int(v) if _DIGITS.fullmatch(v) else None
    return as_int(v)


def sql_u64(v: Any) -> Any:
    """An SQLite value as an unsigned 64-bit int, ``OUT_OF_RANGE``, or None (see the module doc)."""
    if type(v) is int:
        return v & U64_MASK  # SQLite integers are signed 64-bit: a negative one is the same bits
    x = sql_int(v)
    if x is None or x is OUT_OF_RANGE:
        return x
    return x & U64_MASK if -(1 << 63) <= x <= U64_MASK else OUT_OF_RANGE


def small(v: Any) -> int | None:
    """A non-negative int that fits int64 (pid, index), else None."""
    x = sql_int(v)
    return x if isinstance(x, int) and 0 <= x <= _INT63 else None


def sql_id(v: Any) -> int | None:
    """An unsigned 64-bit id for an int64 column, None when absent or beyond 64 bits."""
    x = sql_u64(v)
    return None if x is OUT_OF_RANGE else x


KERNEL_FIELDS = (
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
COPY_FIELDS = ("start", "end", "pid", "tid", "src", "dst", "queue", "stream", "corr", "name", "bytes")


_NEEDED = {  # the fields of each kind read as unsigned 64-bit ids (start, end and name apart)
    "kernel": ("pid", "tid", "agent", "queue", "stream", "corr", *KERNEL_FIELDS[9:]),
    "memcpy": ("pid", "tid", "src", "dst", "queue", "stream", "corr", "bytes"),
}


def rows_table(
    rows: list[tuple[Any, ...]],
    kind: str,
    ctx: TraceContext,
    agents: AgentMap,
    launches: LaunchTable,
    skipped: Counter[str],
) -> pa.Table | None:
    """A ``kernels`` table of one fetched chunk of ``kind`` rows (None if none is kept); ``skipped`` counts the rest."""
    kept = _kept_rows(rows, kind, TimeWindow(ctx.clock.offset_ns), skipped)
    if kept is None:
        return None
    start, end, names, col = kept
    n = len(start)
    off = ctx.clock.offset_ns
    corr, corr_ok = u64_array(col["corr"])
    out: dict[str, Any] = {
        "start_ns": pa.array(np.array(start, np.int64) + off, pa.int64()),
        "end_ns": pa.array(np.array(end, np.int64) + off, pa.int64()),
        "pid": int64_column(col["pid"]),
        "tid": int64_column(col["tid"]),
        "queue_id": int64_column(col["queue"]),
        "stream": int64_column(col["stream"]),
        "correlation_id": pa.array(corr.view(np.int64), pa.int64(), mask=None if corr_ok is None else ~corr_ok),
        "name": pa.array(names, pa.string()),
    }
    out.update(_kernel_columns(col, agents) if kind == "kernel" else _copy_columns(col, names, agents))
    if len(launches):
        launch = launches.columns(corr, off, corr_ok)
        out["launch_start_ns"] = launch["launch_start_ns"]
        out["launch_end_ns"] = launch["launch_end_ns"]
        out["launch_name"] = launch["launch_name"]
        out["pid"] = pc.coalesce(out["pid"], launch["launch_pid"])
        out["tid"] = pc.coalesce(launch["launch_tid"], out["tid"])
    return stamp_kernels(out, n, ctx, kind)


def _kept_rows(
    rows: list[tuple[Any, ...]], kind: str, window: TimeWindow, skipped: Counter[str]
) -> tuple[list[int], list[int], list[str | None], dict[str, list[Any]]] | None:
    """(starts, ends, names, the ``_NEEDED`` id columns) of the usable rows; None when none is."""
    fields = KERNEL_FIELDS if kind == "kernel" else COPY_FIELDS
    at = {f: i for i, f in enumerate(fields)}
    needed = [at[f] for f in _NEEDED[kind]]
    name_at = at["name"]
    start, end, names = [], [], []
    ids: list[list[Any]] = [[] for _ in needed]
    for r in rows:
        s, e = sql_int(r[0]), sql_int(r[1])
        reason = window.reason(s, e)
        row = [sql_u64(r[i]) for i in needed]
        if reason is None and OUT_OF_RANGE in row:
            reason = "int_out_of_range"
        name = r[name_at]
        if reason is None and isinstance(name, str) and len(name) > MAX_NAME_BYTES:
            reason = "name_too_long"
        if reason is not None:
            skipped[reason] += 1
            continue
        start.append(s)
        end.append(e)
        names.append(name if isinstance(name, str) else None)
        for col, x in zip(ids, row, strict=True):
            col.append(x)
    if not start:
        return None
    return start, end, names, dict(zip(_NEEDED[kind], ids, strict=True))


def _kernel_columns(col: dict[str, list[Any]], agents: AgentMap) -> dict[str, pa.Array]:
    """The device (from the agent handle) and launch dimensions of kernel dispatches."""
    out = {"device": agents.map_handles(*u64_array(col["agent"]))}
    for k in ("grid_x", "grid_y", "grid_z", "workgroup_x", "workgroup_y", "workgroup_z"):
        out[k] = int64_column(col[k])
    return out


def _copy_columns(col: dict[str, list[Any]], names: list[str | None], agents: AgentMap) -> dict[str, pa.Array]:
    """The device (the source agent of a copy to the host, else the destination) and size of memory copies."""
    n = len(names)
    to_host = np.array(["DEVICE_TO_HOST" in (v or "") for v in names], dtype=bool)
    src, src_ok = u64_array(col["src"])
    dst, dst_ok = u64_array(col["dst"])
    ok = np.where(
        to_host, np.ones(n, bool) if src_ok is None else src_ok, np.ones(n, bool) if dst_ok is None else dst_ok
    )
    return {"device": agents.map_handles(np.where(to_host, src, dst), ok), "bytes": int64_column(col["bytes"])}
