"""OTLP trace export: iterations and their kernels as spans, over gRPC or HTTP, bounded and retried.

``export`` hands a batch to the trace assembler (``otlp_assembly``: roots, kernel spans, span
budget), packs the spans ready into requests of at most ``max_spans_per_request`` and queues them;
a sender thread ships them. The queue is bounded in spans: when full, the
oldest requests are dropped and counted (``aaco_events_dropped_total{component="exporter:otlp",
reason="queue_full"}``), so an upstream outage costs data at the old end, never memory. Failed
sends are retried with exponential backoff and jitter (the server's RetryInfo / Retry-After wins)
for up to ``retry_max_elapsed_s``; a permanent error drops the request, counted. ``shutdown``
flushes within its deadline and counts what is left as dropped (reason ``shutdown``).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Mapping

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.agent import __version__
from aaco.agent.pipeline.schemas import EventBatch
from aaco.agent.pipeline.stats import (
    EVENTS_DROPPED,
    EVENTS_EMITTED,
    EVENTS_RECEIVED,
    EXPORT_ERRORS,
    QUEUE_CAPACITY,
    QUEUE_DEPTH,
    Stats,
)

from . import otlp_wire as w
from .base import Exporter, ExportResult
from .otlp_assembly import TraceAssembler
from .otlp_settings import OtlpConfig, OtlpTarget, resolve
from .otlp_transport import Transport, make_transport

log = logging.getLogger("aaco.exporters.otlp")
COMPONENT = "exporter:otlp"
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 16.0


def resource_attributes(node: str, env: Mapping[str, str] | None = None) -> dict[str, object]:
    """The agent's resource, with OpenTelemetry semantic-convention names.

    ``host.name`` is the node; the chart sets ``NODE_NAME``, ``POD_NAME`` and ``POD_NAMESPACE`` from the
    downward API (``k8s.*``); ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k2=v2``) adds or overrides any.
    """
    env = os.environ if env is None else env
    attrs: dict[str, object] = {
        "service.name": "aaco-agent",
        "service.version": __version__,
        "host.name": node,
    }
    for key, var in (
        ("k8s.node.name", "NODE_NAME"),
        ("k8s.pod.name", "POD_NAME"),
        ("k8s.namespace.name", "POD_NAMESPACE"),
    ):
        if env.get(var):
            attrs[key] = env[var]
    extra = env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    for item in extra.split(","):
        k, sep, v = item.partition("=")
        if sep and k.strip():
            attrs[urllib.parse.unquote(k.strip())] = urllib.parse.unquote(v.strip())
    return attrs


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
    ) -> None:
        self.config = config
        self.stats = stats
        self.node = node
        self.target: OtlpTarget | None = resolve(config, "traces", env)
        self._resource = w.resource(resource_attributes(node, env))
        self._scope = w.scope("aaco", __version__)
        self._assembler = TraceAssembler(
            node, stats, config.max_kernel_spans_per_trace, config.max_spans_per_second, config.trace_window_s
        )
        self._assembly_lock = threading.Lock()
        self._transport = transport
        self._queue: deque[tuple[bytes, int]] = deque()
        self._queued = 0
        self._in_flight = 0
        self._cond = threading.Condition()
        self._closing = False
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._outage_logged = False
        self.delivered = 0
        stats.set(QUEUE_CAPACITY, config.queue_max_spans, queue="otlp")

    def start(self) -> None:
        """Open the connection and start the sender."""
        if self.target is None:
            return
        if self._transport is None:
            self._transport = make_transport(self.target)
        self._thread = threading.Thread(target=self._run, name="aaco-otlp-traces", daemon=True)
        self._thread.start()
        log.info("OTLP traces to %s (%s)", self.target.url, self.target.protocol)

    # -- producer side ------------------------------------------------------------------------------

    def export(self, batch: EventBatch) -> ExportResult:
        """Assemble the batch's spans and queue those ready to go."""
        if self.target is None or batch.kind not in ("iterations", "kernels", "sched") or batch.rows == 0:
            return ExportResult.SUCCESS
        if self._closing:
            self.stats.inc(EVENTS_DROPPED, batch.rows, component=COMPONENT, reason="shutdown")
            return ExportResult.FAILURE
        if batch.kind != "sched":
            self.stats.inc(EVENTS_RECEIVED, batch.rows, component=COMPONENT)
        with self._assembly_lock:
            spans = self._assembler.add(batch)
        self._send_spans(spans)
        return ExportResult.SUCCESS

    def tick(self) -> None:
        """Send the roots of traces whose window passed (called by the pipeline when idle)."""
        if self.target is None:
            return
        with self._assembly_lock:
            spans = self._assembler.expire()
        self._send_spans(spans)

    def _send_spans(self, spans: list[bytes]) -> None:
        step = self.config.max_spans_per_request
        for i in range(0, len(spans), step):
            chunk = spans[i : i + step]
            self._enqueue(w.export_trace_request(self._resource, self._scope, chunk), len(chunk))

    def _enqueue(self, payload: bytes, n: int) -> None:
        with self._cond:
            while self._queue and self._queued + n > self.config.queue_max_spans:
                _, old = self._queue.popleft()
                self._queued -= old
                self.stats.inc(EVENTS_DROPPED, old, component=COMPONENT, reason="queue_full")
            self._queue.append((payload, n))
            self._queued += n
            self.stats.set(QUEUE_DEPTH, self._queued, queue="otlp")
            self._cond.notify_all()

    # -- sender side --------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait(0.5)
                if not self._queue:
                    return
                payload, n = self._queue.popleft()
                self._queued -= n
                self._in_flight = n
                self.stats.set(QUEUE_DEPTH, self._queued, queue="otlp")
            try:
                self._deliver(payload, n)
            finally:
                with self._cond:
                    self._in_flight = 0
                    self._cond.notify_all()

    def _deliver(self, payload: bytes, n: int) -> None:
        assert self._transport is not None and self.target is not None
        started = time.monotonic()
        attempt = 0
        while True:
            if self._abort.is_set():
                self.stats.inc(EVENTS_DROPPED, n, component=COMPONENT, reason="shutdown")
                return
            result = self._transport.send(payload, self.target.timeout_s)
            if result.ok:
                rejected = self._rejected(result.response)
                if rejected:
                    self.stats.inc(EVENTS_DROPPED, rejected, component=COMPONENT, reason="rejected")
                self.stats.inc(EVENTS_EMITTED, n - rejected, component=COMPONENT)
                self.delivered += n - rejected
                if self._outage_logged:
                    log.info("OTLP endpoint %s reachable again", self.target.url)
                    self._outage_logged = False
                return
            self.stats.inc(EXPORT_ERRORS, 1, exporter="otlp")
            if not self._outage_logged:
                log.warning(
                    "OTLP export to %s failed: %s%s",
                    self.target.url,
                    result.error,
                    "; retrying" if result.retryable else "",
                )
                self._outage_logged = True
            if not result.retryable:
                self.stats.inc(EVENTS_DROPPED, n, component=COMPONENT, reason="rejected")
                return
            delay = result.retry_after_s
            if delay is None:
                delay = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2**attempt) * random.uniform(0.8, 1.2)
            attempt += 1
            if time.monotonic() + delay - started > self.config.retry_max_elapsed_s:
                self.stats.inc(EVENTS_DROPPED, n, component=COMPONENT, reason="retries_exhausted")
                return
            self._abort.wait(delay)

    @staticmethod
    def _rejected(response: bytes) -> int:
        if not response:
            return 0
        try:
            resp = trace_service_pb2.ExportTraceServiceResponse.FromString(response)
        except Exception:  # a proxy's non-OTLP body: the request itself was accepted
            return 0
        return int(resp.partial_success.rejected_spans)

    # -- lifecycle ----------------------------------------------------------------------------------

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Close every open trace and wait until everything queued was sent (or given up), up to ``timeout_s``."""
        if self._thread is None:
            return True
        with self._assembly_lock:
            spans = self._assembler.close_all()
        self._send_spans(spans)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._queue or self._in_flight) and time.monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            return not self._queue and not self._in_flight

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Flush within ``timeout_s``, then drop (counted) what is left; idempotent, safe before start."""
        with self._cond:
            if self._closing:
                return
        deadline = time.monotonic() + timeout_s
        self.force_flush(max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._abort.set()
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))
        with self._cond:
            if self._queued:
                self.stats.inc(EVENTS_DROPPED, self._queued, component=COMPONENT, reason="shutdown")
            self._queue.clear()
            self._queued = 0
        if self._transport is not None:
            self._transport.close()
