"""The node's OTLP receiver: applications send their own spans, metrics and logs to the agent.

As the OpenTelemetry Collector does in agent mode, it accepts OTLP over gRPC (default port 4317) and
HTTP (4318: protobuf, or JSON as ``otlp_json.py`` reads it, answered in the request's encoding),
optionally over TLS with client certificates (``tls.py``), adds the node's resource attributes
(``host.name``, ``k8s.node.name``) where the application did not set them, and hands everything to
the sinks the agent passes it (``base.py``): traces to the agent's trace exporter, which links
application spans to the GPU iterations of the same process and time window before forwarding them,
metrics and logs to their own bounded, retrying queues. LLM request spans (vLLM's ``llm_request``
and the GenAI conventions' names) are also read into ``requests`` rows on the agent's bus
(``genai.py``), from which the serving analyzer keeps TTFT, TPOT and tokens; the spans themselves
are forwarded unchanged. A plain OpenTelemetry SDK client works unchanged. A signal with no upstream
(no sink) is still accepted and read, not forwarded: its items are counted in
``aaco_receiver_items_rejected_total{reason="no_upstream"}`` and the start says so once.

A request is admitted only while the agent's byte budget (``ByteBudget``, holder ``receiver``) has
room for it, and its bytes are held until it is handed on; otherwise the client is told to back off
(gRPC RESOURCE_EXHAUSTED with RetryInfo, HTTP 503 with Retry-After). Every request is parsed with the
official generated classes; a malformed one is answered with the right status (gRPC
INVALID_ARGUMENT, HTTP 400), one too large with RESOURCE_EXHAUSTED / 413, one over the
per-connection rate limit with RESOURCE_EXHAUSTED carrying RetryInfo / HTTP 429 with Retry-After, a
body neither protobuf nor JSON with HTTP 415 — all counted in
``aaco_receiver_requests_total{protocol, signal, outcome}``. Spans and log records with malformed
ids are dropped (``ids.py``), counted, and reported to the client as OTLP ``partial_success``. The
HTTP port's own defences (connection, header, body and time limits) are in ``http_server.py``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Mapping
from concurrent import futures
from typing import Any, Literal

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.agent.receivers import limits, otlp_json
from aaco.agent.receivers.base import Forwarder, ReceiverContext, SpanSink
from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.agent.receivers.genai import SOURCE as REQUESTS_SOURCE
from aaco.agent.receivers.genai import RequestRows
from aaco.agent.receivers.http_server import OtlpHttp, http_server
from aaco.agent.receivers.http_wire import Request, gunzip_bounded
from aaco.agent.receivers.ids import drop_malformed
from aaco.agent.receivers.limits import PARSE_FACTOR, ItemLimits
from aaco.agent.receivers.tls import grpc_credentials, http_context
from aaco.contract.budget import DEFAULT_BUDGET_BYTES, ByteBudget
from aaco.contract.channel import MAX_BATCH_ROWS, BatchQueue
from aaco.contract.component import Component
from aaco.contract.errors import AacoError
from aaco.contract.http_app import Reply
from aaco.contract.http_loop import LoopServer
from aaco.contract.memory import Trimmer
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import define
from aaco.contract.stats import Stats

log = logging.getLogger("aaco.receivers.otlp")

RECEIVER_REQUESTS = define(
    "aaco.receiver.requests",
    "aaco_receiver_requests",
    "counter",
    "{request}",
    "Requests to the node's OTLP receiver, by protocol, signal (unknown before the path is read) and outcome: "
    "accepted, malformed, too_large, rate_limited, unsupported, over_budget (byte budget full), memory_limit "
    "(the agent over pipeline.memory_limit_mib's soft limit), bad_length, "
    "length_required, headers_too_large, not_found, not_allowed, timeout, client_gone, error.",
    ("protocol", "signal", "outcome"),
)
RECEIVER_ITEMS = define(
    "aaco.receiver.items",
    "aaco_receiver_items",
    "counter",
    "{item}",
    "Spans, data points and log records accepted by the node's OTLP receiver.",
    ("signal",),
)
RECEIVER_ITEMS_LIMITED = define(
    "aaco.receiver.items.limited",
    "aaco_receiver_items_limited",
    "counter",
    "{item}",
    "Attributes, events and links dropped from received spans and log records past receivers.otlp.limits, by "
    "what: span_attributes, span_events, span_links, event_attributes, link_attributes, log_record_attributes "
    "(the item's dropped_*_count says so upstream).",
    ("signal", "what"),
)
RECEIVER_ITEMS_REJECTED = define(
    "aaco.receiver.items.rejected",
    "aaco_receiver_items_rejected",
    "counter",
    "{item}",
    "Spans, data points and log records the node's OTLP receiver did not forward, by reason: bad_trace_id, "
    "bad_span_id, bad_parent_span_id, bad_link_id (dropped and reported to the client as partial success); "
    "no_upstream (accepted and read, but no upstream is set for the signal).",
    ("signal", "reason"),
)

Signal = Literal["traces", "metrics", "logs"]
Headers = tuple[tuple[str, str], ...]
PROTOBUF = "application/x-protobuf"
MESSAGES = {
    "traces": (trace_service_pb2.ExportTraceServiceRequest, trace_service_pb2.ExportTraceServiceResponse),
    "metrics": (metrics_service_pb2.ExportMetricsServiceRequest, metrics_service_pb2.ExportMetricsServiceResponse),
    "logs": (logs_service_pb2.ExportLogsServiceRequest, logs_service_pb2.ExportLogsServiceResponse),
}
GRPC_METHODS = {
    "traces": ("opentelemetry.proto.collector.trace.v1.TraceService", "Export"),
    "metrics": ("opentelemetry.proto.collector.metrics.v1.MetricsService", "Export"),
    "logs": ("opentelemetry.proto.collector.logs.v1.LogsService", "Export"),
}


def count_items(signal: Signal, msg: Any) -> int:
    """Spans, data points or log records in a request."""
    if signal == "traces":
        return sum(len(ss.spans) for rs in msg.resource_spans for ss in rs.scope_spans)
    if signal == "logs":
        return sum(len(sl.log_records) for rl in msg.resource_logs for sl in rl.scope_logs)
    total = 0
    for rm in msg.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = m.WhichOneof("data")
                total += len(getattr(m, kind).data_points) if kind else 0
    return total


def resources(signal: Signal, msg: Any) -> list[Any]:
    """The Resource messages of a request."""
    items = {"traces": "resource_spans", "metrics": "resource_metrics", "logs": "resource_logs"}[signal]
    return [item.resource for item in getattr(msg, items)]


class _Limiter:
    """A token bucket per client connection (bounded LRU of clients)."""

    def __init__(self, rate: float, max_clients: int = 4096) -> None:
        self.rate = rate
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.max_clients = max_clients
        self.lock = threading.Lock()

    def allow(self, client: str) -> bool:
        now = time.monotonic()
        with self.lock:
            tokens, last = self.buckets.pop(client, (self.rate, now))
            tokens = min(self.rate, tokens + (now - last) * self.rate)
            ok = tokens >= 1.0
            self.buckets[client] = (tokens - 1.0 if ok else tokens, now)
            while len(self.buckets) > self.max_clients:
                self.buckets.popitem(last=False)
            return ok


class OtlpReceiver(Component):
    """gRPC and HTTP servers handing what applications send to the agent's sinks."""

    def __init__(
        self,
        config: OtlpReceiverConfig,
        stats: Stats,
        node_attributes: Mapping[str, object],
        traces: SpanSink | None,
        metrics: Forwarder | None,
        logs: Forwarder | None,
        budget: ByteBudget | None = None,
        bus: BatchQueue | None = None,
        node: str = "",
    ) -> None:
        self.config = config
        # The service passes the agent's one budget; alone (tests, tools) the receiver gets its own.
        self.budget = budget if budget is not None else ByteBudget(DEFAULT_BUDGET_BYTES, stats)
        self.stats = stats
        self.node_attributes = dict(node_attributes)
        self.traces = traces
        self.senders: dict[str, Forwarder | None] = {"metrics": metrics, "logs": logs}
        self.bus = bus
        self._requests = RequestRows(node, stats)
        self._limiter = _Limiter(config.rate_limit_rps)
        self._item_limits = ItemLimits(**config.limits.model_dump())
        self._trimmer = Trimmer()
        self._grpc: grpc.Server | None = None
        self._http: LoopServer | None = None
        self.grpc_port = 0
        self.http_port = 0

    @classmethod
    def from_config(cls, config: OtlpReceiverConfig, ctx: ReceiverContext) -> OtlpReceiver | None:
        """The receiver ``config`` asks for, fed to ``ctx``'s sinks; None when it is not enabled."""
        if not config.enabled:
            return None
        return cls(
            config,
            ctx.stats,
            ctx.node_attributes,
            ctx.traces,
            ctx.forward("metrics"),
            ctx.forward("logs"),
            ctx.budget,
            ctx.bus,
            ctx.node,
        )

    # -- shared handling ----------------------------------------------------------------------------

    def _count(self, protocol: str, signal: str, outcome: str) -> None:
        self.stats.inc(RECEIVER_REQUESTS, 1, protocol=protocol, signal=signal, outcome=outcome)

    def _enrich(self, signal: Signal, msg: Any) -> None:
        for res in resources(signal, msg):
            have = {kv.key for kv in res.attributes}
            for key, value in self.node_attributes.items():
                if key in have or key.startswith("service."):
                    continue
                kv = res.attributes.add()
                kv.key = key
                kv.value.string_value = str(value)

    def _publish_requests(self, msg: Any) -> None:
        """Put the LLM request spans of a traces request on the bus as ``requests`` rows (never waiting)."""
        rows = self._requests.read(msg)
        if rows is None or self.bus is None:
            return
        for offset in range(0, rows.num_rows, MAX_BATCH_ROWS):
            self.bus.offer(EventBatch("requests", rows.slice(offset, MAX_BATCH_ROWS), REQUESTS_SOURCE))

    def handle(self, signal: Signal, payload: bytes) -> bytes:
        """Parse, check, enrich and forward a protobuf request; returns the serialised response (raises DecodeError)."""
        try:
            return self.take(signal, MESSAGES[signal][0].FromString(payload)).SerializeToString()
        finally:
            self._trimmer.done(len(payload))

    def _parse_room(self, nbytes: int) -> str | None:
        """Hold what parsing a request of ``nbytes`` may cost; None when held, else the refusal's outcome."""
        if self.budget.try_acquire("receiver", PARSE_FACTOR * nbytes):
            return None
        return self.budget.refusing or "over_budget"

    def take(self, signal: Signal, msg: Any) -> Any:
        """Check, limit, enrich and forward one parsed request; the response."""
        rejected = drop_malformed(signal, msg)
        msg, limited, cost = limits.apply(signal, msg, self._item_limits)
        for what, k in limited.items():
            self.stats.inc(RECEIVER_ITEMS_LIMITED, k, signal=signal, what=what)
        n = count_items(signal, msg)
        if signal == "traces" and self.bus is not None:
            self._publish_requests(msg)  # before _enrich: a server's pod is its own, never the agent's
        self._enrich(signal, msg)
        self.stats.inc(RECEIVER_ITEMS, n, signal=signal)
        if signal == "traces" and self.traces is not None:
            self.traces.accept_spans(msg, n, nbytes=cost)
        elif signal != "traces" and (sender := self.senders[signal]) is not None:
            sender.enqueue(msg.SerializeToString(), n)
        elif n:
            self.stats.inc(RECEIVER_ITEMS_REJECTED, n, signal=signal, reason="no_upstream")
        response = MESSAGES[signal][1]()
        if rejected:
            total = sum(rejected.values())
            for reason, k in rejected.items():
                self.stats.inc(RECEIVER_ITEMS_REJECTED, k, signal=signal, reason=reason)
            what = "spans" if signal == "traces" else "log records"
            response.partial_success.error_message = f"{total} {what} dropped for malformed ids: " + ", ".join(
                f"{k} {reason}" for reason, k in sorted(rejected.items())
            )
            if signal == "traces":
                response.partial_success.rejected_spans = total
            else:
                response.partial_success.rejected_log_records = total
            log.debug("OTLP %s request: %s", signal, response.partial_success.error_message)
        return response

    # -- gRPC ---------------------------------------------------------------------------------------

    def _grpc_handler(self, signal: Signal):
        limit = self.config.max_message_bytes

        def export(request: bytes, context: grpc.ServicerContext) -> bytes:
            if len(request) > limit:  # the core lets up to twice the limit through so that this is counted
                self._count("grpc", signal, "too_large")
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"request larger than {limit} bytes")
            if not self._limiter.allow(context.peer()):
                self._count("grpc", signal, "rate_limited")
                _retry_later(context, "rate limit exceeded; retry later")
            refused = self._parse_room(len(request))
            if refused is not None:
                self._count("grpc", signal, refused)
                _retry_later(context, "the agent holds too much data; retry later")
            try:
                response = self.handle(signal, request)
            except DecodeError:
                self._count("grpc", signal, "malformed")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed OTLP {signal} request")
            finally:
                self.budget.release("receiver", PARSE_FACTOR * len(request))
            self._count("grpc", signal, "accepted")
            return response

        return grpc.unary_unary_rpc_method_handler(export)  # raw bytes in and out

    def _grpc_server(self) -> grpc.Server:
        cfg = self.config
        # grpcio refuses a message over its core limit before any handler runs, uncounted: the core limit is
        # twice the configured one, so that requests up to that size reach the handler's counted refusal
        # (and the memory a request may take stays bounded). RPCs past maximum_concurrent_rpcs and connections
        # past grpc.max_allowed_incoming_connections are refused by grpcio itself, which offers no hook to count them.
        options = [
            ("grpc.max_receive_message_length", 2 * cfg.max_message_bytes),
            ("grpc.max_allowed_incoming_connections", cfg.max_connections),
            ("grpc.max_concurrent_streams", 64),
            ("grpc.max_connection_idle_ms", int(cfg.idle_timeout_s * 1000)),
            ("grpc.server_handshake_timeout_ms", int(cfg.read_timeout_s * 1000)),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.http2.max_ping_strikes", 2),
        ]
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=cfg.max_workers, thread_name_prefix="aaco-otlp-rx"),
            options=options,
            maximum_concurrent_rpcs=cfg.max_connections,
        )
        for signal, (service, method) in GRPC_METHODS.items():
            handler = grpc.method_handlers_generic_handler(service, {method: self._grpc_handler(signal)})  # type: ignore[arg-type]
            server.add_generic_rpc_handlers((handler,))
        return server

    # -- HTTP ---------------------------------------------------------------------------------------

    def _http_request(self, request: Request) -> Reply:
        """Answer one OTLP/HTTP request read whole (its framing and admission were checked by the server)."""
        signal: Signal = request.signal  # type: ignore[assignment]
        if not self._limiter.allow(request.peer):
            self._count("http", signal, "rate_limited")
            return Reply(429, b"rate limit exceeded\n", headers=(("Retry-After", "1"),))
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()  # a charset is allowed
        if media not in (PROTOBUF, otlp_json.CONTENT_TYPE):
            self._count("http", signal, "unsupported")
            return Reply(415, b"use Content-Type application/x-protobuf or application/json\n")
        as_json = media == otlp_json.CONTENT_TYPE
        body: bytes | None = request.body
        if request.headers.get("content-encoding", "").lower() == "gzip":
            try:
                body = gunzip_bounded(request.body, self.config.max_message_bytes)
            except zlib.error:
                return self._refusal(signal, as_json, 400, "malformed", "bad gzip body")
            if body is None:
                return self._refusal(signal, as_json, 413, "too_large", "request too large once decompressed")
        if as_json:
            return self._http_json(signal, body)
        refused = self._parse_room(len(body))
        if refused is not None:
            why = "the agent holds too much data; retry later"
            return self._refusal(signal, False, 503, refused, why, (("Retry-After", "1"),))
        try:
            response = self.handle(signal, body)
        except DecodeError:
            return self._refusal(signal, as_json, 400, "malformed", f"malformed OTLP {signal} request")
        finally:
            self.budget.release("receiver", PARSE_FACTOR * len(body))
        self._count("http", signal, "accepted")
        return Reply(200, response, PROTOBUF)

    def _http_json(self, signal: Signal, body: bytes) -> Reply:
        """An OTLP/JSON request, parsed while its tree is held in the byte budget (``otlp_json.py``); a JSON answer."""
        need = otlp_json.JSON_PARSE_FACTOR * len(body)
        if need > self.budget.limit:  # it could never be admitted: retrying would not help
            why = "JSON request too large for the agent's memory budget; send protobuf or smaller batches"
            return self._refusal(signal, True, 413, "too_large", why)
        if not self.budget.try_acquire("receiver", need):
            why = "the agent holds too much data; retry later"
            outcome = self.budget.refusing or "over_budget"
            return self._refusal(signal, True, 503, outcome, why, (("Retry-After", "1"),))
        try:
            msg = otlp_json.decode(MESSAGES[signal][0], body)
        except otlp_json.JsonRequestError as exc:
            return self._refusal(signal, True, 400, "malformed", f"malformed OTLP {signal} request: {exc}")
        finally:
            self.budget.release("receiver", need)
        response = self.take(signal, msg)
        self._count("http", signal, "accepted")
        return Reply(200, otlp_json.encode(response), otlp_json.CONTENT_TYPE)

    def _refusal(
        self, signal: Signal, as_json: bool, status: int, outcome: str, text: str, headers: Headers = ()
    ) -> Reply:
        """A counted refusal: to a JSON request a JSON ``google.rpc.Status`` (as OTLP asks), else a line of text."""
        self._count("http", signal, outcome)
        if as_json:
            return Reply(status, otlp_json.encode(status_pb2.Status(message=text)), otlp_json.CONTENT_TYPE, headers)
        return Reply(status, f"{text}\n".encode(), headers=headers)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind both servers (a port in use, or a TLS file that cannot be read, is a clear error)."""
        cfg = self.config
        tls_context = http_context(cfg.tls) if cfg.tls is not None else None
        self._grpc = self._grpc_server()
        try:
            if cfg.tls is not None:
                self.grpc_port = self._grpc.add_secure_port(f"{cfg.address}:{cfg.grpc_port}", grpc_credentials(cfg.tls))
            else:
                self.grpc_port = self._grpc.add_insecure_port(f"{cfg.address}:{cfg.grpc_port}")
        except RuntimeError as exc:
            raise AacoError(
                f"cannot listen on {cfg.address}:{cfg.grpc_port} for OTLP/gRPC: {exc}",
                subject="receivers.otlp.grpc_port",
                hint="choose another port",
            ) from exc
        count = functools.partial(self._count, "http")
        self._http = http_server(OtlpHttp(cfg, self.stats, self.budget, self._http_request, count, tls_context))
        try:
            self.http_port = self._http.bind()
        except OSError as exc:
            self._grpc.stop(0)
            raise AacoError(
                f"cannot listen on {cfg.address}:{cfg.http_port} for OTLP/HTTP: {exc.strerror or exc}",
                subject="receivers.otlp.http_port",
                hint="choose another port",
            ) from exc
        self._grpc.start()
        self._http.start()
        tls = "plaintext" if cfg.tls is None else "TLS" if cfg.tls.client_ca_file is None else "mutual TLS"
        log.info("OTLP receiver on %s (%s): gRPC %d, HTTP %d", cfg.address, tls, self.grpc_port, self.http_port)
        unsent = self.not_forwarded()
        if unsent:
            log.info(
                "receiver on without upstream for %s: spans are read, nothing is forwarded "
                '(counted in aaco_receiver_items_rejected_total{reason="no_upstream"})',
                ", ".join(unsent),
            )

    def not_forwarded(self) -> list[str]:
        """The signals received with no upstream to forward them to (accepted, read, counted, dropped)."""
        sinks = {"traces": self.traces, **self.senders}
        return [signal for signal in MESSAGES if sinks[signal] is None]

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stop accepting; requests in progress finish within ``timeout_s``. Idempotent, safe before start."""
        if self._grpc is not None:
            self._grpc.stop(timeout_s).wait(timeout_s)
            self._grpc = None
        if self._http is not None:
            self._http.stop(timeout_s)
            self._http = None


def _retry_later(context: grpc.ServicerContext, message: str) -> None:
    """Abort with RESOURCE_EXHAUSTED carrying RetryInfo (one second), as OTLP asks for backpressure."""
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=message)
    status.details.add().Pack(error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1)))
    context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
    context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message)
