"""Every exporter, by name: its settings model (one key of ``exporters:``) and its factory.

A factory takes the exporter's settings and the agent's ``ExporterContext`` and returns the exporter,
or None when the settings leave it off. The OTLP exporters share the ``otlp`` settings; their modules
(gRPC, protobuf, the OpenTelemetry SDK) are imported only when the settings (or the environment)
name an endpoint for its signal: an agent without OTLP never loads them (~14 MiB of RSS). Adding an exporter is
one module and one ``register`` line here.
"""

from __future__ import annotations

from aaco.contract.component import Registry
from aaco.exporters.base import Exporter
from aaco.exporters.context import ExporterContext
from aaco.exporters.lake import LakeConfig, LakeExporter
from aaco.exporters.otlp_settings import OtlpConfig, resolve
from aaco.exporters.prometheus import PrometheusConfig, PrometheusExporter

EXPORTERS = Registry[Exporter | None]("exporter")


def _otlp_traces(config: OtlpConfig, ctx: ExporterContext) -> Exporter | None:
    if resolve(config, "traces", ctx.env) is None:  # off: the OTLP stack is not imported
        return None
    from aaco.exporters.otlp_traces import OtlpTraceExporter

    return OtlpTraceExporter.from_config(config, ctx)


def _otlp_metrics(config: OtlpConfig, ctx: ExporterContext) -> Exporter | None:
    if resolve(config, "metrics", ctx.env) is None:  # off: the OTLP stack is not imported
        return None
    from aaco.exporters.otlp_metrics import OtlpMetricsExporter

    return OtlpMetricsExporter.from_config(config, ctx)


EXPORTERS.register("prometheus", PrometheusConfig, PrometheusExporter.from_config)
EXPORTERS.register("otlp_traces", OtlpConfig, _otlp_traces)
EXPORTERS.register("otlp_metrics", OtlpConfig, _otlp_metrics)
EXPORTERS.register("lake", LakeConfig, LakeExporter.from_config)
