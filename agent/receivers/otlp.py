"""The node's OTLP receiver: applications send their own spans, metrics and logs to the agent.

As the OpenTelemetry Collector does in agent mode, it accepts OTLP over gRPC (default port 4317)
and HTTP/protobuf (4318), adds the node's resource attributes (``host.name``, ``k8s.node.name``)
where the application did not set them, and forwards everything upstream: traces through the
agent's trace exporter, which first links application spans to the GPU iterations of the same
process and time window (``exporters/otlp_assembly.py``), metrics and logs through their own
bounded, retrying queues. A plain OpenTelemetry SDK client works unchanged.

Every request is parsed with the official generated classes; a malformed one is answered with
the right status (gRPC INVALID_ARGUMENT, HTTP 400), one too large with RESOURCE_EXHAUSTED / 413,
one over the per-connection rate limit with RESOURCE_EXHAUSTED carrying RetryInfo / HTTP 429 with
Retry-After, a JSON body with HTTP 415 (only protobuf is accepted) — all counted in
``aaco_receiver_requests_total{protocol, signal, outcome}``.
"""

from __future__ import annotations

import logging
import threading
import time
import zlib
from collections import OrderedDict
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.agent.errors import AacoError
from aaco.agent.pipeline.signals import define
from aaco.agent.pipeline.stats import Stats
from aaco.exporters.otlp_assembly import AppSpan
from aaco.exporters.otlp_sender import OtlpSender

from .config import OtlpReceiverConfig

log = logging.getLogger("aaco.receivers.otlp")

