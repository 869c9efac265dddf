"""Real OTLP receivers for tests: gRPC from the opentelemetry-proto generated stubs, and HTTP/protobuf.

Every request is parsed with the official generated classes, so a malformed message fails here.
"""

from __future__ import annotations

import gzip
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Collected:
    """What a receiver got."""

    def __init__(self) -> None:
        self.trace_requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.lock = threading.Lock()
        self.fail_with: grpc.StatusCode | int | None = None
        self.calls = 0

    def spans(self):
        with self.lock:
            return [
                (rs.resource, s)
                for req in self.trace_requests
                for rs in req.resource_spans
                for ss in rs.scope_spans
                for s in ss.spans
            ]


class _TraceServicer(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, got: Collected) -> None:
        self.got = got

    def Export(self, request, context):
        with self.got.lock:
            self.got.calls += 1
            self.got.metadata.append(dict(context.invocation_metadata()))
        if isinstance(self.got.fail_with, grpc.StatusCode):
            context.abort(self.got.fail_with, "told to fail")
        with self.got.lock:
            self.got.trace_requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()


class _MetricsServicer(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, got: Collected) -> None:
        self.got = got

    def Export(self, request, context):
        with self.got.lock:
            self.got.metric_requests.append(request)
        return metrics_service_pb2.ExportMetricsServiceResponse()


class GrpcReceiver:
    """An OTLP/gRPC receiver on 127.0.0.1 (optionally TLS)."""

    def __init__(self, port: int = 0, credentials: grpc.ServerCredentials | None = None) -> None:
        self.got = Collected()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(_TraceServicer(self.got), self.server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_MetricsServicer(self.got), self.server)
        addr = f"127.0.0.1:{port}"
        self.port = (
            self.server.add_secure_port(addr, credentials) if credentials else self.server.add_insecure_port(addr)
        )

    def __enter__(self) -> GrpcReceiver:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.stop(0)


class HttpReceiver:
    """An OTLP/HTTP (protobuf) receiver on 127.0.0.1: /v1/traces and /v1/metrics."""

    def __init__(self, port: int = 0) -> None:
        self.got = Collected()
        got = self.got

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                with got.lock:
                    got.calls += 1
                    got.metadata.append({k.lower(): v for k, v in self.headers.items()})
                if isinstance(got.fail_with, int):
                    self.send_response(got.fail_with)
                    self.send_header("Retry-After", "1")
                    self.end_headers()
                    return
                if self.path == "/v1/traces":
                    msg = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                    with got.lock:
                        got.trace_requests.append(msg)
                    out = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    msg = metrics_service_pb2.ExportMetricsServiceRequest.FromString(body)
                    with got.lock:
                        got.metric_requests.append(msg)
                    out = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.httpd.server_address[1]

    def __enter__(self) -> HttpReceiver:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
