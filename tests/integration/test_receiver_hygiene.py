"""The OTLP receiver's doors: every hostile or broken request is refused without reading it, and counted."""

from __future__ import annotations

import gzip
import http.client
import logging
import resource
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import grpc
import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.agent.receivers.otlp import RECEIVER_ITEMS_REJECTED, RECEIVER_REQUESTS, OtlpReceiver
from aaco.contract.budget import ByteBudget
from aaco.contract.http_app import HTTP_CONNECTIONS
from aaco.contract.stats import Stats

pytestmark = pytest.mark.integration

TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class Recorder:
    """Stands in for the trace exporter: keeps what the receiver hands on."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.lock = threading.Lock()

    def accept_spans(self, request, spans: int, nbytes: int = 0) -> None:
        with self.lock:
            self.requests.append(request)

    def span_names(self) -> list[str]:
        with self.lock:
            return [s.name for r in self.requests for rs in r.resource_spans for ss in rs.scope_spans for s in ss.spans]


@contextmanager
def receiver(budget_bytes: int = 64 << 20, **cfg) -> Iterator[tuple[OtlpReceiver, Recorder]]:
    stats = Stats()
    settings = {"enabled": True, "grpc_port": 0, "http_port": 0, "max_message_bytes": 10_000, **cfg}
    traces = Recorder()
    rx = OtlpReceiver(
        OtlpReceiverConfig(**settings),
        stats,
        {"host.name": "gpu-node-1"},
        traces,
        None,
        None,
        budget=ByteBudget(budget_bytes, stats),
    )
    rx.start()
    try:
        yield rx, traces
    finally:
        rx.shutdown(2.0)


def spans_request(*names: str) -> bytes:
    req = trace_service_pb2.ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for i, name in enumerate(names):
        span = ss.spans.add(name=name, trace_id=bytes([1]) * 16, span_id=bytes([i + 1]) * 8)
        span.start_time_unix_nano, span.end_time_unix_nano = 1, 2
    return req.SerializeToString()


def head(length: str | None = None, chunked: bool = False, path: str = "/v1/traces", extra: str = "") -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/x-protobuf"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    if chunked:
        lines.append("Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode()


def exchange(port: int, data: bytes) -> tuple[int, bytes]:
    """Send raw bytes and read until the server closes (a hang fails on the socket timeout)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    status = int(got.split(b" ", 2)[1])
    return status, got


def count(rx: OtlpReceiver, outcome: str, signal: str = "traces", protocol: str = "http") -> float:
    return rx.stats.get(RECEIVER_REQUESTS, protocol=protocol, signal=signal, outcome=outcome)


def wait_for(cond, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.mark.parametrize("length", ["-1", "abc", "12x", "1e3"])
def test_bad_content_length_is_400_without_reading_and_closes(length):
    with receiver() as (rx, traces):
        status, _ = exchange(rx.http_port, head(length))  # no body follows: the answer must not wait for one
        assert status == 400
        assert count(rx, "bad_length") == 1
        assert traces.requests == []


def test_missing_length_is_411_and_oversize_length_is_413_before_the_body():
    with receiver() as (rx, _):
        assert exchange(rx.http_port, head(None))[0] == 411
        assert count(rx, "length_required") == 1
        status, answer = exchange(rx.http_port, head("20000"))  # the 20,000 bytes are never sent
        assert status == 413 and b"Connection: close" in answer
        assert count(rx, "too_large") == 1
        assert rx.budget.held_by("receiver") == 0


def chunked(body: bytes, size: int) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


def test_chunked_body_is_read_chunk_by_chunk():
    with receiver() as (rx, traces):
        status, answer = exchange(
            rx.http_port, head(chunked=True, extra="Connection: close\r\n") + chunked(spans_request("a", "b", "c"), 7)
        )
        assert status == 200, answer
        assert sorted(traces.span_names()) == ["a", "b", "c"]
        assert count(rx, "accepted") == 1
        assert rx.budget.held_by("receiver") == 0  # the reservation (max_message_bytes) was given back


def test_chunked_body_past_the_limit_is_413_and_bad_chunking_400():
    with receiver() as (rx, traces):
        assert exchange(rx.http_port, head(chunked=True) + chunked(b"x" * 30_000, 4096))[0] == 413
        assert count(rx, "too_large") == 1
        assert exchange(rx.http_port, head(chunked=True) + b"zz\r\nabc\r\n")[0] == 400
        assert count(rx, "malformed") == 1
        assert traces.requests == []
        assert rx.budget.held_by("receiver") == 0


def test_gzip_that_expands_past_the_limit_is_413():
    bomb = gzip.compress(b"\x00" * 5_000_000)  # about 5 KB compressed, under the 10,000-byte limit
    assert len(bomb) < 10_000
    with receiver() as (rx, traces):
        status, _ = exchange(
            rx.http_port, head(str(len(bomb)), extra="Content-Encoding: gzip\r\nConnection: close\r\n") + bomb
        )
        assert status == 413
        assert count(rx, "too_large") == 1
        assert traces.requests == []


def test_keep_alive_serves_several_requests_on_one_connection():
    with receiver() as (rx, traces):
        conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=10)
        for name in ("first", "second", "third"):
            conn.request("POST", "/v1/traces", spans_request(name), {"Content-Type": "application/x-protobuf"})
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 200
        conn.close()
        assert traces.span_names() == ["first", "second", "third"]
        assert rx.stats.get(HTTP_CONNECTIONS, port="otlp_http", outcome="accepted") == 1


