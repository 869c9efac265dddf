"""OTLP metrics (OpenTelemetry SDK) arrive at a real receiver under semantic-convention names."""

from __future__ import annotations

import time

import pytest

from aaco.agent.config import load_config
from aaco.agent.service import AgentService
from aaco.contract.signals import LATENCY_BUCKETS
from tests.support.otlp_receivers import GrpcReceiver, HttpReceiver

pytestmark = pytest.mark.integration


def collect(requests):
    """name -> (unit, [(attributes, point)]) over every request; and the resources seen."""
    metrics, resources = {}, []
    for req in requests:
        for rm in req.resource_metrics:
            resources.append({kv.key: kv.value.string_value for kv in rm.resource.attributes})
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    kind = m.WhichOneof("data")
                    pts = getattr(m, kind).data_points
                    metrics.setdefault(m.name, (m.unit, kind, []))[2].extend(
                        ({kv.key: (kv.value.string_value or kv.value.int_value) for kv in p.attributes}, p) for p in pts
                    )
    return metrics, resources


@pytest.mark.parametrize("receiver", [GrpcReceiver, HttpReceiver])
def test_metrics_over_otlp(tmp_path, resnet50, receiver):
    with receiver() as rx:
        protocol = "grpc" if receiver is GrpcReceiver else "http/protobuf"
        cfg = load_config(
            None,
            {
                "node": "gpu-node-1",
                "sources": [{"type": "ort", "iterations": 4, "warmup": 1, "cycles": 1}],
                "exporters": {
                    "prometheus": {"enabled": False},
                    "lake": {"path": str(tmp_path / "lake")},
                    "otlp": {"endpoint": f"http://127.0.0.1:{rx.port}", "protocol": protocol, "metrics_interval_s": 1},
                },
            },
            env={},
        )
        svc = AgentService(cfg)
        svc.start()
        deadline = time.monotonic() + 120
        while not svc.sources_done() and time.monotonic() < deadline:
            time.sleep(0.05)
        svc.shutdown(timeout_s=20)
        metrics, resources = collect(rx.got.metric_requests)
    assert resources and resources[0]["host.name"] == "gpu-node-1" and resources[0]["service.name"] == "aaco-agent"
    unit, kind, points = metrics["aaco.kar"]
    assert kind == "gauge" and unit == "1"
    assert points[-1][0] == {"aaco.model": "light_resnet50"}
    assert points[-1][1].as_double == pytest.approx(59 / 176)  # 59 kernels over the 176 nodes that run (docs/kar.md)
    unit, kind, points = metrics["aaco.iteration.duration"]
    assert kind == "histogram" and unit == "s"
    assert points[-1][1].count == 4  # cumulative temporality: the last export holds the total
    assert tuple(points[-1][1].explicit_bounds) == LATENCY_BUCKETS
    unit, kind, points = metrics["aaco.agent.events.received"]
    assert kind == "sum" and unit == "{event}"
    assert "aaco.gpu.active_ratio" in metrics
    assert {a.get("hw.id") for a, _ in metrics["aaco.gpu.active_ratio"][2]} == {"cpu"}
