"""OTLP metrics through the OpenTelemetry SDK: every analyzer, telemetry and self metric, OTel-named.

The SDK's MeterProvider is the right tool here (volume is a few hundred series every interval, not
kernels by the million): each registered ``MetricDef`` becomes an observable gauge or counter whose
callback reads the latest analyzer snapshot and self-metrics, under its OpenTelemetry name and
UCUM unit; iteration latency is recorded per iteration into an SDK histogram with AACO's bucket
boundaries. Resource attributes are the agent's (``service.name=aaco-agent``, ``host.name``,
``k8s.*``). Label keys map to attribute names by the semantic conventions where they exist:

``node`` -> (the resource's ``host.name``), ``gpu`` -> ``hw.id``, ``model`` -> ``aaco.model``,
``pod`` / ``namespace`` / ``container`` -> ``k8s.pod.name`` / ``k8s.namespace.name`` /
``k8s.container.name``, ``sensor`` -> ``hw.sensor_location``, ``error_type`` -> ``error.type``;
any other label keeps its name.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

import grpc
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.sdk.resources import Resource

from aaco.agent.pipeline.schemas import EventBatch
from aaco.agent.pipeline.signals import LATENCY_BUCKETS, MetricDef, MetricPoint
from aaco.agent.pipeline.stats import Stats
from aaco.analyzers.base import AnalysisSnapshot

from .base import Exporter, ExportResult
from .otlp_settings import OtlpConfig, OtlpTarget, resolve
from .otlp_traces import resource_attributes

log = logging.getLogger("aaco.exporters.otlp_metrics")

LABELS = {
    "gpu": "hw.id",
    "model": "aaco.model",
    "pod": "k8s.pod.name",
    "namespace": "k8s.namespace.name",
    "container": "k8s.container.name",
    "sensor": "hw.sensor_location",
    "error_type": "error.type",
}
LATENCY_METRIC = "aaco.iteration.duration"


def attributes(labels: Mapping[str, str]) -> dict[str, str]:
    """OTel attributes of a point's labels (``node`` is the resource's host.name, so it is left out)."""
    return {LABELS.get(k, k): v for k, v in labels.items() if k != "node" and v != ""}


def make_exporter(target: OtlpTarget) -> Any:
    """The SDK's OTLP metric exporter for a resolved target."""
    headers = dict(target.headers)
    if target.protocol == "grpc":
        creds = None
        if target.secure:

            def read(p: object) -> bytes | None:
                return open(p, "rb").read() if p else None

            creds = grpc.ssl_channel_credentials(read(target.ca_file), read(target.key_file), read(target.cert_file))
        return GrpcMetricExporter(
            endpoint=target.url,
            insecure=not target.secure,
            credentials=creds,
            headers=headers,
            timeout=target.timeout_s,
            compression=grpc.Compression.Gzip if target.compression == "gzip" else grpc.Compression.NoCompression,
        )
    return HttpMetricExporter(
        endpoint=target.url,
        headers=headers,
        timeout=target.timeout_s,
        certificate_file=str(target.ca_file) if target.ca_file else None,
        client_certificate_file=str(target.cert_file) if target.cert_file else None,
        client_key_file=str(target.key_file) if target.key_file else None,
        compression=HttpCompression.Gzip if target.compression == "gzip" else HttpCompression.NoCompression,
    )


class OtlpMetricsExporter(Exporter):
    """Every metric AACO defines, over OTLP, every ``metrics_interval_s``."""

    name = "otlp_metrics"

    def __init__(
        self,
        config: OtlpConfig,
        stats: Stats,
        node: str,
        env: Mapping[str, str] | None = None,
        interval_s: float = 10.0,
    ) -> None:
        self.stats = stats
        self.target = resolve(config, "metrics", env)
        self._lock = threading.Lock()
        self._points: dict[MetricDef, list[MetricPoint]] = {}
        self._instruments: set[str] = set()
        self._provider: MeterProvider | None = None
        self._interval_s = interval_s
        self._resource = Resource.create(resource_attributes(node, env))
        self._closed = False

    def start(self) -> None:
        """Build the meter provider and its periodic reader."""
        if self.target is None:
            return
        reader = PeriodicExportingMetricReader(
            make_exporter(self.target), export_interval_millis=int(self._interval_s * 1000)
        )
        view = View(instrument_name=LATENCY_METRIC, aggregation=ExplicitBucketHistogramAggregation(LATENCY_BUCKETS))
        self._provider = MeterProvider(resource=self._resource, metric_readers=[reader], views=[view])
        self._meter = self._provider.get_meter("aaco")
        self._latency = self._meter.create_histogram(
            LATENCY_METRIC, unit="s", description="Iteration (inference request, training step) latency."
        )
        log.info("OTLP metrics to %s (%s) every %.0fs", self.target.url, self.target.protocol, self._interval_s)

    def _callback(self, metric: MetricDef):
        def observe(_options: CallbackOptions) -> Iterable[Observation]:
            with self._lock:
                points = list(self._points.get(metric, ()))
            return [Observation(float(p.value), attributes(p.labels)) for p in points]  # type: ignore[arg-type]

        return observe

    def _ensure(self, metric: MetricDef) -> None:
        if metric.otel_name in self._instruments or metric.kind == "histogram":
            return
        self._instruments.add(metric.otel_name)
        make = (
            self._meter.create_observable_counter if metric.kind == "counter" else self._meter.create_observable_gauge
        )
        make(metric.otel_name, callbacks=[self._callback(metric)], unit=metric.unit, description=metric.description)

    def export(self, batch: EventBatch) -> ExportResult:
        """Record the latency of each iteration into the histogram."""
        if self._provider is None or batch.kind != "iterations" or batch.rows == 0:
            return ExportResult.SUCCESS
        cols = batch.batch.select(["start_ns", "end_ns", "model"]).to_pydict()
        for start, end, model in zip(cols["start_ns"], cols["end_ns"], cols["model"], strict=True):
            self._latency.record((end - start) / 1e9, {"aaco.model": model or "unknown"})
        return ExportResult.SUCCESS

    def export_snapshot(self, snapshot: AnalysisSnapshot) -> ExportResult:
        """Make the snapshot's and the agent's own points the values the next collection observes."""
        if self._provider is None:
            return ExportResult.SUCCESS
        grouped: dict[MetricDef, list[MetricPoint]] = defaultdict(list)
        for p in [*snapshot.points(), *self.stats.points()]:
            if p.metric.kind != "histogram":
                grouped[p.metric].append(p)
        with self._lock:
            self._points = dict(grouped)
        for metric in grouped:
            self._ensure(metric)
        return ExportResult.SUCCESS

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Collect and export now."""
        if self._provider is None:
            return True
        return bool(self._provider.force_flush(int(timeout_s * 1000)))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Final export and stop (idempotent, safe before start)."""
        if self._closed or self._provider is None:
            self._closed = True
            return
        self._closed = True
        self._provider.shutdown(timeout_millis=int(timeout_s * 1000))