def test_over_budget_is_503_with_retry_after_on_http_and_resource_exhausted_on_grpc():
    with receiver(budget_bytes=1_000) as (rx, traces):
        status, answer = exchange(rx.http_port, head("2000"))
        assert status == 503 and b"Retry-After: 1" in answer
        assert count(rx, "over_budget") == 1
        with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as channel, pytest.raises(grpc.RpcError) as err:
            channel.unary_unary(TRACES)(spans_request("x" * 2_000), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert count(rx, "over_budget", protocol="grpc") == 1
        assert traces.requests == [] and rx.budget.held_by("receiver") == 0


def test_grpc_size_refusal_is_counted():
    with receiver() as (rx, _), grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as err:
            channel.unary_unary(TRACES)(spans_request("x" * 15_000), timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert count(rx, "too_large", protocol="grpc") == 1


def test_at_max_connections_a_stalled_connection_makes_room():
    with receiver(max_connections=3) as (rx, _):
        held = [socket.create_connection(("127.0.0.1", rx.http_port), timeout=10) for _ in range(3)]
        held[1].sendall(b"POST /v1/traces HTTP/1.1\r\n")  # half a request: stalled, the first to go
        wait_for(lambda: rx.stats.get(HTTP_CONNECTIONS, port="otlp_http", outcome="accepted") == 3)
        status, _ = exchange(rx.http_port, head("0", extra="Connection: close\r\n"))
        assert status == 200
        assert rx.stats.get(HTTP_CONNECTIONS, port="otlp_http", outcome="evicted") == 1
        assert held[1].recv(1) == b"", "the one stalled mid-request was closed to make room"
        for s in held:
            s.close()


def test_read_and_idle_timeouts_close_and_count():
    with receiver(read_timeout_s=0.3, idle_timeout_s=0.3) as (rx, _):
        with socket.create_connection(("127.0.0.1", rx.http_port), timeout=10) as slow:
            slow.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")  # and never the rest
            got = b""
            while chunk := slow.recv(4096):
                got += chunk
            assert got.startswith(b"HTTP/1.1 408")
        assert count(rx, "timeout") == 1
        with socket.create_connection(("127.0.0.1", rx.http_port), timeout=10) as silent:
            assert silent.recv(4096) == b""  # never a byte: closed at the read deadline
        assert rx.stats.get(HTTP_CONNECTIONS, port="otlp_http", outcome="timeout") == 1
        with socket.create_connection(("127.0.0.1", rx.http_port), timeout=10) as idle:
            idle.sendall(head("0"))
            assert idle.recv(4096).startswith(b"HTTP/1.1 200")
            assert idle.recv(4096) == b""  # then kept alive, idle, closed at the idle deadline
        assert rx.stats.get(HTTP_CONNECTIONS, port="otlp_http", outcome="idle_timeout") == 1


def test_a_client_that_resets_mid_body_is_one_debug_line(caplog):
    caplog.set_level(logging.DEBUG, logger="aaco.receivers.otlp")
    with receiver() as (rx, traces):
        s = socket.create_connection(("127.0.0.1", rx.http_port), timeout=10)
        s.sendall(head("5000") + b"x" * 100)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        wait_for(lambda: rx.budget.held_by("receiver") == 5000)  # admitted, reading the body
        s.close()  # RST
        wait_for(lambda: count(rx, "client_gone") == 1)
        assert rx.budget.held_by("receiver") == 0
        assert traces.requests == []
    ours = [r for r in caplog.records if r.name == "aaco.receivers.otlp" and "went away" in r.getMessage()]
    assert len(ours) == 1 and ours[0].levelno == logging.DEBUG
    assert not any(r.exc_info for r in caplog.records)


def test_slow_loris_holds_sockets_not_threads():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4096, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 2100:
        pytest.skip("cannot open 1,000 connections here (RLIMIT_NOFILE)")
    with receiver(max_connections=2000, max_connections_per_peer=2000, read_timeout_s=120) as (rx, traces):
        before = threading.active_count()
        loris = []
        try:
            for _ in range(1000):
                loris.append(socket.create_connection(("127.0.0.1", rx.http_port), timeout=10))
            for byte in b"POST /v1/tr":  # headers a byte at a time, never finished
                for s in loris:
                    s.send(bytes([byte]))
            wait_for(lambda: rx.stats.get(HTTP_CONNECTIONS, port="otlp_http", outcome="accepted") == 1000, timeout_s=60)
            during = threading.active_count()
            conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=30)
            conn.request("POST", "/v1/traces", spans_request("served"), {"Content-Type": "application/x-protobuf"})
            assert conn.getresponse().status == 200
            conn.close()
            assert traces.span_names() == ["served"]
            assert during - before <= 1  # at most the worker thread the served request starts
            assert threading.active_count() - before <= rx.config.max_workers
        finally:
            for s in loris:
                s.close()


def test_log_records_with_malformed_ids_are_reported_as_partial_success():
    req = logs_service_pb2.ExportLogsServiceRequest()
    sl = req.resource_logs.add().scope_logs.add()
    sl.log_records.add(trace_id=b"\x01" * 16, span_id=b"\x02" * 8)
    sl.log_records.add(trace_id=b"\x01" * 32)
    with receiver() as (rx, _):
        conn = http.client.HTTPConnection("127.0.0.1", rx.http_port, timeout=10)
        conn.request("POST", "/v1/logs", req.SerializeToString(), {"Content-Type": "application/x-protobuf"})
        resp = conn.getresponse()
        reply = logs_service_pb2.ExportLogsServiceResponse.FromString(resp.read())
        conn.close()
        assert resp.status == 200
        assert reply.partial_success.rejected_log_records == 1
        assert rx.stats.get(RECEIVER_ITEMS_REJECTED, signal="logs", reason="bad_trace_id") == 1
