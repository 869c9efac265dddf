"""LLM request spans read from received OTLP traces into ``requests`` rows: both namings, bad values, the hook."""

from __future__ import annotations

import math

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.agent.receivers.genai import REQUEST_VALUES_INVALID, RequestRows
from aaco.agent.receivers.otlp import OtlpReceiver
from aaco.contract.schemas import REQUESTS
from aaco.contract.stats import Stats
from tests.unit.builders import Bus, SpanRecorder

SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT


def value(v: object) -> common_pb2.AnyValue:
    if isinstance(v, bool):
        raise TypeError(v)
    if isinstance(v, int):
        return common_pb2.AnyValue(int_value=v)
    if isinstance(v, float):
        return common_pb2.AnyValue(double_value=v)
    if isinstance(v, list):
        return common_pb2.AnyValue(array_value=common_pb2.ArrayValue(values=[value(x) for x in v]))
    return common_pb2.AnyValue(string_value=str(v))


def kvs(attrs: dict[str, object]) -> list[common_pb2.KeyValue]:
    return [common_pb2.KeyValue(key=k, value=value(v)) for k, v in attrs.items()]


def span(attrs: dict[str, object], kind: int = SERVER, n: int = 1, start: int = 1_000, end: int = 3_000):
    return trace_pb2.Span(
        trace_id=bytes([n]) * 16,
        span_id=bytes([n]) * 8,
        name="llm_request",
        kind=kind,
        start_time_unix_nano=start,
        end_time_unix_nano=end,
        attributes=kvs(attrs),
    )


def request(resource: dict[str, object], *spans: trace_pb2.Span) -> trace_service_pb2.ExportTraceServiceRequest:
    msg = trace_service_pb2.ExportTraceServiceRequest()
    rs = msg.resource_spans.add()
    rs.resource.attributes.extend(kvs(resource))
    rs.scope_spans.add().spans.extend(spans)
    return msg


VLLM = {
    "gen_ai.response.model": "llama-3-8b",
    "gen_ai.request.id": "cmpl-1",
    "gen_ai.usage.prompt_tokens": 120,
    "gen_ai.usage.completion_tokens": 33,
    "gen_ai.latency.time_in_queue": 0.004,
    "gen_ai.latency.time_to_first_token": 0.21,
    "gen_ai.latency.e2e": 1.05,
    "gen_ai.latency.time_in_model_prefill": 0.18,
    "gen_ai.latency.time_in_model_decode": 0.82,
    "gen_ai.latency.time_in_model_inference": 1.0,
    "gen_ai.request.max_tokens": 64,
}
POD = {"k8s.namespace.name": "serving", "k8s.pod.name": "vllm-0", "service.name": "vllm", "process.pid": 4242}


def test_vllm_naming_fills_every_field():
    rows = RequestRows("node-a", Stats()).read(request(POD, span(VLLM, n=7)))
    assert rows is not None and rows.schema == REQUESTS
    (row,) = rows.to_pylist()
    assert row == {
        "start_ns": 1_000,
        "end_ns": 3_000,
        "node": "node-a",
        "model": "llama-3-8b",
        "trace_id": "07" * 16,
        "span_id": "07" * 8,
        "source": "otlp",
        "request_id": "cmpl-1",
        "namespace": "serving",
        "pod": "vllm-0",
        "service": "vllm",
        "pid": 4242,
        "input_tokens": 120,
        "output_tokens": 33,
        "queue_s": 0.004,
        "ttft_s": 0.21,
        "e2e_s": 1.05,
        "prefill_s": 0.18,
        "decode_s": 0.82,
        "inference_s": 1.0,
        "finish_reason": None,
        **dict.fromkeys(("job", "rank", "world_size", "local_rank", "dist_backend")),  # not a training job's
    }


def test_genai_semconv_naming_and_finish_reasons_array():
    attrs = {
        "gen_ai.request.model": "mistral-7b",
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.response.finish_reasons": ["length", "stop"],
    }
    (row,) = RequestRows("n", Stats()).read(request({}, span(attrs))).to_pylist()
    assert (row["model"], row["input_tokens"], row["output_tokens"]) == ("mistral-7b", 10, 5)
    assert row["finish_reason"] == "length"  # the first sequence's
    assert row["namespace"] is row["pod"] is row["pid"] is row["ttft_s"] is None


def test_response_model_wins_over_request_model():
    attrs = {"gen_ai.request.model": "alias", "gen_ai.response.model": "served-name", "gen_ai.latency.e2e": 1.0}
    (row,) = RequestRows("n", Stats()).read(request({}, span(attrs))).to_pylist()
    assert row["model"] == "served-name"


