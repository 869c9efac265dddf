"""The node's OTLP receiver: a plain OpenTelemetry SDK client, linking to GPU iterations, bad requests."""

from __future__ import annotations

import gzip
import json
import os
import time
import urllib.error
import urllib.request
from collections import Counter

import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from aaco.agent.config import load_config
from aaco.agent.receivers.otlp import RECEIVER_ITEMS_REJECTED, RECEIVER_REQUESTS
from aaco.agent.service import AgentService
from tests.conftest import get_free_port
from tests.integration.helpers import read_lake
from tests.support.otlp_json import rich_request, to_json, upstream_trace
from tests.support.otlp_receivers import GrpcReceiver

pytestmark = pytest.mark.integration
TRACES = trace_service_pb2.ExportTraceServiceRequest


def agent(tmp_path, upstream_port, sources, **rx):
    cfg = load_config(
        None,
        {
            "node": "gpu-node-1",
            "sources": sources,
            "exporters": {
                "prometheus": {"enabled": False},
                "lake": {"path": str(tmp_path / "lake")},
                "otlp": {"endpoint": f"http://127.0.0.1:{upstream_port}", "trace_window_s": 0.5},
            },
            "receivers": {"otlp": {"enabled": True, "grpc_port": 0, "http_port": 0, "link_window_s": 2.0, **rx}},
        },
        env={},
    )
    return AgentService(cfg)


