"""Malformed trace and span ids: which spans and log records the receiver drops, and why."""

from __future__ import annotations

import pytest
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.agent.receivers.ids import drop_malformed

TRACE, SPAN = b"\x01" * 16, b"\x02" * 8


def traces(**bad) -> trace_service_pb2.ExportTraceServiceRequest:
    req = trace_service_pb2.ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    ss.spans.add(name="good", trace_id=TRACE, span_id=SPAN, parent_span_id=SPAN).links.add(trace_id=TRACE, span_id=SPAN)
    span = ss.spans.add(name="bad", trace_id=TRACE, span_id=SPAN)
    for key, value in bad.items():
        if key.startswith("link_"):
            link = span.links.add(trace_id=TRACE, span_id=SPAN)
            setattr(link, key.removeprefix("link_"), value)
        else:
            setattr(span, key, value)
    ss.spans.add(name="good too", trace_id=TRACE, span_id=SPAN)
    return req


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"trace_id": b"\x03" * 32}, "bad_trace_id"),
        ({"trace_id": b"\x03" * 3}, "bad_trace_id"),
        ({"trace_id": b""}, "bad_trace_id"),
        ({"trace_id": bytes(16)}, "bad_trace_id"),
        ({"span_id": b"\x03" * 16}, "bad_span_id"),
        ({"span_id": bytes(8)}, "bad_span_id"),
        ({"parent_span_id": b"\x03" * 3}, "bad_parent_span_id"),
        ({"link_trace_id": b"\x03" * 8}, "bad_link_id"),
        ({"link_span_id": b""}, "bad_link_id"),
    ],
)
def test_a_span_with_a_bad_id_is_dropped_and_its_neighbours_kept(bad, reason):
    req = traces(**bad)
    assert drop_malformed("traces", req) == {reason: 1}
    assert [s.name for s in req.resource_spans[0].scope_spans[0].spans] == ["good", "good too"]


def test_good_spans_are_left_alone():
    req = traces()
    before = req.SerializeToString()
    assert not drop_malformed("traces", req)
    assert req.SerializeToString() == before


def test_log_records_may_lack_ids_but_not_carry_wrong_ones():
    req = logs_service_pb2.ExportLogsServiceRequest()
    sl = req.resource_logs.add().scope_logs.add()
    sl.log_records.add(severity_text="no ids")
    sl.log_records.add(severity_text="ids", trace_id=TRACE, span_id=SPAN)
    sl.log_records.add(severity_text="long trace id", trace_id=b"\x01" * 32)
    sl.log_records.add(severity_text="short span id", span_id=b"\x01" * 4)
    assert drop_malformed("logs", req) == {"bad_trace_id": 1, "bad_span_id": 1}
    assert [r.severity_text for r in sl.log_records] == ["no ids", "ids"]


def test_metrics_are_not_checked():
    assert not drop_malformed("metrics", object())
