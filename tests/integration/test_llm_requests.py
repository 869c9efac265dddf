"""`aaco agent` receiving 120 LLM request spans shaped as vLLM's from the OpenTelemetry SDK (issue 17).

Two servers (one model each, in their own pod) send 60 ``llm_request`` SERVER spans apiece with
known latencies and token counts. On ``/metrics`` every serving histogram's count and sum, the
token counters, the finish-reason and skip counters equal what was sent (time per output token as
``(e2e - ttft) / (output tokens - 1)``, one-token requests left out and counted); every span reaches
the upstream OTLP receiver as sent, and so do the OTLP metrics: per model, the count and sum of
``gen_ai.server.time_to_first_token`` and exemplars carrying sent trace ids. The lake holds one
``requests`` row per span.
"""

from __future__ import annotations

import signal

import pytest
import yaml
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind

from tests.conftest import get_free_port
from tests.support.otlp_receivers import GrpcReceiver

from .helpers import http_get, metric_value, read_lake, start_aaco, wait_for

pytestmark = pytest.mark.integration

PER_MODEL = 60
MODELS = {"meta-llama/Llama-3.1-8B-Instruct": "vllm-llama-0", "Qwen/Qwen2.5-0.5B": "vllm-qwen-0"}
T0 = 1_790_000_000_000_000_000


def vllm_request(model_index: int, i: int) -> dict[str, float | int]:
    """The known values of request ``i`` of a model: every 10th has a single output token."""
    ttft = 0.02 + 0.011 * i + 0.3 * model_index
    out = 1 if i % 10 == 0 else 4 + 3 * i
    tpot = 0.004 + 0.0005 * i + 0.01 * model_index
    e2e = ttft + (out - 1) * tpot
    return {
        "queue": 0.001 * (i % 7) + 0.05 * model_index,
        "ttft": ttft,
        "e2e": e2e,
        "prompt": 100 + 17 * i,
        "completion": out,
        "prefill": 0.8 * ttft,
        "decode": e2e - ttft,
        "inference": 0.8 * ttft + e2e - ttft,
    }


def send(model: str, pod: str, model_index: int, grpc_port: int) -> None:
    """One vLLM server's spans, as vLLM's tracing sets them (span name, kind, start at arrival, attributes)."""
    resource = Resource.create(
        {
            "service.name": "vllm",
            "k8s.namespace.name": "serving",
            "k8s.pod.name": pod,
            "process.pid": 1000 + model_index,
        }
    )
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"127.0.0.1:{grpc_port}", insecure=True)))
    tracer = provider.get_tracer("vllm.entrypoints.openai.api_server")
    for i in range(PER_MODEL):
        r = vllm_request(model_index, i)
        arrival = T0 + i * 1_000_000_000
        span = tracer.start_span("llm_request", kind=SpanKind.SERVER, start_time=arrival)
        span.set_attribute("gen_ai.response.model", model)
        span.set_attribute("gen_ai.request.id", f"cmpl-{model_index}-{i}")
        span.set_attribute("gen_ai.request.temperature", 0.7)
        span.set_attribute("gen_ai.request.top_p", 0.95)
        span.set_attribute("gen_ai.request.max_tokens", 512)
        span.set_attribute("gen_ai.request.n", 1)
        span.set_attribute("gen_ai.usage.prompt_tokens", r["prompt"])
        span.set_attribute("gen_ai.usage.completion_tokens", r["completion"])
        span.set_attribute("gen_ai.latency.time_in_queue", r["queue"])
        span.set_attribute("gen_ai.latency.time_to_first_token", r["ttft"])
        span.set_attribute("gen_ai.latency.e2e", r["e2e"])
        span.set_attribute("gen_ai.latency.time_in_model_prefill", r["prefill"])
        span.set_attribute("gen_ai.latency.time_in_model_decode", r["decode"])
        span.set_attribute("gen_ai.latency.time_in_model_inference", r["inference"])
        span.end(end_time=arrival + int(r["e2e"] * 1e9))
    assert provider.force_flush(30_000)
    provider.shutdown()


def expected(model_index: int) -> dict[str, tuple[int, float]]:
    """(count, sum) per histogram, computed from the values sent."""
    reqs = [vllm_request(model_index, i) for i in range(PER_MODEL)]
    tpot = [(r["e2e"] - r["ttft"]) / (r["completion"] - 1) for r in reqs if r["completion"] > 1]
    series = {
        "aaco_llm_time_to_first_token_seconds": [r["ttft"] for r in reqs],
        "aaco_llm_time_per_output_token_seconds": tpot,
        "aaco_llm_request_duration_seconds": [r["e2e"] for r in reqs],
        "aaco_llm_queue_time_seconds": [r["queue"] for r in reqs],
        "aaco_llm_prefill_seconds": [r["prefill"] for r in reqs],
        "aaco_llm_decode_seconds": [r["decode"] for r in reqs],
        "aaco_llm_tokens_total:input": [r["prompt"] for r in reqs],
        "aaco_llm_tokens_total:output": [r["completion"] for r in reqs],
    }
    return {name: (len(v), float(sum(v))) for name, v in series.items()}