def sdk_tracer(exporter):
    provider = TracerProvider(resource=Resource.create({"service.name": "inference-api", "process.pid": os.getpid()}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def check_links(spans):
    request = [s for r, s in spans if s.name == "POST /v1/infer"]
    iterations = [s for r, s in spans if s.name == "model_run"]
    assert len(request) == 1 and len(iterations) == 5
    (req,) = request
    linked = {(lk.trace_id, lk.span_id) for lk in req.links}
    assert linked == {(it.trace_id, it.span_id) for it in iterations}  # request -> every iteration of its window
    for it in iterations:  # and they link back
        assert (req.trace_id, req.span_id) in {(lk.trace_id, lk.span_id) for lk in it.links}
    res = next(r for r, s in spans if s.name == "POST /v1/infer")
    keys = {kv.key: kv.value.string_value for kv in res.attributes}
    assert keys["service.name"] == "inference-api"  # the application's own resource, forwarded
    assert keys["host.name"] == "gpu-node-1"  # plus the node's


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_sdk_request_spans_link_to_the_iterations_they_contain(tmp_path, protocol):
    """`aaco run`'s workload executes in this process inside an application request span."""
    grpc_port, http_port = get_free_port(), get_free_port()
    exporter = (
        GrpcSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True)
        if protocol == "grpc"
        else HttpSpanExporter(endpoint=f"http://127.0.0.1:{http_port}/v1/traces")
    )
    provider = sdk_tracer(exporter)
    with GrpcReceiver() as upstream:
        svc = agent(
            tmp_path,
            upstream.port,
            [{"type": "ort", "iterations": 5, "warmup": 1, "cycles": 1}],
            grpc_port=grpc_port,
            http_port=http_port,
        )
        with provider.get_tracer("test").start_as_current_span("POST /v1/infer"):
            svc.start()
            deadline = time.monotonic() + 120
            while not svc.sources_done() and time.monotonic() < deadline:
                time.sleep(0.05)
        provider.force_flush()
        svc.shutdown(timeout_s=20)
        provider.shutdown()
        check_links(upstream.got.spans())


def test_bad_requests_get_the_right_status_and_are_counted(tmp_path):
    with GrpcReceiver() as upstream:
        svc = agent(tmp_path, upstream.port, [], max_message_bytes=10_000)
        svc.start()
        try:
            rx = svc.receivers["otlp"]
            base = f"http://127.0.0.1:{rx.http_port}"

            def post(path, body, ctype="application/x-protobuf", enc=None):
                headers = {"Content-Type": ctype}
                if enc:
                    headers["Content-Encoding"] = enc
                req = urllib.request.Request(base + path, data=body, headers=headers, method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=5) as r:
                        return r.status
                except urllib.error.HTTPError as e:
                    return e.code

            assert post("/v1/traces", b"\xff\xff\xff not protobuf") == 400
            assert post("/v1/traces", b"{}", ctype="text/plain") == 415
            assert post("/v1/traces", b"x" * 20_000) == 413
            assert post("/v1/traces", gzip.compress(b"\x00" * 50_000), enc="gzip") == 413  # a small zip bomb
            assert post("/v1/nope", b"") == 404
            assert post("/v1/traces", b"") == 200  # an empty request is valid protobuf
            channel = grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}")
            call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            with pytest.raises(grpc.RpcError) as err:
                call(b"\xff\xff\xff not protobuf", timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            channel.close()
            st = svc.stats
            assert st.get(RECEIVER_REQUESTS, protocol="http", signal="traces", outcome="malformed") == 1
            assert st.get(RECEIVER_REQUESTS, protocol="http", signal="traces", outcome="unsupported") == 1
            assert st.get(RECEIVER_REQUESTS, protocol="http", signal="traces", outcome="too_large") == 2
            assert st.get(RECEIVER_REQUESTS, protocol="grpc", signal="traces", outcome="malformed") == 1
        finally:
            svc.shutdown(timeout_s=10)


def test_rate_limit_per_connection(tmp_path):
    with GrpcReceiver() as upstream:
        svc = agent(tmp_path, upstream.port, [], rate_limit_rps=2)
        svc.start()
        try:
            channel = grpc.insecure_channel(f"127.0.0.1:{svc.receivers['otlp'].grpc_port}")
            call = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            codes = []
            for _ in range(6):
                try:
                    call(b"", timeout=5)
                    codes.append("ok")
                except grpc.RpcError as e:
                    codes.append(e.code().name)
            channel.close()
            assert codes[:2] == ["ok", "ok"] and "RESOURCE_EXHAUSTED" in codes
        finally:
            svc.shutdown(timeout_s=10)


def _post(port: int, path: str, body: bytes) -> int:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=body, headers={"Content-Type": "application/x-protobuf"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()
        return r.status


def test_receiver_without_upstream_reads_request_spans_and_counts_what_it_does_not_forward(tmp_path, caplog):
    """No endpoint anywhere: spans and metrics are accepted, request spans still become rows, nothing goes out."""
    lake = tmp_path / "lake"
    cfg = load_config(
        None,
        {
            "node": "gpu-node-1",
            "exporters": {"prometheus": {"enabled": False}, "lake": {"path": str(lake), "flush_interval_s": 1}},
            "receivers": {"otlp": {"enabled": True, "grpc_port": 0, "http_port": 0}},
        },
        env={},
    )
    traces = trace_service_pb2.ExportTraceServiceRequest()
    ss = traces.resource_spans.add().scope_spans.add()
    span = ss.spans.add(name="llm_request", trace_id=b"\x01" * 16, span_id=b"\x02" * 8, kind=2)
    span.start_time_unix_nano, span.end_time_unix_nano = 1_790_000_000_000_000_000, 1_790_000_000_500_000_000
    for key, value in (("gen_ai.response.model", "m"), ("gen_ai.usage.completion_tokens", 3)):
        kv = span.attributes.add(key=key)
        if isinstance(value, str):
            kv.value.string_value = value
        else:
            kv.value.int_value = value
    ss.spans.add(name="other", trace_id=b"\x03" * 16, span_id=b"\x04" * 8)
    metrics = metrics_service_pb2.ExportMetricsServiceRequest()
    gauge = metrics.resource_metrics.add().scope_metrics.add().metrics.add(name="g").gauge
    gauge.data_points.add(as_double=1.0)
    gauge.data_points.add(as_double=2.0)
    svc = AgentService(cfg)
    with caplog.at_level("INFO", logger="aaco.receivers.otlp"):
        svc.start()
    try:
        rx = svc.receivers["otlp"]
        assert _post(rx.http_port, "/v1/traces", traces.SerializeToString()) == 200
        assert _post(rx.http_port, "/v1/metrics", metrics.SerializeToString()) == 200
        assert svc.stats.get(RECEIVER_ITEMS_REJECTED, signal="traces", reason="no_upstream") == 2
        assert svc.stats.get(RECEIVER_ITEMS_REJECTED, signal="metrics", reason="no_upstream") == 2
    finally:
        svc.shutdown(timeout_s=20)
    assert "receiver on without upstream for traces, metrics, logs" in caplog.text
    rows = read_lake(lake, "requests")
    assert rows.column("model").to_pylist() == ["m"] and rows.column("output_tokens").to_pylist() == [3]


def test_children_mode_moves_iterations_under_the_request(tmp_path):
    grpc_port = get_free_port()
    provider = sdk_tracer(GrpcSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True))
    with GrpcReceiver() as upstream:
        svc = agent(
            tmp_path,
            upstream.port,
            [{"type": "ort", "iterations": 3, "warmup": 1, "cycles": 1}],
            grpc_port=grpc_port,
            http_port=get_free_port(),
            link_mode="children",
        )
        with provider.get_tracer("test").start_as_current_span("POST /v1/infer"):
            svc.start()
            deadline = time.monotonic() + 120
            while not svc.sources_done() and time.monotonic() < deadline:
                time.sleep(0.05)
        provider.force_flush()
        svc.shutdown(timeout_s=20)
        provider.shutdown()
        spans = [s for _, s in upstream.got.spans()]
    (req,) = [s for s in spans if s.name == "POST /v1/infer"]
    iterations = [s for s in spans if s.name == "model_run"]
    assert len(iterations) == 3
    assert all(it.trace_id == req.trace_id and it.parent_span_id == req.span_id for it in iterations)
    kernels = [s for s in spans if s.parent_span_id in {it.span_id for it in iterations}]
    assert kernels and all(k.trace_id == req.trace_id for k in kernels)  # the whole trace moved
    assert len({s.trace_id for s in spans}) == 1


def test_spans_with_malformed_ids_are_dropped_counted_and_reported(tmp_path):
    """A 32-byte trace id (and a zero one) never goes upstream; the good span beside it does."""
    req = trace_service_pb2.ExportTraceServiceRequest()
    ss = req.resource_spans.add().scope_spans.add()
    ss.spans.add(name="good", trace_id=b"\x01" * 16, span_id=b"\x02" * 8, start_time_unix_nano=1, end_time_unix_nano=2)
    ss.spans.add(name="long-trace-id", trace_id=b"\x03" * 32, span_id=b"\x04" * 8)
    ss.spans.add(name="zero-trace-id", trace_id=bytes(16), span_id=b"\x05" * 8)
    body = req.SerializeToString()
    with GrpcReceiver() as upstream:
        svc = agent(tmp_path, upstream.port, [])
        svc.start()
        try:
            rx = svc.receivers["otlp"]
            http_req = urllib.request.Request(
                f"http://127.0.0.1:{rx.http_port}/v1/traces",
                data=body,
                headers={"Content-Type": "application/x-protobuf"},
                method="POST",
            )
            with urllib.request.urlopen(http_req, timeout=10) as r:
                http_reply = trace_service_pb2.ExportTraceServiceResponse.FromString(r.read())
            with grpc.insecure_channel(f"127.0.0.1:{rx.grpc_port}") as channel:
                export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
                raw = export(body, timeout=10)
            grpc_reply = trace_service_pb2.ExportTraceServiceResponse.FromString(raw)
            for reply in (http_reply, grpc_reply):
                assert reply.partial_success.rejected_spans == 2
                assert "bad_trace_id" in reply.partial_success.error_message
            assert svc.stats.get(RECEIVER_ITEMS_REJECTED, signal="traces", reason="bad_trace_id") == 4
        finally:
            svc.shutdown(timeout_s=20)
    names = [s.name for _, s in upstream.got.spans()]
    assert names == ["good", "good"]


def _post_as(port: int, body: bytes, ctype: str) -> tuple[int, str, bytes]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/traces", data=body, headers={"Content-Type": ctype}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers["Content-Type"], r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers["Content-Type"], e.read()


def test_json_requests_reach_the_upstream_and_the_lake_as_their_protobuf_twins(tmp_path):
    """Each request is sent once as protobuf, once as OTLP/JSON: the upstream gets the same spans, byte for byte."""
    example_json, example = upstream_trace()
    pairs = [  # (protobuf body, JSON body) of the same request
        (rich_request(1).SerializeToString(), to_json(rich_request(1))),
        (rich_request(2).SerializeToString(), to_json(rich_request(2), snake_case=True, int64_numbers=True)),
        (example.SerializeToString(), example_json),
    ]
    with GrpcReceiver() as upstream:
        svc = agent(tmp_path, upstream.port, [])
        svc.start()
        try:
            port = svc.receivers["otlp"].http_port
            for i, (protobuf, json_body) in enumerate(pairs):
                assert _post_as(port, protobuf, "application/x-protobuf")[0] == 200
                ctype = "application/json; charset=utf-8" if i else "application/json"
                assert _post_as(port, json_body, ctype) == (200, "application/json", b"{}")
            bad = [
                b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x"}',  # cut short
                b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "5B8EFFF798038103D269B633813FC6ZZ"}]}]}]}',
                b'{"resourceSpans": ' + b"[" * 1500 + b"]" * 1500 + b"}",  # past the parser's depth limit
            ]
            for body, why in zip(bad, ("not JSON", "traceId: not a hex string", "depth limit"), strict=True):
                status, ctype, answer = _post_as(port, body, "application/json")
                assert (status, ctype) == (400, "application/json")
                assert why in json.loads(answer)["message"]
            assert svc.stats.get(RECEIVER_REQUESTS, protocol="http", signal="traces", outcome="accepted") == 6
            assert svc.stats.get(RECEIVER_REQUESTS, protocol="http", signal="traces", outcome="malformed") == 3
        finally:
            svc.shutdown(timeout_s=20)
    got = Counter((r.SerializeToString(), s.SerializeToString()) for r, s in upstream.got.spans())
    sent = sum(len(ss.spans) for body, _ in pairs for ss in TRACES.FromString(body).resource_spans[0].scope_spans)
    assert len(got) == sent and set(got.values()) == {2}  # every span twice: resource and span serialized alike
    rows = Counter(json.dumps(row, sort_keys=True) for row in read_lake(tmp_path / "lake", "requests").to_pylist())
    assert sorted(rows.values()) == [2, 2]  # the two llm_request spans, each read into the same row twice
