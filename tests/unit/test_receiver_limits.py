"""What one span or log record may carry (the SDKs' count limits), and what a parsed request costs."""

from __future__ import annotations

import subprocess
import sys

from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.agent.receivers.limits import PARSE_FACTOR, ItemLimits, apply, parsed_cost


def spans_request(spans: int, attributes: int, events: int = 0, links: int = 0) -> bytes:
    req = trace_service_pb2.ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    for s in range(spans):
        span = ss.spans.add(trace_id=b"\1" * 16, span_id=(s + 1).to_bytes(8, "big"), name="s")
        for a in range(attributes):
            kv = span.attributes.add(key=f"k{a}")
            kv.value.int_value = a
        for _ in range(events):
            span.events.add(name="e").attributes.add(key="x").value.bool_value = True
        for _ in range(links):
            span.links.add(trace_id=b"\2" * 16, span_id=b"\3" * 8)
    return req.SerializeToString()


def test_spans_keep_the_first_128_of_each_and_say_how_many_they_dropped():
    msg = trace_service_pb2.ExportTraceServiceRequest.FromString(spans_request(2, 300, events=130, links=200))
    kept, dropped, _ = apply("traces", msg, ItemLimits())
    for span in kept.resource_spans[0].scope_spans[0].spans:
        assert [kv.key for kv in span.attributes] == [f"k{a}" for a in range(128)]
        assert (len(span.events), len(span.links)) == (128, 128)
        assert (span.dropped_attributes_count, span.dropped_events_count, span.dropped_links_count) == (172, 2, 72)
    assert dropped == {"span_attributes": 344, "span_events": 4, "span_links": 144}


def test_a_request_within_the_limits_is_not_copied():
    msg = trace_service_pb2.ExportTraceServiceRequest.FromString(spans_request(10, 5, events=2))
    kept, dropped, cost = apply("traces", msg, ItemLimits())
    assert kept is msg and not dropped
    assert cost == parsed_cost(msg.ByteSize(), 10 * 5 + 10 * 2, 10 * 3)


def test_log_records_keep_their_first_attributes():
    req = logs_service_pb2.ExportLogsServiceRequest()
    record = req.resource_logs.add().scope_logs.add().log_records.add()
    for a in range(10):
        record.attributes.add(key=str(a)).value.int_value = a
    kept, dropped, _ = apply("logs", req, ItemLimits(attributes_per_log_record=4))
    rec = kept.resource_logs[0].scope_logs[0].log_records[0]
    assert len(rec.attributes) == 4 and rec.dropped_attributes_count == 6 and dropped == {"log_record_attributes": 6}


MEASURE = """
import gc, sys
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from aaco.contract.memory import rss_bytes
wire = sys.stdin.buffer.read()
gc.collect()
before = rss_bytes()
held = [trace_service_pb2.ExportTraceServiceRequest.FromString(wire) for _ in range(5)]
print((rss_bytes() - before) / 5)
"""


def parsed_growth(wire: bytes) -> float:
    """What one parsed copy of ``wire`` costs, measured in a fresh process (no freed memory to reuse)."""
    out = subprocess.run([sys.executable, "-c", MEASURE], input=wire, capture_output=True, check=True, timeout=120)
    return float(out.stdout)


def test_the_cost_bounds_what_parsed_requests_take_and_the_parse_factor_bounds_any_shape():
    for spans, attributes in ((1, 60_000), (3000, 1), (500, 40)):
        wire = spans_request(spans, attributes)
        grown = parsed_growth(wire)
        cost = parsed_cost(len(wire), spans * attributes, spans)
        assert grown <= cost <= 3 * grown, (spans, attributes, grown, cost)
        assert grown <= PARSE_FACTOR * len(wire), (spans, attributes, grown / len(wire))
