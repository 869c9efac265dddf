"""OTLP/HTTP JSON: read as the specification's JSON Protobuf Encoding, handled exactly as the same protobuf request.

The oracles are protobuf's own JSON writer (with OTLP's hex ids, ``tests/support/otlp_json.py``) and the
upstream opentelemetry-proto examples (``tests/data/otlp``: ``trace.json`` and the ``trace.protobuf-text``
describing the same request).
"""

from __future__ import annotations

import gzip

import orjson
import pytest
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.agent.receivers.http_wire import Request
from aaco.agent.receivers.otlp import RECEIVER_REQUESTS, OtlpReceiver
from aaco.agent.receivers.otlp_json import JSON_PARSE_FACTOR, JsonRequestError, decode
from aaco.contract.budget import ByteBudget
from aaco.contract.http_app import Reply
from aaco.contract.stats import Stats
from tests.support.otlp_json import DATA, rich_request, to_json, upstream_trace
from tests.unit.builders import Bus, SpanRecorder

TRACES = trace_service_pb2.ExportTraceServiceRequest
JSON = {"content-type": "application/json"}
PROTOBUF = {"content-type": "application/x-protobuf"}


def test_the_upstream_example_reads_as_the_request_its_protobuf_text_describes():
    body, expected = upstream_trace()
    assert decode(TRACES, body).SerializeToString() == expected.SerializeToString()


@pytest.mark.parametrize(
    "spelling",
    [{}, {"snake_case": True}, {"enum_names": True}, {"int64_numbers": True}],
    ids=["camelCase", "snake_case", "enum-names", "int64-numbers"],
)
def test_json_written_by_protobuf_reads_back_byte_equal(spelling):
    sent = rich_request()
    assert decode(TRACES, to_json(sent, **spelling)).SerializeToString() == sent.SerializeToString()


def test_metrics_exemplar_ids_and_log_record_ids_are_hex_too():
    metrics = metrics_service_pb2.ExportMetricsServiceRequest()
    json_format.Parse((DATA / "metrics.json").read_text(), metrics)  # no ids in it: protobuf's own reader agrees
    point = metrics.resource_metrics[0].scope_metrics[0].metrics[2].histogram.data_points[0]
    point.exemplars.add(trace_id=bytes(range(16)), span_id=bytes(range(8)), as_double=1.0, time_unix_nano=5)
    got = decode(metrics_service_pb2.ExportMetricsServiceRequest, to_json(metrics))
    assert got.SerializeToString() == metrics.SerializeToString()
    logs = decode(logs_service_pb2.ExportLogsServiceRequest, (DATA / "logs.json").read_bytes())
    record = logs.resource_logs[0].scope_logs[0].log_records[0]
    assert record.trace_id.hex() == "5b8efff798038103d269b633813fc60c" and record.span_id.hex() == "eee19b7ec3c1b174"
    assert decode(logs_service_pb2.ExportLogsServiceRequest, to_json(logs)) == logs


def test_unknown_fields_are_ignored_and_null_is_the_default():
    tree = orjson.loads(to_json(rich_request()))
    tree["futureField"] = {"deep": [1, 2, {"x": None}]}
    span = tree["resourceSpans"][0]["scopeSpans"][0]["spans"][1]
    span["somethingNew"] = "ignored"
    span["parentSpanId"] = None
    got = decode(TRACES, orjson.dumps(tree))
    assert got.resource_spans[0].scope_spans[0].spans[1].parent_span_id == b""


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "not JSON"),
        (b'{"resourceSpans": [', "not JSON"),
        (b"[]", "a JSON object is expected"),
        (b'{"resourceSpans": {"scopeSpans": []}}', "repeated field resourceSpans"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "5B8EFFF7980381zz"}]}]}]}', "traceId: not a hex"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "abc"}]}]}]}', "spanId: not a hex"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "01 02"}]}]}]}', "spanId: not a hex"),
        (b'{"resource_spans": [{"scope_spans": [{"spans": [{"trace_id": 12}]}]}]}', "trace_id: a hex string"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"links": [{"spanId": "xy"}]}]}]}]}', "links[0].spanId"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"startTimeUnixNano": "soon"}]}]}]}', "startTimeUnixNano"),
    ],
)
def test_what_is_not_an_otlp_json_request_is_refused_saying_where(body, why):
    with pytest.raises(JsonRequestError) as err:
        decode(TRACES, body)
    assert why in str(err.value)


