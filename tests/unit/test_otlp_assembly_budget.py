"""Application requests held for linking are bounded in bytes (the shared ByteBudget) as well as in count."""

from __future__ import annotations

import threading

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.contract.budget import ByteBudget
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, Stats
from aaco.exporters.otlp_assembly import TraceAssembler
from aaco.exporters.otlp_settings import OtlpConfig
from aaco.exporters.otlp_traces import OtlpTraceExporter
from aaco.exporters.otlp_transport import SendResult

from .builders import NODE


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def request(tag: str, blob: int = 0) -> trace_service_pb2.ExportTraceServiceRequest:
    req = trace_service_pb2.ExportTraceServiceRequest()
    span = req.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x01" * 16, b"\x02" * 8, tag
    if blob:
        kv = span.attributes.add()
        kv.key, kv.value.string_value = "blob", "x" * blob
    return req


def test_held_requests_stay_within_half_the_budget_and_the_oldest_go_first():
    stats, clock = Stats(), Clock()
    budget = ByteBudget(10_000, stats)
    asm = TraceAssembler(NODE, stats, clock=clock, budget=budget, link_window_s=5.0)
    pushed = []
    for i in range(10):
        pushed += asm.add_application(request(f"r{i}"), [], 1, 2000)
        assert budget.held_by("assembly") <= 5000  # the export queue keeps the other half
    assert [r.request.resource_spans[0].scope_spans[0].spans[0].name for r in pushed] == [f"r{i}" for i in range(8)]
    assert budget.held_by("assembly") == 4000
    assert len(asm.due_applications(everything=True)) == 2
    assert budget.held == 0


def test_other_holders_over_the_budget_push_the_held_requests_out():
    stats = Stats()
    budget = ByteBudget(10_000, stats)
    asm = TraceAssembler(NODE, stats, clock=Clock(), budget=budget)
    assert asm.add_application(request("a"), [], 1, 1000) == []
    budget.acquire("otlp", 9500)
    pushed = asm.add_application(request("b"), [], 1, 1000)
    assert len(pushed) == 2 and budget.held_by("assembly") == 0


def test_the_count_bound_stays():
    budget = ByteBudget(10**9, Stats())
    asm = TraceAssembler(NODE, Stats(), clock=Clock(), budget=budget, max_app_requests=3)
    pushed = [r for i in range(5) for r in asm.add_application(request(str(i)), [], 1, 10)]
    assert len(pushed) == 2 and budget.held_by("assembly") == 30


class Recorder:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.lock = threading.Lock()

    def send(self, payload: bytes, timeout_s: float) -> SendResult:
        with self.lock:
            self.sent.append(payload)
        return SendResult(True)

    def close(self) -> None:
        pass


def test_the_trace_exporter_holds_the_wire_size_then_hands_it_to_its_queue():
    stats = Stats()
    budget = ByteBudget(64 * 1024 * 1024, stats)
    t = Recorder()
    cfg = OtlpConfig(endpoint="http://127.0.0.1:1")
    exp = OtlpTraceExporter(cfg, stats, NODE, env={}, transport=t, link_window_s=60.0, budget=budget)
    req = request("app", blob=100_000)
    exp.accept_spans(req, 1)  # no size given: measured
    assert budget.held_by("assembly") == req.ByteSize()
    exp.accept_spans(request("app2"), 1, nbytes=123)
    assert budget.held_by("assembly") == req.ByteSize() + 123
    exp.start()
    assert exp.force_flush(10)
    assert budget.held == 0 and len(t.sent) == 2 and stats.get(EVENTS_EMITTED, component="exporter:otlp") == 2
    assert stats.total(EVENTS_DROPPED) == 0
    exp.shutdown(1)
