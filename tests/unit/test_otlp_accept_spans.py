"""The trace exporter's public accept_spans: received application spans are linked to GPU iterations, then forwarded."""

from __future__ import annotations

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.agent.receivers.base import SpanSink
from aaco.contract.stats import Stats
from aaco.exporters.otlp_settings import OtlpConfig
from aaco.exporters.otlp_traces import OtlpTraceExporter

from .builders import NODE, item, iterations
from .test_otlp_assembly_budget import Recorder


def app_request(pid: int, start_ns: int, end_ns: int) -> trace_service_pb2.ExportTraceServiceRequest:
    req = trace_service_pb2.ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.int_value = "process.pid", pid
    span = rs.scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\x0a" * 16, b"\x0b" * 8, "handle request"
    span.start_time_unix_nano, span.end_time_unix_nano = start_ns, end_ns
    return req


def forwarded(sent: list[bytes]) -> list:
    """The application spans among what was sent (the agent's own spans carry no process.pid resource)."""
    out = []
    for payload in sent:
        req = trace_service_pb2.ExportTraceServiceRequest.FromString(payload)
        for rs in req.resource_spans:
            if any(kv.key == "process.pid" for kv in rs.resource.attributes):
                out += [s for ss in rs.scope_spans for s in ss.spans]
    return out


def exporter(transport: Recorder, receiving: bool = True) -> OtlpTraceExporter:
    cfg = OtlpConfig(endpoint="http://127.0.0.1:1")
    return OtlpTraceExporter(cfg, Stats(), NODE, env={}, transport=transport, link_window_s=60.0, receiving=receiving)


def test_the_trace_exporter_is_the_receivers_span_sink():
    assert isinstance(exporter(Recorder()), SpanSink)


def test_accepted_spans_are_linked_to_the_iterations_they_cover_then_forwarded():
    t = Recorder()
    exp = exporter(t)
    exp.start()
    exp.export(item("iterations", iterations([(2_000, 3_000), (9_000, 9_500)], pid=7)))
    exp.accept_spans(app_request(7, 1_000, 5_000), 1, nbytes=64)
    assert exp.force_flush(10)
    (span,) = forwarded(t.sent)
    assert span.name == "handle request"
    assert len(span.links) == 1  # the iteration starting inside it, not the one after it
    roots = [
        s
        for payload in t.sent
        for rs in trace_service_pb2.ExportTraceServiceRequest.FromString(payload).resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
        if s.span_id == span.links[0].span_id
    ]
    assert len(roots) == 1 and [bytes(link.span_id) for link in roots[0].links] == [b"\x0b" * 8]
    exp.shutdown(1)


def test_spans_of_another_process_are_forwarded_unlinked():
    t = Recorder()
    exp = exporter(t)
    exp.start()
    exp.export(item("iterations", iterations([(2_000, 3_000)], pid=7)))
    exp.accept_spans(app_request(8, 1_000, 5_000), 1)
    assert exp.force_flush(10)
    (span,) = forwarded(t.sent)
    assert len(span.links) == 0
    exp.shutdown(1)


def test_without_an_endpoint_accepted_spans_are_ignored():
    exp = OtlpTraceExporter(OtlpConfig(), Stats(), NODE, env={})
    exp.accept_spans(app_request(7, 1_000, 5_000), 1)
    assert exp.force_flush(1)
    exp.shutdown(1)
