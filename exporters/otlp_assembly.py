"""Trace assembly for OTLP export: roots held briefly, kernels streamed within a span budget.

One trace per iteration (its root span is the iteration) or, for kernels no iteration claimed, one
trace per capture window (``run_id``). Kernel spans go out as they come, children of their root,
within two budgets: at most ``max_kernel_spans_per_trace`` per trace, and a node-wide token bucket
of ``max_spans_per_second``. Kernels beyond either are *summarised*: counted on the root span
(``aaco.kernels.total``, ``.exported``, ``.summarized``, busy time, top families) and in
``aaco_spans_summarized_total{reason}``. So for every trace, exported kernel spans plus the
summarised count equal the kernels the source read: nothing vanishes silently.

Roots are held open for ``window_s`` after their trace's last kernel (at most ``max_hold_s``) so
that the summary is complete when they are sent; meanwhile off-CPU intervals of the iteration's
process (from the scheduler source) are attached as span events. Open traces are bounded
(``max_open_traces``, oldest closed first).
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.pipeline.ids import span_id, trace_id
from aaco.agent.pipeline.schemas import EventBatch
from aaco.agent.pipeline.signals import define
from aaco.agent.pipeline.stats import Stats
from aaco.analyzers.kernels import families

from .otlp_spans import RootSpan, SpanEncoder, SpanEvent

SPANS_SUMMARIZED = define(
    "aaco.spans.summarized",
    "aaco_spans_summarized",
    "counter",
    "{span}",
    "Kernel spans not sent but counted on their trace's root span, by budget (trace or rate).",
    ("reason",),
)
SPANS_EXPORTED = define(
    "aaco.spans.encoded",
    "aaco_spans_encoded",
    "counter",
    "{span}",
    "Spans encoded for OTLP export, by kind (root, kernel, launch).",
    ("kind",),
)

MAX_EVENTS_PER_ROOT = 32


@dataclass
class _Trace:
    root: RootSpan | None
    pid: int | None
    opened: float
    deadline: float
    total: int = 0
    exported: int = 0
    summarized: int = 0
    busy_ns: int = 0
    fam_busy: Counter[str] = field(default_factory=Counter)
    fam_count: Counter[str] = field(default_factory=Counter)


class TokenBucket:
    """A rate limit in spans per second with a burst of one second's worth."""

    def __init__(self, rate: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.tokens = rate
        self._clock = clock
        self._last = clock()

    def take(self, n: int) -> int:
        """Take up to ``n`` tokens; return how many were granted."""
        now = self._clock()
        self.tokens = min(self.rate, self.tokens + (now - self._last) * self.rate)
        self._last = now
        granted = int(min(n, self.tokens))
        self.tokens -= granted
        return granted


class TraceAssembler:
    """Turns event batches into encoded spans (see the module docstring)."""

    def __init__(
        self,
        node: str,
        stats: Stats,
        max_kernel_spans_per_trace: int = 2000,
        max_spans_per_second: float = 50_000,
        window_s: float = 2.0,
        max_hold_s: float = 30.0,
        max_open_traces: int = 20_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.stats = stats
        self.per_trace = max_kernel_spans_per_trace
        self.window_s = window_s
        self.max_hold_s = max_hold_s
        self.max_open = max_open_traces
        self._clock = clock
        self._bucket = TokenBucket(max_spans_per_second, clock)
        self._encoder = SpanEncoder()
        self._open: OrderedDict[bytes, _Trace] = OrderedDict()
        self._closed: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # late kernels: (exported, total)
        self._offcpu: OrderedDict[int, deque[tuple[int, int, int]]] = OrderedDict()  # pid -> (start, end, tid)

    @property
    def open_traces(self) -> int:
        """Traces whose root is being held."""
        return len(self._open)

    # -- input --------------------------------------------------------------------------------------

    def add(self, item: EventBatch) -> list[bytes]:
        """Fold a batch in; return the spans ready to send now."""
        if item.rows == 0:
            return []
        if item.kind == "iterations":
            self._add_iterations(item.batch)
            return self.expire()
        if item.kind == "kernels":
            return self._add_kernels(item.batch, item.source) + self.expire()
        if item.kind == "sched":
            self._add_offcpu(item.batch)
        return self.expire()

    def _trace(self, tid: bytes, now: float) -> _Trace:
        t = self._open.get(tid)
        if t is None:
            t = self._open[tid] = _Trace(None, None, now, now + self.window_s)
        return t

    def _add_iterations(self, b: pa.RecordBatch) -> None:
        now = self._clock()
        rows = b.select(
            [
                "trace_id",
                "span_id",
                "start_ns",
                "end_ns",
                "name",
                "model",
                "iteration",
                "run_id",
                "pid",
                "tid",
                "source",
                "provider",
            ]
        ).to_pylist()
        for r in rows:
            if r["trace_id"] is None or r["span_id"] is None:
                continue
            tid = bytes.fromhex(r["trace_id"])
            t = self._trace(tid, now)
            name = (r["name"] or "iteration").split("#", 1)[0]
            attrs = {
                "aaco.model": r["model"],
                "aaco.iteration": r["iteration"],
                "aaco.run_id": r["run_id"],
                "process.pid": r["pid"],
                "thread.id": r["tid"],
                "aaco.source": r["source"],
                "aaco.provider": r["provider"],
                "aaco.span.kind": "iteration",
            }
            t.root = RootSpan(
                tid,
                bytes.fromhex(r["span_id"]),
                name,
                r["start_ns"],
                r["end_ns"],
                {k: v for k, v in attrs.items() if v is not None},
            )
            t.pid = r["pid"]

    def _add_offcpu(self, b: pa.RecordBatch) -> None:
        sel = b.filter(pc.is_valid(b.column("offcpu_start_ns")))
        for r in sel.select(["pid", "tid", "offcpu_start_ns", "offcpu_end_ns"]).to_pylist():
            if r["pid"] is None or r["offcpu_end_ns"] is None:
                continue
            q = self._offcpu.get(r["pid"])
            if q is None:
                q = self._offcpu[r["pid"]] = deque(maxlen=1000)
                while len(self._offcpu) > 1024:
                    self._offcpu.popitem(last=False)
            q.append((r["offcpu_start_ns"], r["offcpu_end_ns"], r["tid"] or 0))

    def _add_kernels(self, b: pa.RecordBatch, source: str) -> list[bytes]:
        now = self._clock()
        # Kernels no iteration claimed: one trace per capture window (run), rooted in a window span.
        orphan = pc.is_null(b.column("trace_id"))
        if pc.any(orphan).as_py():
            b = self._window_context(b, orphan, source, now)
        tids = b.column("trace_id").to_numpy(zero_copy_only=False)
        fams = families(b.column("name"), b.column("kind"))
        dur = (b.column("end_ns").to_numpy() - b.column("start_ns").to_numpy()).astype(np.int64)
        keep = np.zeros(b.num_rows, dtype=bool)
        for tid_hex in dict.fromkeys(tids.tolist()):
            rows = np.nonzero(tids == tid_hex)[0]
            tid = bytes.fromhex(tid_hex)
            if tid in self._closed and tid not in self._open:
                exported, total = self._closed[tid]
                room = max(0, self.per_trace - exported)
                t = None
            else:
                t = self._trace(tid, now)
                t.deadline = min(t.opened + self.max_hold_s, max(t.deadline, now + self.window_s))
                room = max(0, self.per_trace - t.exported)
            n = rows.size
            by_trace = min(n, room)
            granted = self._bucket.take(by_trace)
            keep[rows[:granted]] = True
            if by_trace < n:
                self.stats.inc(SPANS_SUMMARIZED, n - by_trace, reason="trace_budget")
            if granted < by_trace:
                self.stats.inc(SPANS_SUMMARIZED, by_trace - granted, reason="rate_budget")
            if t is None:
                self._closed[tid] = (exported + granted, total + n)
                continue
            t.total += n
            t.exported += granted
            t.summarized += n - granted
            t.busy_ns += int(dur[rows].sum())
            for fam, d in zip(fams[rows].tolist(), dur[rows].tolist(), strict=True):
                t.fam_busy[fam] += d
                t.fam_count[fam] += 1
        spans = self._encoder.kernel_spans(b.filter(pa.array(keep))) if keep.any() else []
        kernels = int(keep.sum())
        self.stats.inc(SPANS_EXPORTED, kernels, kind="kernel")
        self.stats.inc(SPANS_EXPORTED, len(spans) - kernels, kind="launch")  # a launch goes with its kernel
        return spans

    def _window_context(self, b: pa.RecordBatch, orphan: pa.Array, source: str, now: float) -> pa.RecordBatch:
        runs = pc.fill_null(b.column("run_id"), source).to_pylist()
        mask = orphan.to_numpy(zero_copy_only=False)
        starts, ends = b.column("start_ns").to_numpy(), b.column("end_ns").to_numpy()
        trace_col = b.column("trace_id").to_pylist()
        parent_col = b.column("parent_span_id").to_pylist()
        for run in dict.fromkeys(r for r, m in zip(runs, mask, strict=True) if m):
            sel = np.array([m and r == run for r, m in zip(runs, mask, strict=True)])
            t_hex, s_hex = trace_id(self.node, "window", run), span_id(self.node, "window", run)
            tid = bytes.fromhex(t_hex)
            lo, hi = int(starts[sel].min()), int(ends[sel].max())
            if tid not in self._closed:
                t = self._trace(tid, now)
                if t.root is None:
                    t.root = RootSpan(
                        tid,
                        bytes.fromhex(s_hex),
                        "capture window",
                        lo,
                        hi,
                        {"aaco.run_id": run, "aaco.source": source, "aaco.span.kind": "window"},
                    )
                else:
                    t.root.start_ns, t.root.end_ns = min(t.root.start_ns, lo), max(t.root.end_ns, hi)
            for i in np.nonzero(sel)[0]:
                trace_col[i], parent_col[i] = t_hex, s_hex
        idx = {name: i for i, name in enumerate(b.schema.names)}
        arrays = list(b.columns)
        arrays[idx["trace_id"]] = pa.array(trace_col, pa.string())
        arrays[idx["parent_span_id"]] = pa.array(parent_col, pa.string())
        return pa.RecordBatch.from_arrays(arrays, schema=b.schema)

    # -- closing ------------------------------------------------------------------------------------

    def expire(self, now: float | None = None) -> list[bytes]:
        """Close traces whose window passed (and the oldest beyond the cap); return their root spans."""
        now = self._clock() if now is None else now
        out: list[bytes] = []
        for tid in [k for k, t in self._open.items() if t.deadline <= now]:
            out += self._close(tid)
        while len(self._open) > self.max_open:
            out += self._close(next(iter(self._open)))
        return out

    def close_all(self) -> list[bytes]:
        """Close every open trace (flush, shutdown)."""
        out: list[bytes] = []
        for tid in list(self._open):
            out += self._close(tid)
        return out

    def _close(self, tid: bytes) -> list[bytes]:
        t = self._open.pop(tid)
        self._closed[tid] = (t.exported, t.total)
        while len(self._closed) > 4 * self.max_open:
            self._closed.popitem(last=False)
        if t.root is None:  # kernels of an iteration never seen (its span went out before): nothing to send
            return []
        root = t.root
        top = sorted(t.fam_busy.items(), key=lambda kv: -kv[1])[:5]
        root.attributes.update(
            {
                "aaco.kernels.total": t.total,
                "aaco.kernels.exported": t.exported,
                "aaco.kernels.summarized": t.summarized,
                "aaco.kernels.busy_ns": t.busy_ns,
            }
        )
        if top:
            root.attributes["aaco.kernels.top_families"] = ",".join(
                f"{fam}:{t.fam_count[fam]}:{busy}" for fam, busy in top
            )
        if t.pid is not None and t.pid in self._offcpu:
            hits = [iv for iv in self._offcpu[t.pid] if iv[0] < root.end_ns and iv[1] > root.start_ns]
            root.attributes["aaco.offcpu.count"] = len(hits)
            root.attributes["aaco.offcpu.ns"] = sum(min(e, root.end_ns) - max(s, root.start_ns) for s, e, _ in hits)
            for s, e, thread in sorted(hits)[:MAX_EVENTS_PER_ROOT]:
                root.events.append(SpanEvent(s, "off-cpu", {"thread.id": thread, "aaco.offcpu.duration_ns": e - s}))
        self.stats.inc(SPANS_EXPORTED, 1, kind="root")
        return [root.encode()]
