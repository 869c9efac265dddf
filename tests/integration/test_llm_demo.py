"""The demo's LLM requests: vLLM-shaped spans from the ``llm_requests`` source reach a real upstream through the
agent's own receiver, each is linked both ways to the ONNX Runtime iterations that ran while it was in flight, and
the serving_phases analyzer's prefill and decode time per model equals the kernels in the requests' windows,
computed here from the lake's rows."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict

import pytest

from aaco.agent.config import load_config
from aaco.agent.service import AgentService
from aaco.agent.sources.ort.llm_requests import plan_requests
from tests.conftest import get_free_port
from tests.integration.helpers import read_lake
from tests.support.otlp_receivers import GrpcReceiver

pytestmark = pytest.mark.integration

SOURCE = {
    "type": "llm_requests",
    "cycles": 2,
    "requests_per_cycle": 5,
    "max_tokens": 4,
    "input_tokens_min": 8,
    "input_tokens_max": 64,
    "mean_interarrival_s": 0.01,
    "warmup": 1,
    "interval_s": 0,
    "seed": 7,
}


def attrs(span) -> dict:
    out = {}
    for kv in span.attributes:
        kind = kv.value.WhichOneof("value")
        value = getattr(kv.value, kind)
        out[kv.key] = [v.string_value for v in value.values] if kind == "array_value" else value
    return out


def run_demo(tmp_path, protocol: str):
    grpc_port, http_port = get_free_port(), get_free_port()
    endpoint = f"http://127.0.0.1:{http_port if protocol == 'http' else grpc_port}"
    with GrpcReceiver() as upstream:
        cfg = load_config(
            None,
            {
                "node": "llm-node",
                "sources": [{**SOURCE, "endpoint": endpoint, "protocol": protocol}],
                "exporters": {
                    "prometheus": {"enabled": False},
                    "lake": {"path": str(tmp_path / "lake")},
                    "otlp": {"endpoint": f"http://127.0.0.1:{upstream.port}", "trace_window_s": 0.5},
                },
                "receivers": {
                    "otlp": {"enabled": True, "grpc_port": grpc_port, "http_port": http_port, "link_window_s": 5.0}
                },
            },
            env={},
        )
        svc = AgentService(cfg)
        svc.start()
        deadline = time.monotonic() + 120
        while not svc.sources_done() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.sources_done(), "the llm_requests source did not finish its two cycles"
        svc.shutdown(timeout_s=20)
        return upstream.got.spans(), tmp_path / "lake"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_request_spans_reach_upstream_shaped_as_vllm_and_linked_both_ways(tmp_path, protocol):
    spans, lake = run_demo(tmp_path, protocol)
    requests = [(r, s) for r, s in spans if s.name == "llm_request"]
    iterations = [s for _r, s in spans if s.name == "model_run"]
    assert len(requests) == 10  # 2 cycles x 5, every one finished and forwarded

    expected = {}
    for cycle, model in enumerate(["demo-llm-a", "demo-llm-b"]):
        for plan in plan_requests(7, cycle, 5, input_tokens=(8, 64), max_tokens=4, mean_interarrival_s=0.01):
            expected[plan.request_id] = (model, plan)
    assert {attrs(s)["gen_ai.request.id"] for _r, s in requests} == set(expected)

    for res, span in requests:
        a = attrs(span)
        model, plan = expected[a["gen_ai.request.id"]]
        resource = attrs(res)
        assert resource["service.name"] == "demo-llm-server" and resource["process.pid"] == os.getpid()
        assert span.kind == span.SPAN_KIND_SERVER
        assert a["gen_ai.response.model"] == a["gen_ai.request.model"] == model
        assert a["gen_ai.usage.prompt_tokens"] == a["gen_ai.usage.input_tokens"] == plan.input_tokens
        assert a["gen_ai.usage.completion_tokens"] == a["gen_ai.usage.output_tokens"] == plan.output_tokens
        assert a["gen_ai.response.finish_reasons"] == [plan.finish_reason]
        e2e = (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9
        assert a["gen_ai.latency.e2e"] == pytest.approx(e2e, abs=1e-6)
        assert a["gen_ai.latency.time_to_first_token"] == pytest.approx(
            a["gen_ai.latency.time_in_queue"] + a["gen_ai.latency.time_in_model_prefill"], abs=1e-6
        )
        assert a["gen_ai.latency.e2e"] == pytest.approx(
            a["gen_ai.latency.time_to_first_token"] + a["gen_ai.latency.time_in_model_decode"], abs=1e-6
        )

        # Request -> iteration: exactly the iterations of this process that started while it was in flight,
        # at least its own prefill and decode runs; and each of those links back.
        inside = {
            (it.trace_id, it.span_id)
            for it in iterations
            if span.start_time_unix_nano <= it.start_time_unix_nano <= span.end_time_unix_nano
        }
        linked = {(lk.trace_id, lk.span_id) for lk in span.links}
        assert linked == inside
        assert len(inside) >= plan.output_tokens
        for it in iterations:
            if (it.trace_id, it.span_id) in inside:
                assert (span.trace_id, span.span_id) in {(lk.trace_id, lk.span_id) for lk in it.links}

    models = {attrs(it).get("aaco.model") for it in iterations}
    assert {"demo-llm-a", "demo-llm-b"} <= models

    check_phases(lake)


def phase_times(kernels: list[dict], requests: list[dict]) -> dict[str, list[int]]:
    """GPU ns in [prefill, decode] per model, kernel by kernel: placed by launch (else start) time in the windows
    of the requests of its (node, pid); prefill [start + queue, + prefill], decode from there [, + decode]."""
    windows = defaultdict(list)
    for r in requests:
        lo = r["start_ns"] + round(r["queue_s"] * 1e9)
        hi = lo + round(r["prefill_s"] * 1e9)
        windows[(r["node"], r["pid"])].append((r["model"], (lo, hi), (hi, hi + round(r["decode_s"] * 1e9))))
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for k in kernels:
        t = k["start_ns"] if k["launch_start_ns"] is None else k["launch_start_ns"]
        for phase in (0, 1):
            model = next(
                (w[0] for w in windows[(k["node"], k["pid"])] if w[1 + phase][0] <= t <= w[1 + phase][1]), None
            )
            if model is not None:
                out[model][phase] += k["end_ns"] - k["start_ns"]
                break
    return dict(out)


def check_phases(lake) -> None:
    cols = ["node", "pid", "start_ns", "end_ns", "launch_start_ns"]
    kernels = read_lake(lake, "kernels").select(cols).to_pylist()
    requests = (
        read_lake(lake, "requests")
        .select(["node", "pid", "model", "start_ns", "queue_s", "prefill_s", "decode_s"])
        .to_pylist()
    )
    assert len(requests) == 10 and {r["pid"] for r in requests} == {os.getpid()}
    expected = phase_times(kernels, requests)
    groups = json.loads((lake / "analysis.json").read_text())["serving_phases"]["groups"]
    got = {g["model"]: [round(g["prefill_s"] * 1e9), round(g["decode_s"] * 1e9)] for g in groups}
    assert got == expected
    assert set(got) == {"demo-llm-a", "demo-llm-b"} and all(p > 0 and d > 0 for p, d in got.values())
    assert {g["model"]: g["requests"] for g in groups} == {"demo-llm-a": 5, "demo-llm-b": 5}