def test_json_nests_no_deeper_than_protobuf_may():
    """upb refuses protobuf nested past 100 messages, JSON gets the same limit; raw nesting stops at 1024 levels."""
    for levels, refused in ((40, False), (60, True)):  # two messages a level: AnyValue, ArrayValue
        wire = _as_attribute_value(_nested_bytes(levels))
        inner = b'{"stringValue": "leaf"}'
        for _ in range(levels):
            inner = b'{"arrayValue": {"values": [' + inner + b"]}}"
        body = b'{"resourceSpans": [{"resource": {"attributes": [{"key": "k", "value": ' + inner + b"}]}}]}"
        if refused:
            with pytest.raises(DecodeError):
                TRACES.FromString(wire)
            with pytest.raises(JsonRequestError, match="too deep"):
                decode(TRACES, body)
        else:
            assert decode(TRACES, body).SerializeToString() == TRACES.FromString(wire).SerializeToString()
    with pytest.raises(JsonRequestError, match="not JSON"):  # past orjson's 1024 levels, in a field nobody reads
        decode(TRACES, b'{"unknown": ' + b"[" * 2000 + b"]" * 2000 + b"}")


def _wrap(field: int, payload: bytes) -> bytes:
    return bytes([field << 3 | 2]) + _varint(len(payload)) + payload


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _nested_bytes(levels: int) -> bytes:
    """An AnyValue nested ``levels`` times through array_value, written field by field (upb cannot build it)."""
    value = _wrap(1, b"leaf")  # AnyValue.string_value
    for _ in range(levels):
        value = _wrap(5, _wrap(1, value))  # AnyValue.array_value -> ArrayValue.values
    return value


def _as_attribute_value(value: bytes) -> bytes:
    key_value = _wrap(1, b"k") + _wrap(2, value)  # KeyValue.key, KeyValue.value
    resource = _wrap(1, key_value)  # Resource.attributes
    return _wrap(1, _wrap(1, resource))  # ExportTraceServiceRequest.resource_spans -> ResourceSpans.resource


# -- through the receiver's HTTP handler -------------------------------------------------------------


class _Forwarder:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def enqueue(self, payload: bytes, n: int) -> None:
        self.payloads.append(payload)


def _receiver(budget_bytes: int = 64 << 20):
    stats = Stats()
    sink, bus, metrics, logs = SpanRecorder(), Bus(), _Forwarder(), _Forwarder()
    config = OtlpReceiverConfig(enabled=True)
    rx = OtlpReceiver(config, stats, {"host.name": "node-a"}, sink, metrics, logs, ByteBudget(budget_bytes, stats), bus)
    return rx, sink, bus, metrics, logs


def _post(rx: OtlpReceiver, signal: str, headers: dict[str, str], body: bytes) -> Reply:
    return rx._http_request(Request(signal, headers, body, "127.0.0.1:5000"))


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=utf-8", "Application/JSON"])
def test_a_json_request_reaches_the_sinks_and_rows_as_its_protobuf_twin_does(ctype):
    rx, sink, bus, _, _ = _receiver()
    as_protobuf = _post(rx, "traces", PROTOBUF, rich_request().SerializeToString())
    as_json = _post(rx, "traces", {"content-type": ctype}, to_json(rich_request()))
    assert (as_protobuf.status, as_protobuf.content_type) == (200, "application/x-protobuf")
    assert (as_json.status, as_json.content_type, as_json.body) == (200, "application/json", b"{}")
    first, second = (r.SerializeToString() for r in sink.requests)
    assert first == second  # the same spans, the same node attributes added, handed on alike
    rows = [item.batch for item in bus.items]
    assert len(rows) == 2 and rows[0].num_rows == 1 and rows[0].equals(rows[1])
    assert rx.stats.get(RECEIVER_REQUESTS, protocol="http", signal="traces", outcome="accepted") == 2


