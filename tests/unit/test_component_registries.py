"""Exporters and receivers are built from their registries; the config sections come from the same registrations."""

from __future__ import annotations

from pathlib import Path

from aaco.agent.config import AgentConfig, ExportersConfig, ReceiversConfig
from aaco.agent.receivers.base import ReceiverContext
from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.agent.receivers.otlp import OtlpReceiver
from aaco.agent.receivers.registry import RECEIVERS
from aaco.contract.stats import Stats
from aaco.exporters.context import ExporterContext
from aaco.exporters.lake import LakeConfig
from aaco.exporters.otlp_settings import OtlpConfig
from aaco.exporters.prometheus import PrometheusConfig
from aaco.exporters.registry import EXPORTERS
from aaco.exporters.routes import HttpRequest, HttpResponse

from .builders import NODE


def test_the_sections_have_one_key_per_settings_model_in_registration_order():
    assert list(ExportersConfig.model_fields) == ["prometheus", "otlp", "lake"]
    assert list(ReceiversConfig.model_fields) == ["otlp"]
    assert EXPORTERS.kinds() == ["prometheus", "otlp_traces", "otlp_metrics", "lake"]
    doc = AgentConfig.model_validate({"exporters": {"otlp": {"endpoint": "http://c:4317"}, "lake": {"enabled": False}}})
    assert isinstance(doc.exporters.otlp, OtlpConfig) and doc.exporters.otlp.endpoint == "http://c:4317"
    assert isinstance(doc.exporters.prometheus, PrometheusConfig) and not doc.exporters.lake.enabled


def build(section: str, settings: object) -> list[str]:
    ctx = ExporterContext(NODE, Stats(), env={})
    return [
        e.name for reg in EXPORTERS if reg.config.section == section and (e := reg.factory(settings, ctx)) is not None
    ]


def test_each_exporter_is_built_from_its_settings_or_left_off(tmp_path: Path):
    assert build("prometheus", PrometheusConfig(port=0)) == ["prometheus"]
    assert build("prometheus", PrometheusConfig(enabled=False)) == []
    assert build("lake", LakeConfig(path=tmp_path / "lake")) == ["lake"]
    assert build("lake", LakeConfig(enabled=False)) == []
    assert build("otlp", OtlpConfig()) == []  # no endpoint, none in the (empty) environment
    assert build("otlp", OtlpConfig(endpoint="http://127.0.0.1:1")) == ["otlp", "otlp_metrics"]


def test_the_prometheus_exporter_serves_the_routes_it_is_given():
    def route(request: HttpRequest) -> HttpResponse:
        return HttpResponse(200, b"hi")

    ctx = ExporterContext(NODE, Stats(), routes={"/hello": route})
    exp = EXPORTERS["prometheus"].factory(PrometheusConfig(port=0), ctx)
    assert exp is not None and exp.routes == {"/hello": route}


def test_the_receiver_is_built_when_enabled_with_the_sinks_it_is_given():
    asked: list[str] = []

    def forward(signal: str) -> None:
        asked.append(signal)

    ctx = ReceiverContext(Stats(), forward=forward)
    reg = RECEIVERS["otlp"]
    assert reg.factory(OtlpReceiverConfig(), ctx) is None
    assert asked == []
    rx = reg.factory(OtlpReceiverConfig(enabled=True, grpc_port=0, http_port=0), ctx)
    assert isinstance(rx, OtlpReceiver) and asked == ["metrics", "logs"]
    rx.shutdown(1.0)  # safe before start
