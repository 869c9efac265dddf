"""Kineto's events read by Arrow's JSON reader a window at a time: ``kineto_events``' rules, no object per event.

Why: reading a window's events as dicts costs a Python object per event and per field, and then a
Python step per field to fold them into columns; on the 1M-event trace of
``benchmarks/kineto_memory.py`` that was two thirds of the read. Here ``pyarrow.json`` reads only the
fields the rules read (``SCHEMA``; the rest is parsed and dropped in C++) straight into columns, and
the window is folded with Arrow and numpy (``fold``).

The window (``kineto_stream``) holds whole events with a comma between each two. The comma of each
``}`` ``,`` ``{`` (whitespace allowed after it) becomes a newline and Arrow reads a stream of
objects. Exact, not a guess: a raw newline inside a string is invalid JSON, and so is a ``}`` ``{``
with no comma between inside an event, so Arrow refuses unless each replaced comma stood between
two events; and the events read must number the replaced commas plus one (no two events without a
comma between).

Exact or nothing: a window is folded here only when every value read is of the type the schema
says (Arrow refuses a string where a number is, a float where an int64 is, an int past int64) and
nothing in it is one the per-event rules would count, drop or convert: a time that is null, not
finite or a negative duration, a name that is null or too long, a ``grid`` not of three, an event
of a category nothing reads and that is not known to hold no GPU work (``Unrecognised`` counts
those), bytes that are not UTF-8. Where a rule tells a key that is null from one that is absent
(``External id`` before ``external id``, a collective's arguments) and such keys are in it, a
window holding a JSON ``null`` is refused too. A refused window is read as dicts (``kineto_events.collect``), as before.
What this path accepts and orjson would not, it reads as the window-by-window salvage would (the
standard library keeps an event with ``NaN`` in a field not read), except nesting: a field not read
may nest deeper than orjson's 1024 levels (Arrow's parser is iterative; the window's size bounds
it, ``kineto_stream.MAX_EVENT``).
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from aaco.agent.sources.traces.context import MAX_NAME_BYTES
from aaco.agent.sources.traces.json_values import INT_OUT_OF_RANGE, IntOutOfRangeError
from aaco.agent.sources.traces.kineto_categories import GPU_KINDS, NOT_GPU_WORK, ROLES
from aaco.agent.sources.traces.kineto_columns import F64, I64, STR
from aaco.agent.sources.traces.kineto_comms import PARAM_COMMS
from aaco.agent.sources.traces.kineto_events import STEP_PREFIX, Events, add_step, steps_among_ops
from aaco.contract.jobs import is_comm_kernel

_COMM_ARGS: Final = {
    "Collective name": STR,
    "In msg nelems": I64,
    "Out msg nelems": I64,
    "dtype": STR,
    "Group size": I64,
    "Process Group Name": STR,
}
_ARGS: Final = {
    "correlation": I64,
    "device": I64,
    "stream": I64,
    "bytes": I64,
    "grid": pa.list_(I64),
    "block": pa.list_(I64),
    "External id": I64,
    "external id": I64,
    **_COMM_ARGS,
    "name": STR,  # metadata events' (process_name)
    "labels": STR,  # metadata events' (process_labels)
}
_EVENT: Final = {"ph": STR, "cat": STR, "name": STR, "pid": I64, "tid": I64, "ts": F64, "dur": F64}
SCHEMA: Final = pa.schema([*_EVENT.items(), ("args", pa.struct(list(_ARGS.items())))])
_OPTIONS: Final = pj.ParseOptions(explicit_schema=SCHEMA, newlines_in_values=True, unexpected_field_behavior="ignore")
_COMMA, _CLOSE, _OPEN, _NEWLINE = b",}{\n"
_SPACE = np.zeros(256, dtype=bool)
_SPACE[list(b" \t\r\n")] = True
_MAX_SPACE = 16
_NULL_TEXT, _NULL = re.compile(b"null"), re.compile(rb"[:\[,]\s*null\b")
_DIMS: Final = (("grid", ("grid_x", "grid_y", "grid_z")), ("block", ("workgroup_x", "workgroup_y", "workgroup_z")))


class WindowReader:
    """One file's windows read by Arrow through one scratch buffer (``fold_window``).

    Why a scratch buffer: Arrow may still hold the buffer it was given for a moment after
    ``read_json`` returns (its read-ahead threads, after a refusal), so it never gets a view of the
    stream's window, which must stay free to grow and shrink; and a reused buffer costs no fresh
    pages per window (fresh copies' page faults cost as much as the parse). A buffer Arrow may still
    hold is replaced, never resized.
    """

    def __init__(self) -> None:
        self._scratch = bytearray()

    def fold_window(self, raw: memoryview, skipped: Counter[str], out: Events) -> int | None:
        """Fold a window's events (whole, commas between) into ``out``: how many, or None (refused, nothing done)."""
        table = self.read(raw)
        if table is None:
            return None
        return table.num_rows if fold(table, raw, skipped, out) else None

    def read(self, raw: memoryview) -> pa.Table | None:
        """The window's events as columns of ``SCHEMA``, or None where Arrow reads them otherwise than orjson would."""
        n = len(raw)
        if len(self._scratch) < n:
            self._scratch = bytearray(max(n, 2 * len(self._scratch)))
        text = memoryview(self._scratch)[:n]
        text[:] = raw
        a = np.frombuffer(text, np.uint8)
        if n and int(a.max()) >= 0x80:
            try:
                str(text, "utf-8")
            except UnicodeDecodeError:  # orjson refuses the window; the salvage drops the event
                return None
        commas = _between(a)
        if commas is None:
            return None
        a[commas] = _NEWLINE
        try:
            table = pj.read_json(pa.BufferReader(pa.py_buffer(text)), parse_options=_OPTIONS)
        except pa.ArrowException:
            return None
        return table.flatten() if table.num_rows == commas.size + 1 else None


def _between(a: np.ndarray) -> np.ndarray | None:
    """The offsets of the commas between a ``}`` and a ``{`` in ``a``; None: an odd layout.

    Vectorised (a regex over the window took twice as long): the commas right after a ``}``, and of
    those the ones whose next byte past whitespace is ``{``. A comma with whitespace before it is
    left alone (Arrow then refuses the window); more than ``_MAX_SPACE`` bytes of whitespace after
    one is a layout this does not read: None.
    """
    commas = np.flatnonzero(a == _COMMA)
    commas = commas[commas > 0]
    commas = commas[a[commas - 1] == _CLOSE]
    nxt, last = commas + 1, a.size - 1
    for _ in range(_MAX_SPACE):
        space = _SPACE[a[np.minimum(nxt, last)]]
        if not space.any():
            break
        nxt[space] += 1
    else:
        return None
    return commas[a[np.minimum(nxt, last)] == _OPEN]


def fold(t: pa.Table, raw: memoryview, skipped: Counter[str], out: Events) -> bool:
    """Fold the events into ``out`` as ``kineto_events.collect`` would, or change nothing and say False."""
    cols = {k: t.column(k).combine_chunks() for k in t.column_names}
    ph, cat = cols["ph"], cols["cat"]
    is_x = pc.fill_null(pc.equal(ph, "X"), False)
    cats = pc.unique(cat.filter(is_x)).to_pylist()
    by_role: dict[str, list[str]] = {}
    for c in cats:
        r = ROLES.get(c.lower()) if c is not None else None
        if r is None and (c is None or c.lower() not in NOT_GPU_WORK):
            return False  # an unrecognised category: counted by the per-event path
        if r is not None:
            by_role.setdefault(r, []).append(c)
    rows = {r: pc.and_(is_x, pc.is_in(cat, pa.array(cs, STR))) for r, cs in by_role.items()}
    known = pc.and_(is_x, pc.is_in(cat, pa.array([c for cs in by_role.values() for c in cs], STR)))
    ts, dur = _floats(cols["ts"].filter(known)), _floats(cols["dur"].filter(known))
    if not (np.isfinite(ts).all() and np.isfinite(dur).all() and (dur >= 0).all()):
        return False  # bad_time
    plan = _Plan(cols, raw)
    if not plan.gpu(rows.get("gpu")) or not plan.launch(rows.get("launch")) or not plan.op(rows.get("op")):
        return False
    plan.meta(pc.fill_null(pc.equal(ph, "M"), False))
    plan.steps(rows.get("ann"))
    plan.commit(out, skipped, ts + dur)
    return True


class _Plan:
    """What a window adds to ``Events``, checked whole before any of it is added (``commit``)."""

    def __init__(self, cols: dict[str, pa.Array], raw: memoryview) -> None:
        self.cols = cols
        self.raw = raw
        self._no_null: bool | None = None
        self.gpu_cols: dict[str, pa.Array] | None = None
        self.launch_cols: dict[str, pa.Array] | None = None
        self.lanes: set[int] = set()
        self.launch_pids: set[int] = set()
        self.op_pids: set[int] = set()
        self.ops: list[tuple[int, str]] = []
        self.comm_kernels: list[dict[str, Any]] = []
        self.comm_ops: list[dict[str, Any]] = []
        self.step_ops: list[dict[str, Any]] = []
        self.step_anns: list[dict[str, Any]] = []
        self.meta_events: list[dict[str, Any]] = []

    def col(self, key: str, mask: pa.Array) -> pa.Array:
        return self.cols[key].filter(mask)

    def dicts(self, mask: pa.Array) -> list[dict[str, Any]]:
        """The events ``mask`` picks back as dicts of the fields read (absent where null), for the per-event rules."""
        out = []
        for row in pa.table(self.cols).filter(mask).to_pylist():
            ev = {k: v for k, v in row.items() if v is not None and not k.startswith("args.")}
            ev["args"] = {k[5:]: v for k, v in row.items() if v is not None and k.startswith("args.")}
            out.append(ev)
        return out

    def no_null(self) -> bool:
        """Whether the window holds no JSON ``null`` (so a null column value is an absent key)."""
        if self._no_null is None:
            self._no_null = _NULL_TEXT.search(self.raw) is None or _NULL.search(self.raw) is None
        return self._no_null

    def gpu(self, mask: pa.Array | None) -> bool:
        if mask is None:
            return True
        names = self.col("name", mask)
        if not _names_ok(names, nullable=False):
            return False
        ext, old_ext = self.col("args.External id", mask), self.col("args.external id", mask)
        if old_ext.null_count < len(old_ext) and pc.any(pc.and_(ext.is_null(), old_ext.is_valid())).as_py():
            if not self.no_null():  # ``"External id": null`` would hide ``external id``
                return False
            ext = pc.coalesce(ext, old_ext)
        cols: dict[str, Any] = {"name": names, "kind": _kinds(self.col("cat", mask))}
        lane, lane_tid = self.col("pid", mask), self.col("tid", mask)
        cols["device"] = pc.coalesce(self.col("args.device", mask), lane)
        cols["stream"] = pc.coalesce(self.col("args.stream", mask), lane_tid)
        cols["ext"] = ext
        cols["correlation_id"] = self.col("args.correlation", mask)
        cols["bytes"] = self.col("args.bytes", mask)
        for key, names3 in _DIMS:
            dims = _dims(self.col(f"args.{key}", mask))
            if dims is None:
                return False
            cols.update(zip(names3, dims, strict=True))
        cols["ts"], cols["dur"] = self.col("ts", mask), self.col("dur", mask)
        comm = [n for n in pc.unique(names).to_pylist() if is_comm_kernel(n)]
        if comm:
            if not self.no_null():
                return False
            self.comm_kernels = self.dicts(pc.and_(mask, pc.is_in(self.cols["name"], pa.array(comm, STR))))
        self.gpu_cols = cols
        self.lanes = _distinct(lane)
        return True

    def launch(self, mask: pa.Array | None) -> bool:
        if mask is None:
            return True
        names = self.col("name", mask)
        if not _names_ok(names, nullable=True):
            return False
        pid = self.col("pid", mask)
        self.launch_pids = _distinct(pid)
        corr = self.col("args.correlation", mask)
        cols = {"corr": corr, "pid": pid, "tid": self.col("tid", mask), "ts": self.col("ts", mask)}
        cols |= {"dur": self.col("dur", mask), "name": names}
        if corr.null_count:
            keep = corr.is_valid()
            cols = {k: v.filter(keep) for k, v in cols.items()}
        self.launch_cols = cols
        return True

    def op(self, mask: pa.Array | None) -> bool:
        if mask is None:
            return True
        names = self.col("name", mask)
        if not _names_ok(names, nullable=True):
            return False
        if pc.any(pc.equal(names, PARAM_COMMS)).as_py():
            if not self.no_null():
                return False
            comm = pc.fill_null(pc.equal(self.cols["name"], PARAM_COMMS), False)
            self.comm_ops = self.dicts(pc.and_(mask, comm))
        steps = pc.fill_null(pc.starts_with(self.cols["name"], STEP_PREFIX), False)
        if pc.any(pc.and_(mask, steps)).as_py():
            self.step_ops = self.dicts(pc.and_(mask, steps))
        self.op_pids = _distinct(self.col("pid", mask))
        ext = self.col("args.External id", mask)
        both = pc.and_(ext.is_valid(), names.is_valid())
        if pc.any(both).as_py():
            ext_np = ext.filter(both).to_numpy()
            _, first = np.unique(ext_np, return_index=True)
            first.sort()  # the first event of each External id, in file order
            kept_names = names.filter(both).take(pa.array(first)).to_pylist()
            self.ops = list(zip(ext_np[first].tolist(), kept_names, strict=True))
        return True

    def meta(self, mask: pa.Array) -> None:
        if pc.any(mask).as_py():
            self.meta_events = self.dicts(mask)

    def steps(self, mask: pa.Array | None) -> None:
        if mask is None:
            return
        steps = pc.and_(mask, pc.fill_null(pc.starts_with(self.cols["name"], STEP_PREFIX), False))
        if pc.any(steps).as_py():
            self.step_anns = self.dicts(steps)

    def commit(self, out: Events, skipped: Counter[str], ends: np.ndarray) -> None:
        """Add what was checked, in ``collect``'s order."""
        for ev in self.meta_events:
            out.procs.add(ev, skipped)
        if self.gpu_cols is not None:
            out.comms.add_kernels(self.comm_kernels)
            out.gpu.add(self.gpu_cols)
            out.gpu_lanes |= self.lanes
        if self.launch_cols is not None:
            out.launch.add(self.launch_cols)
            out.launch_pids |= self.launch_pids
        steps_among_ops(self.step_ops, skipped, out)
        out.comms.add_ops(self.comm_ops)
        names = out.names
        out.ops.update({x: names.setdefault(n, n) for x, n in self.ops if x not in out.ops})
        out.op_pids |= self.op_pids
        for ev in self.step_anns:
            try:
                add_step(out, ev, ev["ts"], ev["dur"], {}, skipped)
            except IntOutOfRangeError:
                skipped[INT_OUT_OF_RANGE] += 1
        out.end_chunks.append(ends)


def _distinct(values: pa.Array) -> set[int]:
    """The distinct values of an int column, nulls left out (the pids a role's events ran on)."""
    return set(pc.unique(values.drop_null()).to_pylist())


def _floats(values: pa.Array) -> np.ndarray:
    """A float64 column as numpy, null as NaN (refused with the non-finite)."""
    return values.to_numpy(zero_copy_only=False)


def _names_ok(names: pa.Array, *, nullable: bool) -> bool:
    """Each name present (unless ``nullable``) and at most ``MAX_NAME_BYTES`` (Arrow's strings are valid UTF-8)."""
    if names.null_count and not nullable:
        return False
    longest = pc.max(pc.binary_length(names)).as_py()
    return longest is None or longest <= MAX_NAME_BYTES


def _kinds(cats: pa.Array) -> pa.Array:
    """Each GPU event's kind (kernel, memcpy, memset) from its category."""
    distinct = pc.unique(cats)
    kinds = pa.array([GPU_KINDS[c.lower()] for c in distinct.to_pylist()], STR)
    return kinds.take(pc.index_in(cats, value_set=distinct))


def _dims(values: pa.Array) -> list[pa.Array] | None:
    """A ``grid`` / ``block`` column as x, y, z (null where absent); None when a list is not of three."""
    lengths = pc.list_value_length(values)
    if pc.any(pc.not_equal(lengths, 3)).as_py():
        return None
    return [pc.list_element(values, k) for k in range(3)]