def otlp_points(requests, name: str) -> list:
    """The data points of metric ``name`` over every OTLP export request, in order."""
    return [
        p
        for req in requests
        for rm in req.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
        for p in m.histogram.data_points
    ]


def attrs(point) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}


def test_vllm_request_spans_become_serving_metrics_and_reach_upstream(tmp_path, aaco_bin):
    prom, grpc_port, http_port = get_free_port(), get_free_port(), get_free_port()
    lake = tmp_path / "lake"
    cfg = tmp_path / "agent.yaml"
    with GrpcReceiver() as upstream:
        cfg.write_text(
            yaml.safe_dump(
                {
                    "node": "gpu-node-1",
                    "sources": [],
                    "exporters": {
                        "prometheus": {"port": prom},
                        "lake": {"path": str(lake), "flush_interval_s": 1},
                        "otlp": {
                            "endpoint": f"http://127.0.0.1:{upstream.port}",
                            "trace_window_s": 0.5,
                            "metrics_interval_s": 1,
                        },
                    },
                    # no iterations to link here: the spans wait 0.5 s for links rather than the default 5 s
                    "receivers": {
                        "otlp": {"enabled": True, "grpc_port": grpc_port, "http_port": http_port, "link_window_s": 0.5}
                    },
                    "pipeline": {"snapshot_interval_s": 1},
                }
            )
        )
        log = tmp_path / "agent.log"
        proc = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=log)
        base = f"http://127.0.0.1:{prom}"
        try:
            wait_for(lambda: http_get(base + "/readyz")[0] == 200, 60, what="/readyz")
            for k, (model, pod) in enumerate(MODELS.items()):
                send(model, pod, k, grpc_port)

            def scraped() -> str | None:
                body = http_get(base + "/metrics")[1]
                done = all(
                    metric_value(body, "aaco_llm_time_to_first_token_seconds_count", model=m) == PER_MODEL
                    for m in MODELS
                )
                return body if done else None

            body = wait_for(scraped, 60, what="every request on /metrics")
            for k, (model, pod) in enumerate(MODELS.items()):
                labels = {"model": model, "namespace": "serving", "pod": pod}
                for name, (count, total) in expected(k).items():
                    if name.startswith("aaco_llm_tokens_total"):
                        kind = name.split(":")[1]
                        assert metric_value(body, "aaco_llm_tokens_total", type=kind, **labels) == total, name
                        continue
                    assert metric_value(body, f"{name}_count", **labels) == count, (model, name)
                    assert metric_value(body, f"{name}_sum", **labels) == pytest.approx(total, rel=1e-9), (model, name)
                assert metric_value(body, "aaco_llm_requests_total", finish_reason="unknown", **labels) == PER_MODEL
                skipped = metric_value(body, "aaco_llm_requests_skipped_total", reason="tpot_one_token", **labels)
                assert skipped == PER_MODEL // 10
            wait_for(lambda: len(upstream.got.spans()) >= 2 * PER_MODEL, 30, what="spans upstream")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
        forwarded = [s for _, s in upstream.got.spans() if s.name == "llm_request"]
        ttft_points = otlp_points(upstream.got.metric_requests, "gen_ai.server.time_to_first_token")
    assert len(forwarded) == 2 * PER_MODEL
    keys = {kv.key for kv in forwarded[0].attributes}
    assert {"gen_ai.response.model", "gen_ai.latency.e2e", "gen_ai.usage.completion_tokens"} <= keys
    sent_traces = {s.trace_id for s in forwarded}
    for k, (model, pod) in enumerate(MODELS.items()):
        want = {"gen_ai.response.model": model, "k8s.namespace.name": "serving", "k8s.pod.name": pod}
        mine = [p for p in ttft_points if attrs(p) == want]
        count, total = expected(k)["aaco_llm_time_to_first_token_seconds"]
        assert mine[-1].count == count and mine[-1].sum == pytest.approx(total, rel=1e-9), model  # cumulative
        assert {e.trace_id for p in mine for e in p.exemplars} & sent_traces, model
    rows = read_lake(lake, "requests")
    assert rows.num_rows == 2 * PER_MODEL
    assert sorted(set(rows.column("pod").to_pylist())) == sorted(MODELS.values())
    assert "Traceback" not in log.read_text()
