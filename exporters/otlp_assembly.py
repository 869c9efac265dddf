"""Trace assembly for OTLP export: roots held briefly, kernels streamed within a span budget.

One trace per iteration (its root span is the iteration) or, for kernels no iteration claimed, one
trace per capture window (``run_id``). Kernel spans go out as they come, children of their root,
within two budgets: at most ``max_kernel_spans_per_trace`` per trace, and a node-wide
``max_spans_per_second`` (``otlp_rate``: on the agent's clock, or on the kernels' own for a replay).
Kernels beyond either are *summarised*: counted on the root span (``aaco.kernels.total``,
``.exported``, ``.summarized``, busy time, top families) and in
``aaco_spans_summarized_total{reason}``. So for every trace, exported kernel spans plus the
summarised count equal the kernels the source read: nothing vanishes silently.

Roots are held open for ``window_s`` after their trace's last kernel (at most ``max_hold_s``) so
that the summary is complete when they are sent; meanwhile off-CPU intervals of the iteration's
process (from the scheduler source) are attached as span events. Open traces are bounded
(``max_open_traces``, oldest closed first).

Application spans (received by the node's OTLP receiver) meet the iterations here: an application
span whose resource has ``process.pid`` P is linked to the iterations of P that start inside it.
Application requests are held for ``link_window_s`` (late data is fine), bounded in count
(``max_app_requests``) and in bytes: each holds its wire size in the agent's ``ByteBudget`` (holder
``assembly``) until it is forwarded, and while the budget is over its limit, or the requests held here
take more than half of it (the export queue needs the rest), the oldest are forwarded early (their
links are then the ones made so far). While the receiver is
on, iteration roots are held as long, so the link goes both ways when both are still unsent; an
iteration already sent gets only the forward link from the application span (counted by
direction). With ``link_mode: children`` the iteration instead becomes a child of the application
span: its whole trace (root, kernels, launches), held until it closes, moves into the
application's trace.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.contract.budget import DEFAULT_BUDGET_BYTES, ByteBudget
from aaco.contract.ids import span_id, trace_id
from aaco.contract.kernels import families
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import define
from aaco.contract.stats import Stats
from aaco.exporters.otlp_rate import TokenBucket, TraceTimeBudget
from aaco.exporters.otlp_spans import TRACE_ID_HEAD, RootSpan, SpanEncoder, SpanEvent, family_totals, link_bodies

JOB_ATTRIBUTES = ("job", "rank", "world_size", "local_rank", "dist_backend")

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
SPAN_LINKS = define(
    "aaco.spans.links",
    "aaco_span_links",
    "counter",
    "{link}",
    "Links between application spans and GPU iterations, by direction (to_iteration, to_application, parent).",
    ("direction",),
)

HOLDER = "assembly"  # the byte budget's name for application requests held here
MAX_EVENTS_PER_ROOT = 32
MAX_LINKS_PER_SPAN = 128


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
    held: list[bytes] = field(default_factory=list)  # kernel spans held whole (link_mode children)
    parent: tuple[bytes, bytes] | None = None  # (trace, span) of the application span it moves under


@dataclass
class AppSpan:
    """An application span waiting for its links (its protobuf Span is changed in place)."""

    pid: int
    start_ns: int
    end_ns: int
    trace_id: bytes
    span_id: bytes
    span: Any
    linked: set[bytes] = field(default_factory=set)  # iteration span IDs it links to


@dataclass
class AppRequest:
    """A received ExportTraceServiceRequest, held until ``deadline`` so that its spans can be linked."""

    request: Any
    spans: list[AppSpan]
    deadline: float
    count: int
    nbytes: int = 0  # its wire size, held in the byte budget until it is forwarded


def retrace(span: bytes, new_trace: bytes) -> bytes:
    """A span encoded by this package (trace_id first: tag, length 16, 16 bytes) moved to another trace.

    Its links into its old trace (a kernel's link to its launch, which moves too) move with it; links
    elsewhere stay. Raises ``ValueError`` for bytes that do not start that way (any other encoder's
    span) or a trace ID that is not 16 bytes, rather than splice into the wrong field.
    """
    if len(new_trace) != 16 or len(span) < 18 or span[:2] != TRACE_ID_HEAD:
        raise ValueError("retrace: not a span starting with a 16-byte trace_id, or not a 16-byte trace ID")
    old_head, new_head = TRACE_ID_HEAD + span[2:18], TRACE_ID_HEAD + new_trace
    out = bytearray(span)
    out[2:18] = new_trace
    for start, end in link_bodies(span):  # Link.trace_id is its first field, as this package encodes it
        if end - start >= 18 and span[start : start + 18] == old_head:
            out[start : start + 18] = new_head
    return bytes(out)


class TraceAssembler:
    """Turns event batches into encoded spans and links application spans (see the module docstring)."""

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
        link_window_s: float = 5.0,
        link_mode: str = "links",
        max_app_requests: int = 10_000,
        budget: ByteBudget | None = None,
        rate_clock: str = "wall",
    ) -> None:
        self.node = node
        self.stats = stats
        self.per_trace = max_kernel_spans_per_trace
        self.window_s = window_s
        self.max_hold_s = max_hold_s
        self.max_open = max_open_traces
        self.link_window_s = link_window_s
        self.link_mode = link_mode
        self.max_app_requests = max_app_requests
        self.budget = budget if budget is not None else ByteBudget(DEFAULT_BUDGET_BYTES, stats)
        self.receiving = False  # set when the node's receiver runs: roots then wait for application spans
        self._clock = clock
        self._bucket = TokenBucket(max_spans_per_second, clock)
        self._trace_budget = TraceTimeBudget(max_spans_per_second) if rate_clock == "trace" else None
        self._encoder = SpanEncoder()
        self._open: OrderedDict[bytes, _Trace] = OrderedDict()
        self._closed: OrderedDict[bytes, tuple[int, int]] = OrderedDict()  # late kernels: (exported, total)
        self._offcpu: OrderedDict[int, deque[tuple[int, int, int]]] = OrderedDict()  # pid -> (start, end, tid)
        self._iterations: OrderedDict[int, deque[tuple[int, int, bytes, bytes]]] = OrderedDict()
        self._apps: deque[AppRequest] = deque()

    # -- input --------------------------------------------------------------------------------------

    def add(self, item: EventBatch) -> list[bytes]:
        """Fold a batch in; return the spans ready to send now."""
        if item.rows == 0:
            return []
        if item.kind == "iterations":
            self._add_iterations(item.batch)
        elif item.kind == "kernels":
            return self._add_kernels(item.batch, item.source) + self.expire()
        elif item.kind == "sched":
            self._add_offcpu(item.batch)
        return self.expire()

    def _trace(self, tid: bytes, now: float) -> _Trace:
        t = self._open.get(tid)
        if t is None:
            t = self._open[tid] = _Trace(None, None, now, now + self.window_s)
        return t

    def _add_iterations(self, b: pa.RecordBatch) -> None:
        now = self._clock()
        cols = [
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
            *JOB_ATTRIBUTES,
        ]
        for r in b.select(cols).to_pylist():
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
                **{f"aaco.{name}": r[name] for name in JOB_ATTRIBUTES},  # a distributed job's rank (docs/jobs.md)
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
            if self.receiving:
                t.deadline = max(t.deadline, now + self.link_window_s)
            if r["pid"] is not None:
                q = self._iterations.get(r["pid"])
                if q is None:
                    q = self._iterations[r["pid"]] = deque(maxlen=10_000)
                    while len(self._iterations) > 1024:
                        self._iterations.popitem(last=False)
                q.append((r["start_ns"], r["end_ns"], tid, t.root.span_id))

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
        enc = pc.dictionary_encode(b.column("trace_id"))  # traces in order of first appearance
        codes = enc.indices.to_numpy(zero_copy_only=False)
        order = np.argsort(codes, kind="stable")  # each trace's rows, in row order
        bounds = np.cumsum(np.bincount(codes, minlength=len(enc.dictionary))).tolist()
        fam_names, fam_codes = np.unique(families(b.column("name"), b.column("kind")).astype(str), return_inverse=True)
        fam_codes = fam_codes.reshape(-1)
        start = b.column("start_ns").to_numpy()
        dur = (b.column("end_ns").to_numpy() - start).astype(np.int64)
        keep = np.zeros(b.num_rows, dtype=bool)
        lo = 0
        for tid_hex, hi in zip(enc.dictionary.to_pylist(), bounds, strict=True):
            rows = order[lo:hi]
            lo = hi
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
            if self._trace_budget is not None:
                ok = self._trace_budget.grant(start[rows[:by_trace]])
                keep[rows[:by_trace][ok]] = True
                granted = int(ok.sum())
            else:
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
            for fam, busy, count in family_totals(fam_names, fam_codes[rows], dur[rows]):
                t.fam_busy[fam] += busy
                t.fam_count[fam] += count
        if not keep.any():
            return []
        kept = b.filter(pa.array(keep))
        spans = self._encoder.kernel_spans(kept)
        kernels = kept.num_rows
        self.stats.inc(SPANS_EXPORTED, kernels, kind="kernel")
        self.stats.inc(SPANS_EXPORTED, len(spans) - kernels, kind="launch")  # a launch goes with its kernel
        if self.link_mode != "children":
            return spans
        out = []
        for span in spans:  # held whole: the trace may still move under an application span
            t = self._open.get(span[2:18])
            if t is not None:
                t.held.append(span)
            else:
                out.append(span)
        return out

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

    # -- application spans --------------------------------------------------------------------------

    def add_application(self, request: Any, spans: list[AppSpan], count: int, nbytes: int = 0) -> list[AppRequest]:
        """Hold a request (``nbytes`` on the wire) for linking; return the requests the bounds push out (send them)."""
        self.budget.acquire(HOLDER, nbytes)
        self._apps.append(AppRequest(request, spans, self._clock() + self.link_window_s, count, nbytes))
        for app in spans:
            for trace in self._open.values():
                if trace.root is not None and trace.pid == app.pid:
                    self._link(app, trace)
        out = []
        while self._apps and (len(self._apps) > self.max_app_requests or self._over_budget()):
            out.append(self._release(self._apps.popleft()))
        return out

    def _over_budget(self) -> bool:
        return self.budget.over() or self.budget.held_by(HOLDER) > self.budget.limit // 2

    @staticmethod
    def _starts_inside(app: AppSpan, start_ns: int) -> bool:
        return app.start_ns <= start_ns <= app.end_ns

    def _link(self, app: AppSpan, trace: _Trace) -> None:
        root = trace.root
        if root is None or not self._starts_inside(app, root.start_ns) or root.span_id in app.linked:
            return
        app.linked.add(root.span_id)
        if self.link_mode == "children":
            if trace.parent is None:
                trace.parent = (app.trace_id, app.span_id)
                self.stats.inc(SPAN_LINKS, 1, direction="parent")
            return
        if len(app.span.links) < MAX_LINKS_PER_SPAN:
            link = app.span.links.add()
            link.trace_id, link.span_id = root.trace_id, root.span_id
            self.stats.inc(SPAN_LINKS, 1, direction="to_iteration")
        if len(root.links) < MAX_LINKS_PER_SPAN:
            root.links.append((app.trace_id, app.span_id, {"aaco.link": "application"}))
            self.stats.inc(SPAN_LINKS, 1, direction="to_application")

    def _release(self, req: AppRequest) -> AppRequest:
        """Final forward links to iterations already sent, before the request goes upstream (its bytes given back)."""
        self.budget.release(HOLDER, req.nbytes)
        for app in req.spans:
            for start, _end, tid, sid in self._iterations.get(app.pid, ()):
                if sid in app.linked or not self._starts_inside(app, start):
                    continue
                if self.link_mode == "children" or len(app.span.links) >= MAX_LINKS_PER_SPAN:
                    continue
                link = app.span.links.add()
                link.trace_id, link.span_id = tid, sid
                app.linked.add(sid)
                self.stats.inc(SPAN_LINKS, 1, direction="to_iteration")
        return req

    def due_applications(self, now: float | None = None, everything: bool = False) -> list[AppRequest]:
        """Application requests whose hold ended (or all of them), linked and ready to forward."""
        now = self._clock() if now is None else now
        out = []
        while self._apps and (everything or self._apps[0].deadline <= now):
            out.append(self._release(self._apps.popleft()))
        return out

    # -- closing ------------------------------------------------------------------------------------

    def expire(self, now: float | None = None) -> list[bytes]:
        """Close traces whose window passed (and the oldest beyond the cap); return their spans."""
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
        if t.root is None:  # kernels of an iteration never seen (its span went out before): only those
            return t.held
        root = t.root
        for req in self._apps:  # application spans that arrived before this iteration was known
            for app in req.spans:
                if app.pid == t.pid:
                    self._link(app, t)
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
        held = t.held
        if t.parent is not None:  # link_mode children: the trace moves under the application span
            new_trace, parent_span = t.parent
            root.attributes["aaco.trace.original_id"] = root.trace_id.hex()
            root.trace_id, root.parent_span_id = new_trace, parent_span
            held = [retrace(s, new_trace) for s in held]
        self.stats.inc(SPANS_EXPORTED, 1, kind="root")
        return [root.encode(), *held]
