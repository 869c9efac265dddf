"""OTLP transports: gRPC (grpcio) and HTTP/protobuf (urllib), sending pre-encoded request bytes.

Each ``send`` returns a ``SendResult`` saying whether the request went, whether a failure is worth
retrying (per the OTLP specification: gRPC UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, CANCELLED,
OUT_OF_RANGE, DATA_LOSS, and RESOURCE_EXHAUSTED when the server sent RetryInfo; HTTP 429, 502,
503, 504 and connection errors), and the delay the server asked for (gRPC ``RetryInfo``, HTTP
``Retry-After``). Retrying itself is the exporter's job, and so is the deadline: it passes each
``send`` the time left (gRPC: the call's whole deadline; HTTP: urllib's timeout, per socket operation)
and ``close`` cancels a gRPC call in flight.
"""

from __future__ import annotations

import email.utils
import gzip
import ssl
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Protocol

import grpc
from google.rpc import error_details_pb2, status_pb2

from aaco.exporters.otlp_settings import OtlpTarget

RETRYABLE_GRPC = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.CANCELLED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.DATA_LOSS,
}
RETRYABLE_HTTP = {429, 502, 503, 504}
METHODS = {
    "traces": "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
    "metrics": "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export",
    "logs": "/opentelemetry.proto.collector.logs.v1.LogsService/Export",
}
USER_AGENT = "aaco-agent"


@dataclass(frozen=True)
class SendResult:
    """The outcome of one request."""

    ok: bool
    retryable: bool = False
    retry_after_s: float | None = None
    error: str = ""
    response: bytes = b""


class Transport(Protocol):
    """Sends one encoded export request."""

    def send(self, payload: bytes, timeout_s: float) -> SendResult:
        """POST/call with the payload."""

    def close(self) -> None:
        """Release connections."""


def _read(path: object) -> bytes | None:
    return open(path, "rb").read() if path else None


def _retry_info(err: grpc.RpcError) -> float | None:
    for key, value in err.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key != "grpc-status-details-bin":
            continue
        status = status_pb2.Status.FromString(value)
        for detail in status.details:
            if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                info = error_details_pb2.RetryInfo()
                detail.Unpack(info)
                return info.retry_delay.seconds + info.retry_delay.nanos / 1e9
    return None


class GrpcTransport:
    """OTLP/gRPC with raw bytes in and out (the request is already encoded)."""

    def __init__(self, target: OtlpTarget, max_message_bytes: int = 64 * 1024 * 1024) -> None:
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.primary_user_agent", USER_AGENT),
            # A reconnect backoff longer than the sender's own would fail its retries fast after the upstream is back.
            ("grpc.max_reconnect_backoff_ms", round(target.retry_max_interval_s * 1000)),
        ]
        if target.secure:
            creds = grpc.ssl_channel_credentials(_read(target.ca_file), _read(target.key_file), _read(target.cert_file))
            self._channel = grpc.secure_channel(target.url, creds, options)
        else:
            self._channel = grpc.insecure_channel(target.url, options)
        self._call = self._channel.unary_unary(METHODS[target.signal])
        self._metadata = tuple((k.lower(), v) for k, v in target.headers.items())
        self._compression = grpc.Compression.Gzip if target.compression == "gzip" else grpc.Compression.NoCompression

    def send(self, payload: bytes, timeout_s: float) -> SendResult:
        """Call Export; classify the failure."""
        try:
            response = self._call(payload, timeout=timeout_s, metadata=self._metadata, compression=self._compression)
        except ValueError as err:  # grpcio's answer for a call on a channel closed by shutdown
            return SendResult(False, True, None, f"gRPC channel closed: {err}")
        except grpc.RpcError as err:
            code = err.code()  # type: ignore[attr-defined]
            delay = _retry_info(err)
            retryable = code in RETRYABLE_GRPC or (code == grpc.StatusCode.RESOURCE_EXHAUSTED and delay is not None)
            return SendResult(False, retryable, delay, f"gRPC {code.name}: {err.details()}")  # type: ignore[attr-defined]
        return SendResult(True, response=response or b"")

    def close(self) -> None:
        """Close the channel; a call in flight ends at once (CANCELLED)."""
        self._channel.close()


class HttpTransport:
    """OTLP/HTTP with protobuf bodies."""

    def __init__(self, target: OtlpTarget) -> None:
        self._url = target.url
        self._headers = {"Content-Type": "application/x-protobuf", "User-Agent": USER_AGENT, **target.headers}
        self._gzip = target.compression == "gzip"
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        self._context: ssl.SSLContext | None = None
        if target.url.startswith("https"):
            self._context = ssl.create_default_context(cafile=str(target.ca_file) if target.ca_file else None)
            if target.cert_file and target.key_file:
                self._context.load_cert_chain(str(target.cert_file), str(target.key_file))

    def send(self, payload: bytes, timeout_s: float) -> SendResult:
        """POST; classify the failure."""
        body = gzip.compress(payload, compresslevel=5) if self._gzip else payload
        req = urllib.request.Request(self._url, data=body, headers=self._headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s, context=self._context) as resp:
                return SendResult(True, response=resp.read())
        except urllib.error.HTTPError as err:
            delay = _retry_after(err.headers.get("Retry-After"))
            return SendResult(False, err.code in RETRYABLE_HTTP, delay, f"HTTP {err.code} {err.reason}")
        except (urllib.error.URLError, OSError, TimeoutError) as err:
            reason = getattr(err, "reason", err)
            return SendResult(False, True, None, f"cannot reach {self._url}: {reason}")

    def close(self) -> None:
        """Nothing is kept open."""


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        parsed = email.utils.parsedate_to_datetime(value)
        return max(0.0, parsed.timestamp() - time.time()) if parsed else None


def make_transport(target: OtlpTarget) -> Transport:
    """The transport for a resolved target."""
    return GrpcTransport(target) if target.protocol == "grpc" else HttpTransport(target)
