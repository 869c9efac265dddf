"""Kineto events read a column at a time: ``kineto_events.collect``'s fast path for a batch of one role.

Reading an event at a time costs Python work per field (a type check, a range check, an append).
Here a batch of GPU work, launches or operators is read field by field, one list comprehension per
field, and each column is checked whole: the types in it (``map(type, ...)``: an int or null for
ids, a float or int for times, a string for names), int64 ranges (Arrow's conversion refuses what
does not fit), finite non-negative times (numpy) and names (``name_ok``, each distinct name once).
A batch that passes becomes Arrow and numpy columns holding exactly what ``kineto``'s per-event
rules give it. A batch with anything those rules would count, drop or convert (a number written as
a string, a bool, a float id, a time out of range, a long name, args that are not an object) is
refused (``None``) and read event by event, so the result is the same either way: the per-event
rules stay the one statement of what the values mean.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.json_values import TIME_OUT_OF_RANGE, name_ok, span_ns
from aaco.agent.sources.traces.kineto_categories import gpu_kind
from aaco.agent.sources.traces.launches import LaunchTable

F64, I64, STR = pa.float64(), pa.int64(), pa.string()
_INT_OR_NULL = frozenset((int, type(None)))
_NUMBER = frozenset((float, int))
_STR_OR_NULL = frozenset((str, type(None)))
_NONE3 = (None, None, None)


class Chunks:
    """Named columns kept in the chunks they were read in: whole arrays, or rows the per-event path staged as lists."""

    def __init__(self, types: dict[str, pa.DataType]) -> None:
        self.types = types
        self.rows: dict[str, list[Any]] = {k: [] for k in types}
        self._chunks: list[dict[str, pa.Array]] = []

    def add(self, cols: dict[str, pa.Array]) -> None:
        """One chunk of whole columns (every name in ``types``)."""
        self.flush()
        self._chunks.append(cols)

    def flush(self) -> None:
        """The staged rows, if any, as one chunk."""
        if any(self.rows.values()):
            self._chunks.append({k: pa.array(v, self.types[k]) for k, v in self.rows.items()})
            self.rows = {k: [] for k in self.types}

    def column(self, key: str) -> pa.Array:
        """One column, all chunks together."""
        self.flush()
        parts = [c[key] for c in self._chunks]
        return pa.concat_arrays(parts) if parts else pa.array([], self.types[key])


def ints(values: list[Any]) -> pa.Array | None:
    """``values`` as nullable int64 when each is an int within int64 or None (what ``need_int`` passes unchanged)."""
    if not set(map(type, values)) <= _INT_OR_NULL:
        return None
    try:
        return pa.array(values, I64)
    except OverflowError:
        return None


def tids(values: list[Any]) -> pa.Array | None:
    """A tid column as ``need_int`` reads it, PyTorch 1.8 and 1.9's strings included, or None.

    They wrote tids as strings: a thread's number (``"1890023232"``: the number) or a GPU lane's
    stream (``"stream 7"``: not a number, null). Any other string is left to the per-event rules.
    """
    if set(map(type, values)) <= _INT_OR_NULL:
        return ints(values)
    out: list[Any] = []
    for v in values:
        if type(v) is not str:
            out.append(v)
        elif v.isascii() and v.isdigit():
            out.append(int(v))
        elif v.startswith("stream"):
            out.append(None)
        else:
            return None
    return ints(out)


def times(values: list[Any]) -> np.ndarray | None:
    """``values`` as float64 when each is a finite number (what ``num`` passes); the same rounding as ``float()``."""
    if not set(map(type, values)) <= _NUMBER:
        return None
    try:
        out = np.array(values, dtype=np.float64)
    except OverflowError:
        return None
    return out if bool(np.isfinite(out).all()) else None


def names_ok(values: list[Any], *, nullable: bool) -> bool:
    """Whether each value is a string ``name_ok`` accepts (or None if ``nullable``), each distinct one checked once."""
    kinds = set(map(type, values))
    if not (kinds <= _STR_OR_NULL if nullable else kinds == {str}):
        return False
    return all(name_ok(n) for n in set(values) if n is not None)


def _dims(values: list[Any]) -> list[pa.Array] | None:
    """A ``grid`` / ``block`` column as x, y, z int64 columns: each value null or a list of 3 ints (or nulls)."""
    kinds = set(map(type, values))
    if not kinds <= {list, type(None)}:
        return None
    if type(None) in kinds:
        values = [_NONE3 if v is None else v for v in values]
    if set(map(len, values)) - {3}:
        return None
    flat = ints([x for v in values for x in v])
    if flat is None:
        return None
    at = np.arange(len(values), dtype=np.int64) * 3
    return [flat.take(at + k) for k in range(3)]


def _timed(events: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray, list[dict[str, Any]]] | None:
    """(ts, dur, args) of a batch whose times are all good and whose args are all objects."""
    ts, dur = times([e.get("ts") for e in events]), times([e.get("dur") for e in events])
    if ts is None or dur is None or bool((dur < 0).any()):
        return None
    args = [e.get("args") for e in events]
    if set(map(type, args)) != {dict}:
        return None
    return ts, dur, args


def gpu_columns(events: list[dict[str, Any]]) -> tuple[dict[str, Any], set[int], np.ndarray] | None:
    """A batch of GPU work as ``kineto``'s GPU columns, the lanes (pids) it ran on and its ends, or None.

    The kind comes from the category, in either of Kineto's schemas (``kineto_categories``); the op
    link from ``External id``, or ``external id`` as PyTorch 1.8 and 1.9 wrote it on GPU work.
    """
    timed = _timed(events)
    if timed is None:
        return None
    ts, dur, args = timed
    names = [e.get("name") for e in events]
    if not names_ok(names, nullable=False):
        return None
    lane_list = [e.get("pid") for e in events]
    lane, lane_tid = ints(lane_list), tids([e.get("tid") for e in events])
    got = {k: ints([a.get(key) for a in args]) for k, key in _GPU_ARGS.items()}
    got["ext"] = ints([a.get("External id", a.get("external id")) for a in args])
    grid, block = _dims([a.get("grid") for a in args]), _dims([a.get("block") for a in args])
    if lane is None or lane_tid is None or grid is None or block is None or any(v is None for v in got.values()):
        return None
    lanes = set(lane_list)
    lanes.discard(None)
    cols = {
        "name": pa.array(names, STR),
        "kind": pa.array([gpu_kind(e["cat"]) for e in events], STR),
        "device": pc.coalesce(got.pop("device"), lane),
        "stream": pc.coalesce(got.pop("stream"), lane_tid),
        **got,
        **dict(
            zip(("grid_x", "grid_y", "grid_z", "workgroup_x", "workgroup_y", "workgroup_z"), grid + block, strict=True)
        ),
        "ts": pa.array(ts, F64),
        "dur": pa.array(dur, F64),
    }
    return cols, lanes, ts + dur


_GPU_ARGS = {
    "correlation_id": "correlation",
    "device": "device",
    "stream": "stream",
    "bytes": "bytes",
}


def launch_columns(events: list[dict[str, Any]]) -> tuple[dict[str, Any], set[int], np.ndarray] | None:
    """A batch of launches as ``kineto``'s launch columns (those with a correlation id), pids and ends, or None."""
    timed = _timed(events)
    if timed is None:
        return None
    ts, dur, args = timed
    names = [e.get("name") for e in events]
    pid_list = [e.get("pid") for e in events]
    pid, tid, corr = ints(pid_list), tids([e.get("tid") for e in events]), ints([a.get("correlation") for a in args])
    if pid is None or tid is None or corr is None or not names_ok(names, nullable=True):
        return None
    pids = set(pid_list)
    pids.discard(None)
    cols = {"corr": corr, "pid": pid, "tid": tid, "ts": pa.array(ts, F64), "dur": pa.array(dur, F64)}
    cols["name"] = pa.array(names, STR)
    if corr.null_count:
        keep = corr.is_valid()
        cols = {k: v.filter(keep) for k, v in cols.items()}
    return cols, pids, ts + dur