def test_spans_that_are_not_requests_are_not_read():
    msg = request(
        POD,
        span(VLLM, kind=CLIENT, n=1),  # a client's view of a call
        span({k: v for k, v in VLLM.items() if "model" not in k}, n=2),  # no model
        span({"gen_ai.response.model": "m", "gen_ai.request.id": "x"}, n=3),  # a model but no usage nor latency
        span({"http.route": "/v1/completions"}, n=4),
    )
    assert RequestRows("n", Stats()).read(msg) is None


def test_bad_values_are_counted_and_the_rest_of_the_row_kept():
    stats = Stats()
    attrs = {
        "gen_ai.response.model": "m",
        "gen_ai.usage.prompt_tokens": "120",  # a string
        "gen_ai.usage.completion_tokens": 2.5,  # not a count
        "gen_ai.latency.time_in_queue": -0.1,  # negative
        "gen_ai.latency.time_to_first_token": math.nan,
        "gen_ai.latency.e2e": math.inf,
        "gen_ai.latency.time_in_model_prefill": 0.5,
        "gen_ai.latency.time_in_model_decode": 3,  # an int of seconds is fine
    }
    (row,) = RequestRows("n", stats).read(request({"process.pid": "12"}, span(attrs))).to_pylist()
    assert row["model"] == "m" and row["prefill_s"] == 0.5 and row["decode_s"] == 3.0
    bad = ("input_tokens", "output_tokens", "queue_s", "ttft_s", "e2e_s", "pid")
    assert all(row[f] is None for f in bad)
    for f in bad:
        assert stats.get(REQUEST_VALUES_INVALID, field=f) == 1, f
    assert stats.get(REQUEST_VALUES_INVALID, field="prefill_s") == 0


def test_a_time_past_int64_drops_that_row_only():
    stats = Stats()
    msg = request({}, span(VLLM, n=1, end=2**64 - 1), span(VLLM, n=2))
    rows = RequestRows("n", stats).read(msg)
    assert rows.column("span_id").to_pylist() == ["02" * 8]
    assert stats.get(REQUEST_VALUES_INVALID, field="time") == 1


def test_receiver_publishes_rows_before_adding_the_agents_own_pod_and_forwards_spans_unchanged():
    bus, sink = Bus(), SpanRecorder()
    agent_pod = {"host.name": "node-a", "k8s.pod.name": "aaco-agent-xyz", "k8s.namespace.name": "aaco"}
    rx = OtlpReceiver(OtlpReceiverConfig(enabled=True), Stats(), agent_pod, sink, None, None, bus=bus, node="node-a")
    sent = request({"service.name": "vllm"}, span(VLLM, n=1), span({"http.route": "/health"}, n=2))
    rx.handle("traces", sent.SerializeToString())
    (item,) = bus.items
    assert item.kind == "requests" and item.source == "otlp"
    (row,) = item.batch.to_pylist()
    assert row["pod"] is None and row["namespace"] is None and row["node"] == "node-a"
    (forwarded,) = sink.requests
    assert forwarded.resource_spans[0].scope_spans[0] == sent.resource_spans[0].scope_spans[0]  # spans as sent
    got = {kv.key: kv.value.string_value for kv in forwarded.resource_spans[0].resource.attributes}
    assert got["k8s.pod.name"] == "aaco-agent-xyz"  # the forwarded resource is enriched as before


def test_receiver_without_a_bus_reads_nothing():
    sink = SpanRecorder()
    rx = OtlpReceiver(OtlpReceiverConfig(enabled=True), Stats(), {}, sink, None, None)
    rx.handle("traces", request(POD, span(VLLM)).SerializeToString())
    assert len(sink.requests) == 1


def test_zero_values_are_kept_and_booleans_refused():
    """A zero is read as a value (not as an unset field); a boolean is not a count nor seconds."""
    stats = Stats()
    attrs = {
        "gen_ai.response.model": "m",
        "gen_ai.usage.prompt_tokens": 0,
        "gen_ai.usage.completion_tokens": 0.0,
        "gen_ai.latency.time_in_queue": 0.0,
        "gen_ai.latency.time_to_first_token": 0,
        "gen_ai.response.finish_reason": "stop",
    }
    sent = span(attrs)
    for key in ("gen_ai.latency.e2e", "gen_ai.latency.time_in_model_decode"):
        sent.attributes.add(key=key).value.bool_value = True
    (row,) = RequestRows("n", stats).read(request({}, sent)).to_pylist()
    assert (row["input_tokens"], row["output_tokens"], row["queue_s"], row["ttft_s"]) == (0, 0, 0.0, 0.0)
    assert row["finish_reason"] == "stop"
    assert row["e2e_s"] is None and row["decode_s"] is None
    assert stats.get(REQUEST_VALUES_INVALID, field="e2e_s") == stats.get(REQUEST_VALUES_INVALID, field="decode_s") == 1
    assert stats.get(REQUEST_VALUES_INVALID, field="input_tokens") == 0
