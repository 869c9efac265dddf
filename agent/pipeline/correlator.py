"""The correlator: gives kernel events the trace context of the iteration that launched them.

First form (docs/architecture.md): by process and time containment. Iterations (an ORT ``model_run``,
a Kineto ``ProfilerStep#N``) are indexed per (node, pid); a kernel belongs to the iteration of its
process whose [start, end] contains the kernel's *launch* time (its CPU launch call, when the
source has one — GPU work runs after the launching step ended — else its own start).

Iterations usually arrive before their kernels (sources publish them first). A kernel newer than
every known iteration of its process may still get one, so it is held for ``hold_s`` (bounded by
``max_pending_events``) before it leaves without a trace; ``flush`` releases everything at shutdown.
Kernels of a process with no iteration known at all go on at once: holding every kernel of a
trace without iterations would only delay (and buffer) all of it.
Memory is bounded: at most ``max_iterations_per_process`` iterations per process and
``max_processes`` processes are indexed (oldest forgotten first).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.contract.schemas import EventBatch
from aaco.contract.signals import define
from aaco.contract.stats import EVENTS_EMITTED, EVENTS_RECEIVED, Stats

CORRELATED = define(
    "aaco.correlator.kernels",
    "aaco_correlator_kernels",
    "counter",
    "{event}",
    "Kernel events by correlation outcome: matched to an iteration, or not.",
    ("outcome",),
)

_CONTEXT_COLUMNS = ("trace_id", "parent_span_id", "model", "run_id", "iteration")


@dataclass
class _Index:
    """Iterations of one process, sorted by start."""

    starts: np.ndarray
    ends: np.ndarray
    trace_ids: np.ndarray
    span_ids: np.ndarray
    models: np.ndarray
    run_ids: np.ndarray
    iterations: np.ndarray

    def concat(self, other: _Index) -> _Index:
        return _Index(*(np.concatenate([a, b]) for a, b in zip(self.columns(), other.columns(), strict=True)))

    def newest(self, limit: int) -> _Index:
        """Sorted by start, keeping the ``limit`` latest."""
        order = np.argsort(self.starts, kind="stable")[-limit:]
        return _Index(*(c[order] for c in self.columns()))

    def columns(self) -> tuple[np.ndarray, ...]:
        return (self.starts, self.ends, self.trace_ids, self.span_ids, self.models, self.run_ids, self.iterations)


def _np(col: pa.Array | pa.ChunkedArray, fill: object) -> np.ndarray:
    return col.fill_null(fill).to_numpy(zero_copy_only=False)


def _with_columns(batch: pa.RecordBatch, values: dict[str, pa.Array]) -> pa.RecordBatch:
    arrays = [values.get(name, batch.column(i)) for i, name in enumerate(batch.schema.names)]
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)


class Correlator:
    """Assigns trace context to kernel batches; passes every other kind through unchanged."""

    def __init__(
        self,
        stats: Stats,
        hold_s: float = 2.0,
        max_pending_events: int = 200_000,
        max_iterations_per_process: int = 100_000,
        max_processes: int = 4096,
        clock: object = time.monotonic,
    ) -> None:
        self._stats = stats
        self._hold_s = hold_s
        self._max_pending = max_pending_events
        self._max_iter = max_iterations_per_process
        self._max_proc = max_processes
        self._clock = clock
        self._index: OrderedDict[tuple[str, int], _Index] = OrderedDict()
        self._pending: deque[tuple[float, EventBatch]] = deque()
        self._pending_rows = 0

    @property
    def pending_events(self) -> int:
        """Kernel events held, waiting for an iteration."""
        return self._pending_rows

    def release_in(self) -> float | None:
        """Seconds until the oldest held kernel is due for release (None when none is held)."""
        if not self._pending:
            return None
        return max(0.0, self._pending[0][0] - self._clock())  # type: ignore[operator]

    def process(self, item: EventBatch) -> list[EventBatch]:
        """Fold one batch in; return the batches ready to go on (possibly none, possibly several)."""
        self._stats.inc(EVENTS_RECEIVED, item.rows, component="correlator")
        out: list[EventBatch] = []
        if item.kind == "iterations":
            self._add_iterations(item.batch)
            out.append(item)
            out += self._retry_pending()
        elif item.kind == "kernels":
            out += self._assign(item, hold=True)
        else:
            out.append(item)
        out += self.expire()
        self._emitted(out)
        return out

    def expire(self, now: float | None = None) -> list[EventBatch]:
        """Release held kernels whose hold time passed, or the oldest when over the cap."""
        now = self._clock() if now is None else now  # type: ignore[operator]
        out: list[EventBatch] = []
        while self._pending and (self._pending[0][0] <= now or self._pending_rows > self._max_pending):
            _, item = self._pending.popleft()
            self._pending_rows -= item.rows
            self._stats.inc(CORRELATED, item.rows, outcome="unmatched")
            out.append(item)
        return out

    def flush(self) -> list[EventBatch]:
        """Release every held kernel (shutdown)."""
        out = self.expire(now=float("inf"))
        self._emitted(out)
        return out

    def _emitted(self, out: list[EventBatch]) -> None:
        n = sum(b.rows for b in out)
        if n:
            self._stats.inc(EVENTS_EMITTED, n, component="correlator")

    def _add_iterations(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        nodes = _np(batch.column("node"), "")
        pids = _np(batch.column("pid"), -1).astype(np.int64)
        cols = {
            "starts": _np(batch.column("start_ns"), 0).astype(np.int64),
            "ends": _np(batch.column("end_ns"), 0).astype(np.int64),
            "trace_ids": _np(batch.column("trace_id"), None),
            "span_ids": _np(batch.column("span_id"), None),
            "models": _np(batch.column("model"), None),
            "run_ids": _np(batch.column("run_id"), None),
            "iterations": _np(batch.column("iteration"), -1).astype(np.int64),
        }
        for node, pid in {(str(n), int(p)) for n, p in zip(nodes, pids, strict=True)}:
            mask = (nodes == node) & (pids == pid)
            new = _Index(**{k: v[mask] for k, v in cols.items()})
            key = (node, pid)
            old = self._index.pop(key, None)
            self._index[key] = (new if old is None else old.concat(new)).newest(self._max_iter)
            while len(self._index) > self._max_proc:
                self._index.popitem(last=False)

    def _retry_pending(self) -> list[EventBatch]:
        held = list(self._pending)
        self._pending.clear()
        self._pending_rows = 0
        out: list[EventBatch] = []
        for deadline, item in held:
            for batch in self._assign(item, hold=True, deadline=deadline):
                out.append(batch)
        return out

    def _assign(self, item: EventBatch, hold: bool, deadline: float | None = None) -> list[EventBatch]:
        batch = item.batch
        n = batch.num_rows
        if n == 0:
            return [item]
        if batch.column("trace_id").null_count == 0:
            self._stats.inc(CORRELATED, n, outcome="matched")
            return [item]
        t = pc.coalesce(batch.column("launch_start_ns"), batch.column("start_ns"))
        times = _np(t, 0).astype(np.int64)
        # (node, pid) as one integer per row: node's dictionary code above, pid (+2**32) below
        enc = pc.dictionary_encode(batch.column("node"))
        node_names = enc.dictionary.to_pylist()
        keys = (enc.indices.to_numpy(zero_copy_only=False).astype(np.int64) << 33) + (
            _np(batch.column("pid"), -1).astype(np.int64) + (1 << 32)
        )
        unique = np.unique(keys)
        hit = np.full(n, -1, dtype=np.int64)
        later = np.zeros(n, dtype=bool)  # newer than every known iteration of its process
        fields: dict[str, np.ndarray] = {}
        for key in unique.tolist():
            node, pid = node_names[key >> 33], (key & ((1 << 33) - 1)) - (1 << 32)
            mask = keys == key if unique.size > 1 else np.ones(n, dtype=bool)
            index = self._index.get((node, pid))
            if index is None or index.starts.size == 0:
                continue  # no iteration of this process is known: nothing to wait for
            rows = np.nonzero(mask)[0]
            pos = np.searchsorted(index.starts, times[rows], side="right") - 1
            ok = pos >= 0
            ok[ok] = times[rows][ok] <= index.ends[pos[ok]]
            matched_rows, matched_pos = rows[ok], pos[ok]
            if matched_rows.size and not fields:
                fields = {
                    "trace_id": np.full(n, None, dtype=object),
                    "parent_span_id": np.full(n, None, dtype=object),
                    "model": np.full(n, None, dtype=object),
                    "run_id": np.full(n, None, dtype=object),
                    "iteration": np.full(n, -1, dtype=np.int64),
                }
            if matched_rows.size:
                hit[matched_rows] = matched_pos
                fields["trace_id"][matched_rows] = index.trace_ids[matched_pos]
                fields["parent_span_id"][matched_rows] = index.span_ids[matched_pos]
                fields["model"][matched_rows] = index.models[matched_pos]
                fields["run_id"][matched_rows] = index.run_ids[matched_pos]
                fields["iteration"][matched_rows] = index.iterations[matched_pos]
            later[rows[~ok]] = times[rows[~ok]] > index.ends.max()
        # A row that already has a trace (set by its source) keeps its own context whole; the others
        # take trace, parent and iteration from their matched iteration together, never mixed.
        own = _np(batch.column("trace_id").is_valid(), False).astype(bool)
        matched = (hit >= 0) & ~own
        values = {}
        for name in _CONTEXT_COLUMNS if fields else ():
            existing = batch.column(name)
            arr = fields[name]
            if name == "iteration":
                new = pa.array(np.where(matched, arr, 0), type=pa.int64(), mask=~matched)
            else:
                new = pa.array(np.where(matched, arr, None), type=pa.string())
            if name in ("run_id", "model"):
                # the capture's identity and the model a source stamped stay; the match fills the gaps
                values[name] = pc.coalesce(existing, new)
            else:
                values[name] = pc.if_else(pa.array(own), existing, new)
        out_batch = _with_columns(batch, values) if values else batch
        hold_mask = ~matched & ~own & later if hold else np.zeros(n, dtype=bool)
        go_mask = ~hold_mask
        out: list[EventBatch] = []
        n_matched = int((matched | own).sum())
        if n_matched:
            self._stats.inc(CORRELATED, n_matched, outcome="matched")
        if go_mask.all():
            self._stats.inc(CORRELATED, int(n - n_matched), outcome="unmatched")
            return [item.derive(out_batch)]
        if go_mask.any():
            go = out_batch.filter(pa.array(go_mask))
            self._stats.inc(CORRELATED, int(go.num_rows - n_matched), outcome="unmatched")
            out.append(item.derive(go))
        held = item.derive(batch if hold_mask.all() else batch.filter(pa.array(hold_mask)))
        for r in item.ranges:  # one batch became two (what goes on and what is held): one more piece
            if out:
                r.add_pieces(1)
        due = deadline if deadline is not None else self._clock() + self._hold_s  # type: ignore[operator]
        self._pending.append((due, held))
        self._pending_rows += held.rows
        return out