RECEIVER_REQUESTS = define(
    "aaco.receiver.requests",
    "aaco_receiver_requests",
    "counter",
    "{request}",
    "Requests to the node's OTLP receiver, by protocol, signal and outcome "
    "(accepted, malformed, too_large, rate_limited, unsupported).",
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

Signal = Literal["traces", "metrics", "logs"]
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


class OtlpReceiver:
    """gRPC and HTTP servers feeding the agent's OTLP exporters."""

    def __init__(
        self,
        config: OtlpReceiverConfig,
        stats: Stats,
        node_attributes: dict[str, object],
        traces: Any,
        metrics: OtlpSender | None,
        logs: OtlpSender | None,
    ) -> None:
        self.config = config
        self.stats = stats
        self.node_attributes = node_attributes
        self.traces = traces  # the OtlpTraceExporter (receive_application)
        self.senders: dict[str, OtlpSender | None] = {"metrics": metrics, "logs": logs}
        self._limiter = _Limiter(config.rate_limit_rps)
        self._grpc: grpc.Server | None = None
        self._http: ThreadingHTTPServer | None = None
        self.grpc_port = 0
        self.http_port = 0

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

    def handle(self, signal: Signal, payload: bytes) -> int:
        """Parse, enrich and forward one request; returns its item count (raises DecodeError)."""
        msg = MESSAGES[signal][0].FromString(payload)
        n = count_items(signal, msg)
        self._enrich(signal, msg)
        self.stats.inc(RECEIVER_ITEMS, n, signal=signal)
        if signal == "traces":
            self.traces.receive_application(msg, n)
        else:
            sender = self.senders[signal]
            if sender is not None:
                sender.enqueue(msg.SerializeToString(), n)
        return n

    # -- gRPC ---------------------------------------------------------------------------------------

    def _grpc_handler(self, signal: Signal):
        response = MESSAGES[signal][1]().SerializeToString()

        def export(request: bytes, context: grpc.ServicerContext) -> bytes:
            if not self._limiter.allow(context.peer()):
                self._count("grpc", signal, "rate_limited")
                status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="rate limit")
                info = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=1))
                status.details.add().Pack(info)
                context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rate limit exceeded; retry later")
            try:
                self.handle(signal, request)
            except DecodeError:
                self._count("grpc", signal, "malformed")
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed OTLP {signal} request")
            self._count("grpc", signal, "accepted")
            return response

        return grpc.unary_unary_rpc_method_handler(export)  # raw bytes in and out

    # -- HTTP ---------------------------------------------------------------------------------------

    def _http_handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self
        paths: dict[str, Signal] = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Requests are counted, not logged."""

            def _reply(self, code: int, body: bytes = b"", ctype: str = "text/plain", extra: dict | None = None):
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (extra or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                signal = paths.get(self.path.split("?", 1)[0])
                if signal is None:
                    self._reply(404, b"unknown path; use /v1/traces, /v1/metrics or /v1/logs\n")
                    return
                limit = receiver.config.max_message_bytes
                length = int(self.headers.get("Content-Length") or 0)
                if length > limit:
                    receiver._count("http", signal, "too_large")
                    self.close_connection = True
                    self._reply(413, b"request too large\n")
                    return
                body = self.rfile.read(length)
                if not receiver._limiter.allow(f"{self.client_address[0]}:{self.client_address[1]}"):
                    receiver._count("http", signal, "rate_limited")
                    self._reply(429, b"rate limit exceeded\n", extra={"Retry-After": "1"})
                    return
                ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
                if ctype != "application/x-protobuf":
                    receiver._count("http", signal, "unsupported")
                    self._reply(415, b"only application/x-protobuf is accepted\n")
                    return
                if (self.headers.get("Content-Encoding") or "").lower() == "gzip":
                    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    try:
                        body = d.decompress(body, limit + 1)
                    except zlib.error:
                        receiver._count("http", signal, "malformed")
                        self._reply(400, b"bad gzip body\n")
                        return
                    if len(body) > limit or d.unconsumed_tail:
                        receiver._count("http", signal, "too_large")
                        self._reply(413, b"request too large once decompressed\n")
                        return
                try:
                    receiver.handle(signal, body)
                except DecodeError:
                    receiver._count("http", signal, "malformed")
                    self._reply(400, f"malformed OTLP {signal} request\n".encode())
                    return
                receiver._count("http", signal, "accepted")
                out = MESSAGES[signal][1]().SerializeToString()
                self._reply(200, out, "application/x-protobuf")

        return Handler

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Bind both servers (a port in use is a clear error)."""
        cfg = self.config
        self._grpc = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="aaco-otlp-rx"),
            options=[("grpc.max_receive_message_length", cfg.max_message_bytes)],
        )
        for signal, (service, method) in GRPC_METHODS.items():
            handler = grpc.method_handlers_generic_handler(service, {method: self._grpc_handler(signal)})  # type: ignore[arg-type]
            self._grpc.add_generic_rpc_handlers((handler,))
        try:
            self.grpc_port = self._grpc.add_insecure_port(f"{cfg.address}:{cfg.grpc_port}")
        except RuntimeError as exc:
            raise AacoError(
                f"cannot listen on {cfg.address}:{cfg.grpc_port} for OTLP/gRPC: {exc}",
                subject="receivers.otlp.grpc_port",
                hint="choose another port",
            ) from exc
        try:
            self._http = ThreadingHTTPServer((cfg.address, cfg.http_port), self._http_handler())
        except OSError as exc:
            self._grpc.stop(0)
            raise AacoError(
                f"cannot listen on {cfg.address}:{cfg.http_port} for OTLP/HTTP: {exc.strerror or exc}",
                subject="receivers.otlp.http_port",
                hint="choose another port",
            ) from exc
        self._http.daemon_threads = True
        self.http_port = self._http.server_address[1]
        self._grpc.start()
        threading.Thread(target=self._http.serve_forever, name="aaco-otlp-http", daemon=True).start()
        log.info("OTLP receiver on %s: gRPC %d, HTTP %d", cfg.address, self.grpc_port, self.http_port)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop accepting; requests in progress finish within ``timeout_s``."""
        if self._grpc is not None:
            self._grpc.stop(timeout_s).wait(timeout_s)
            self._grpc = None
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None


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
