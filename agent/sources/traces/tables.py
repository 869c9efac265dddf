"""Table builders of the trace parsers: kernels and iterations tables, constant columns, chunks.

Every parser turns a trace into ``ParsedTrace`` chunks of at most ``CHUNK_ROWS`` rows, with the
columns of the ``kernels`` and ``iterations`` schemas (``contract/schemas.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from fnmatch import fnmatchcase
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.agent.sources.traces.context import BadRow, TraceContext
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.contract.ids import span_id, trace_id
from aaco.contract.schemas import ITERATIONS

CHUNK_ROWS = 65_536

I64 = pa.int64()
STR = pa.string()


def const(value: Any, n: int, type_: pa.DataType = STR) -> pa.Array:
    """An array of ``n`` copies of ``value`` (null when ``value`` is None), built in C++."""
    if value is None:
        return pa.nulls(n, type_)
    return pa.repeat(pa.scalar(value, type_), n)


def typed_table(schema: pa.Schema, columns: dict[str, Any]) -> pa.Table:
    """A table of ``columns`` (lists or arrays) typed as ``schema`` declares them; an undeclared column raises."""
    return pa.table(
        {
            name: values
            if isinstance(values, pa.Array | pa.ChunkedArray)
            else pa.array(values, schema.field(name).type)
            for name, values in columns.items()
        }
    )


def stamp_kernels(cols: dict[str, pa.Array], n: int, ctx: TraceContext, kind: str | pa.Array) -> pa.Table:
    """A kernels table from ``cols`` plus the columns every row carries (node, source, run_id)."""
    out = dict(cols)
    out["node"] = const(ctx.node, n)
    out["source"] = const(ctx.source, n)
    out["run_id"] = const(ctx.run_id, n)
    out["kind"] = kind if isinstance(kind, pa.Array | pa.ChunkedArray) else const(kind, n)
    for name in ("pid", "tid", "stream", "correlation_id"):
        out.setdefault(name, pa.nulls(n, I64))
    out.setdefault("device", pa.nulls(n, STR))
    return pa.table(out)


def iteration_ranges(
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    pid: list[int | None],
    tid: list[int | None],
    names: list[str],
    patterns: tuple[str, ...] = (),
) -> np.ndarray:
    """Which ranges (rocTX, markers) are iterations: a mask.

    With ``patterns`` (a source's ``iteration_ranges``), the ranges whose name matches one of them
    (``fnmatch``: ``step*``), nested or not. Without, the outermost ranges of each thread (pid, tid):
    a range inside another one of its thread (starting no earlier, ending no later) is a phase of
    that iteration, not one of its own; of two identical ranges the first is kept. Ranges that
    overlap without one holding the other are both kept.
    """
    n = len(names)
    if patterns:
        return np.array([any(fnmatchcase(name, p) for p in patterns) for name in names], dtype=bool)
    keep = np.ones(n, dtype=bool)
    threads: dict[tuple[int | None, int | None], list[int]] = {}
    for i in range(n):
        threads.setdefault((pid[i], tid[i]), []).append(i)
    for idx in threads.values():
        at = np.array(idx, dtype=np.int64)
        at = at[np.lexsort((-end_ns[at], start_ns[at]))]  # by start, the longest first
        reach = np.maximum.accumulate(end_ns[at])
        keep[at[1:]] = end_ns[at[1:]] > reach[:-1]  # ends past every earlier-starting range: not inside one
    return keep


def iterations_table(
    ctx: TraceContext,
    *,
    start_ns: np.ndarray,
    end_ns: np.ndarray,
    pid: list[int | None],
    tid: list[int | None],
    names: list[str],
    keys: list[object],
) -> pa.Table:
    """Iterations (the ranges ``iteration_ranges`` keeps), in start order, with deterministic IDs from ``keys``."""
    keep = np.flatnonzero(iteration_ranges(start_ns, end_ns, pid, tid, names, ctx.iteration_ranges))
    if keep.size < len(names):
        start_ns, end_ns = np.asarray(start_ns)[keep], np.asarray(end_ns)[keep]
        pid, tid, names, keys = ([v[i] for i in keep] for v in (pid, tid, names, keys))
    order = np.argsort(start_ns, kind="stable")
    m = len(order)
    ks = [keys[i] for i in order]
    return typed_table(
        ITERATIONS,
        {
            "start_ns": start_ns[order],
            "end_ns": end_ns[order],
            "node": const(ctx.node, m),
            "pid": [pid[i] for i in order],
            "tid": [tid[i] for i in order],
            "model": const(ctx.model, m),
            "run_id": const(ctx.run_id, m),
            "trace_id": [trace_id(ctx.node, ctx.identity, "range", k) for k in ks],
            "span_id": [span_id(ctx.node, ctx.identity, "range", k) for k in ks],
            "source": const(ctx.source, m),
            "iteration": np.arange(m, dtype=np.int64),
            "name": [names[i] for i in order],
        },
    )


def empty_kernels(ctx: TraceContext) -> pa.Table:
    """A kernels table with no rows (the required columns only)."""
    return stamp_kernels({"start_ns": pa.array([], I64), "end_ns": pa.array([], I64)}, 0, ctx, "kernel")


def empty_iterations(ctx: TraceContext) -> pa.Table:
    """An iterations table with no rows."""
    z = np.zeros(0, dtype=np.int64)
    return iterations_table(ctx, start_ns=z, end_ns=z, pid=[], tid=[], names=[], keys=[])


def split_rows(table: pa.Table, rows: int = CHUNK_ROWS) -> Iterator[pa.Table]:
    """``table`` in slices of at most ``rows`` rows (zero-copy)."""
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)


def chunks(
    fmt: str,
    ctx: TraceContext,
    kernels: pa.Table,
    iterations: pa.Table | None = None,
    *,
    skipped: Counter[str] | None = None,
    bad_rows: list[BadRow] | None = None,
    pids: tuple[int, ...] = (),
    devices: dict[str, dict[str, Any]] | None = None,
) -> Iterator[ParsedTrace]:
    """Wrap tables as ``ParsedTrace`` chunks of at most ``CHUNK_ROWS`` kernels.

    The iterations, the skipped counts, the bad rows and the devices ride on the first chunk, so
    that a consumer publishing chunk by chunk sees iterations before their kernels.
    """
    its = iterations if iterations is not None else empty_iterations(ctx)
    parts = list(split_rows(kernels)) or [kernels]
    for i, part in enumerate(parts):
        first = i == 0
        yield ParsedTrace(
            fmt,
            part,
            its if first else its.slice(0, 0),
            ctx.clock,
            Counter(skipped or {}) if first else Counter(),
            pids,
            devices=dict(devices or {}) if first else {},
            bad_rows=list(bad_rows or []) if first else [],
        )