def op_names(
    events: list[dict[str, Any]], ops: dict[int, str], names_seen: dict[str, str]
) -> tuple[None, set[int], np.ndarray] | None:
    """Fold a batch of operators into ``ops`` (External id to name, the first kept): (None, pids, ends), or None.

    ``names_seen`` holds one copy of each name (they repeat: memory).
    """
    timed = _timed(events)
    if timed is None:
        return None
    ts, dur, args = timed
    pid_list, names = [e.get("pid") for e in events], [e.get("name") for e in events]
    ext_list = [a.get("External id") for a in args]
    if ints(pid_list) is None or ints(ext_list) is None or not names_ok(names, nullable=True):
        return None
    first = {x: n for x, n in zip(reversed(ext_list), reversed(names), strict=True) if x is not None and n is not None}
    ops.update({x: names_seen.setdefault(n, n) for x, n in first.items() if x not in ops})
    pids = set(pid_list)
    pids.discard(None)
    return None, pids, ts + dur


def launch_table(launch: Chunks, offset_ns: int, skipped: Counter[str]) -> LaunchTable:
    """Launches in epoch ns, by correlation id (the last of a repeated id wins); out-of-range ones dropped."""
    corr = launch.column("corr")
    if not len(corr):
        return LaunchTable.empty()
    start, end, ok = span_ns(floats(launch.column("ts")), floats(launch.column("dur")), offset_ns)
    skipped[TIME_OUT_OF_RANGE] += int((~ok).sum())
    encoded = launch.column("name").dictionary_encode()
    names = [*encoded.dictionary.to_pylist(), ""]  # the last: the name of a launch without one (masked out)
    name_idx = encoded.indices.fill_null(len(names) - 1).to_numpy().astype(np.int32)
    pid, tid = (launch.column(k).fill_null(-1).to_numpy() for k in ("pid", "tid"))
    corr_ids = corr.to_numpy()
    return LaunchTable.build(corr_ids[ok], start[ok], end[ok], pid[ok], tid[ok], name_idx[ok], names)


def floats(values: pa.Array) -> np.ndarray:
    """A float64 column as numpy."""
    return values.to_numpy(zero_copy_only=False)


def op_name(ext: pa.Array, ops: dict[int, str]) -> pa.Array:
    """Each kernel's operator name by its External id (null: none)."""
    if not ops:
        return pa.nulls(len(ext), STR)
    at = pc.index_in(ext, value_set=pa.array(list(ops), I64))
    return pa.array(list(ops.values()), STR).take(at)