def test_gzip_applies_to_json_and_metrics_and_logs_are_forwarded_as_protobuf():
    rx, _, _, metrics, logs = _receiver()
    for signal, name, forwarder, message in (
        ("metrics", "metrics.json", metrics, metrics_service_pb2.ExportMetricsServiceRequest),
        ("logs", "logs.json", logs, logs_service_pb2.ExportLogsServiceRequest),
    ):
        body = (DATA / name).read_bytes()
        twin = decode(message, body)
        assert _post(rx, signal, PROTOBUF, twin.SerializeToString()).status == 200
        reply = _post(rx, signal, {**JSON, "content-encoding": "gzip"}, gzip.compress(body))
        assert (reply.status, reply.body) == (200, b"{}")
        assert forwarder.payloads[0] == forwarder.payloads[1]


def test_partial_success_is_answered_in_json_as_in_protobuf():
    """A 32-byte trace id in good hex is read, then dropped as in a protobuf request; the answer says so."""
    sent = rich_request()
    sent.resource_spans[0].scope_spans[0].spans[1].trace_id = bytes(range(32))
    rx, sink, _, _, _ = _receiver()
    protobuf_reply = trace_service_pb2.ExportTraceServiceResponse.FromString(
        _post(rx, "traces", PROTOBUF, sent.SerializeToString()).body
    )
    reply = _post(rx, "traces", JSON, to_json(sent))
    assert reply.status == 200
    assert orjson.loads(reply.body) == json_format.MessageToDict(protobuf_reply)
    assert orjson.loads(reply.body)["partialSuccess"]["rejectedSpans"] == "1"
    assert sink.requests[0] == sink.requests[1]


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"{not json", "not JSON"),
        (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "not-hex"}]}]}]}', "traceId: not a hex"),
        (b'{"x": ' + b"[" * 1100 + b"]" * 1100 + b"}", "depth"),
    ],
)
def test_bad_json_is_400_with_a_json_status_and_counted(body, why):
    rx, sink, _, _, _ = _receiver()
    reply = _post(rx, "traces", JSON, body)
    assert (reply.status, reply.content_type) == (400, "application/json")
    assert why in orjson.loads(reply.body)["message"]
    assert not sink.requests
    assert rx.stats.get(RECEIVER_REQUESTS, protocol="http", signal="traces", outcome="malformed") == 1
    assert rx.budget.held == 0


def test_other_content_types_are_415():
    rx, _, _, _, _ = _receiver()
    assert _post(rx, "traces", {"content-type": "text/plain"}, b"{}").status == 415
    assert _post(rx, "traces", {}, b"").status == 415


def test_the_parsed_json_tree_is_held_in_the_byte_budget():
    body = to_json(rich_request())
    need = JSON_PARSE_FACTOR * len(body)
    rx, sink, _, _, _ = _receiver(budget_bytes=need - 1)  # could never be admitted: retrying would not help
    reply = _post(rx, "traces", JSON, body)
    assert (reply.status, reply.content_type) == (413, "application/json")
    assert "memory budget" in orjson.loads(reply.body)["message"]
    rx, sink, _, _, _ = _receiver(budget_bytes=need + 100)
    rx.budget.acquire("assembly", 200)  # others hold some: this one waits its turn
    reply = _post(rx, "traces", JSON, body)
    assert (reply.status, dict(reply.headers)) == (503, {"Retry-After": "1"})
    assert rx.stats.get(RECEIVER_REQUESTS, protocol="http", signal="traces", outcome="over_budget") == 1
    rx.budget.release("assembly", 200)
    assert _post(rx, "traces", JSON, body).status == 200
    assert rx.budget.held_by("receiver") == 0 and len(sink.requests) == 1
