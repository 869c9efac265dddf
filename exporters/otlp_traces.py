"""OTLP trace export: iterations and their kernels as spans, over gRPC or HTTP, bounded and retried.

``export`` hands a batch to the trace assembler (``otlp_assembly``: roots, kernel spans, span
budget), packs the spans ready into requests of at most ``max_spans_per_request`` and queues them
on an ``OtlpSender`` (bounded, drops oldest with counters, retries with backoff, flushes within the
shutdown deadline). Spans that applications send to the node's OTLP receiver are forwarded through
the same queue (``accept_spans``). Both hold their bytes in the agent's one ``ByteBudget`` (the service
passes it; one of the default size otherwise): the assembler while application requests wait for
their links, the sender while requests are queued or in flight.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.contract.budget import DEFAULT_BUDGET_BYTES, ByteBudget
from aaco.contract.schemas import EventBatch
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_RECEIVED, Stats
from aaco.contract.version import version
from aaco.exporters import otlp_wire as w
from aaco.exporters.base import Exporter, ExportResult
from aaco.exporters.context import ExporterContext
from aaco.exporters.otlp_assembly import AppRequest, AppSpan, TraceAssembler
from aaco.exporters.otlp_sender import OtlpSender
from aaco.exporters.otlp_settings import OtlpConfig, OtlpTarget, resolve, resource_attributes
from aaco.exporters.otlp_transport import Transport

log = logging.getLogger("aaco.exporters.otlp")
COMPONENT = "exporter:otlp"


class OtlpTraceExporter(Exporter):
    """Ships spans; never blocks the pipeline (the queue is bounded and drops oldest)."""

    name = "otlp"

    def __init__(
        self,
        config: OtlpConfig,
        stats: Stats,
        node: str,
        env: Mapping[str, str] | None = None,
        transport: Transport | None = None,
        link_window_s: float = 5.0,
        link_mode: str = "links",
        budget: ByteBudget | None = None,
        receiving: bool = False,
    ) -> None:
        self.config = config
        self.budget = budget if budget is not None else ByteBudget(DEFAULT_BUDGET_BYTES, stats)
        self.stats = stats
        self.node = node
        self.target: OtlpTarget | None = resolve(config, "traces", env)
        self.resource_attributes = resource_attributes(node, env)
        self._resource = w.resource(self.resource_attributes)
        self._scope = w.scope("aaco", version())
        self.assembler = TraceAssembler(
            node,
            stats,
            config.max_kernel_spans_per_trace,
            config.max_spans_per_second,
            config.trace_window_s,
            link_window_s=link_window_s,
            link_mode=link_mode,
            budget=self.budget,
            rate_clock=config.rate_clock,
        )
        self.assembler.receiving = receiving  # the node's receiver runs: roots wait for application spans
        self.budget.add_shedder(self._shed, order=0)
        self._assembly_lock = threading.Lock()
        self.sender = (
            OtlpSender(
                self.target,
                stats,
                COMPONENT,
                config.queue_max_spans,
                config.retry_max_elapsed_s,
                rejected_spans,
                transport,
                self.budget,
            )
            if self.target is not None
            else None
        )

    @classmethod
    def from_config(cls, config: OtlpConfig, ctx: ExporterContext) -> OtlpTraceExporter | None:
        """The trace exporter, when ``config`` (or the environment) names a traces endpoint; None otherwise."""
        if resolve(config, "traces", ctx.env) is None:
            return None
        return cls(
            config,
            ctx.stats,
            ctx.node,
            env=ctx.env,
            link_window_s=ctx.link_window_s,
            link_mode=ctx.link_mode,
            budget=ctx.budget,
            receiving=ctx.receiving,
        )

    def start(self) -> None:
        """Open the connection and start the sender."""
        if self.sender is None:
            return
        self.sender.start()
        log.info("OTLP traces to %s (%s)", self.sender.target.url, self.sender.target.protocol)

    def export(self, batch: EventBatch) -> ExportResult:
        """Assemble the batch's spans and queue those ready to go."""
        if self.sender is None or batch.kind not in ("iterations", "kernels", "sched") or batch.rows == 0:
            return ExportResult.SUCCESS
        if self.sender.closing:
            self.stats.inc(EVENTS_DROPPED, batch.rows, component=COMPONENT, reason="shutdown")
            return ExportResult.FAILURE
        if batch.kind != "sched":
            self.stats.inc(EVENTS_RECEIVED, batch.rows, component=COMPONENT)
        with self._assembly_lock:
            spans = self.assembler.add(batch)
        self._send_spans(spans)
        return ExportResult.SUCCESS

    def tick(self) -> None:
        """Send the roots of traces whose window passed (called by the pipeline when idle)."""
        if self.sender is None:
            return
        with self._assembly_lock:
            spans = self.assembler.expire()
            due = self.assembler.due_applications()
        self._send_spans(spans)
        self._forward(due)

    def _send_spans(self, spans: list[bytes]) -> None:
        assert self.sender is not None
        step = self.config.max_spans_per_request
        for i in range(0, len(spans), step):
            chunk = spans[i : i + step]
            self.sender.enqueue(w.export_trace_request(self._resource, self._scope, chunk), len(chunk))

    def accept_spans(self, request: Any, spans: int, nbytes: int = 0) -> None:
        """Spans an application sent to the receiver (``nbytes`` on the wire): held for linking, then forwarded."""
        if self.sender is None:
            return
        size = nbytes or request.ByteSize()
        with self._assembly_lock:
            pushed = self.assembler.add_application(request, application_spans(request), spans, size)
        self._forward(pushed)

    def _forward(self, requests: list[AppRequest]) -> None:
        assert self.sender is not None
        for req in requests:
            self.sender.enqueue(req.request.SerializeToString(), req.count)

    def _shed(self) -> None:
        """The process is over its memory limit: forward the application requests held for links now.

        A parsed request costs several times its serialised bytes; forwarded, it is bytes in the
        sender's queue (which sheds next, oldest first).
        """
        if self.sender is None:
            return
        with self._assembly_lock:
            due = self.assembler.due_applications(everything=True)
        self._forward(due)

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Close every open trace and wait until everything queued was sent (or given up)."""
        if self.sender is None:
            return True
        with self._assembly_lock:
            spans = self.assembler.close_all()
            due = self.assembler.due_applications(everything=True)
        self._send_spans(spans)
        self._forward(due)
        return self.sender.force_flush(timeout_s)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Flush within ``timeout_s``, then drop (counted) what is left; idempotent, safe before start."""
        self.budget.remove_shedder(self._shed)
        if self.sender is None:
            return
        if not self.sender.closing:
            with self._assembly_lock:
                spans = self.assembler.close_all()
                due = self.assembler.due_applications(everything=True)
            self._send_spans(spans)
            self._forward(due)
        self.sender.shutdown(timeout_s)


def rejected_spans(response: bytes) -> int:
    """``partial_success.rejected_spans`` of an ExportTraceServiceResponse (0 for an empty or foreign body)."""
    if not response:
        return 0
    try:
        return int(trace_service_pb2.ExportTraceServiceResponse.FromString(response).partial_success.rejected_spans)
    except Exception:  # a proxy's non-OTLP body: the request itself was accepted
        return 0


def application_spans(request: Any) -> list[AppSpan]:
    """The spans of a request whose resource names a ``process.pid`` (the ones that can be linked)."""
    out = []
    for rs in request.resource_spans:
        pid = next((kv.value.int_value for kv in rs.resource.attributes if kv.key == "process.pid"), None)
        if pid is None:
            continue
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.append(
                    AppSpan(pid, span.start_time_unix_nano, span.end_time_unix_nano, span.trace_id, span.span_id, span)
                )
    return out
