"""OTLP metrics through the OpenTelemetry SDK: every analyzer, telemetry and self metric, OTel-named.

The SDK's MeterProvider is the right tool here (volume is a few hundred series every interval, not
kernels by the million): each registered ``MetricDef`` becomes an observable gauge or counter whose
callback reads the latest analyzer snapshot and self-metrics, under its OpenTelemetry name and
UCUM unit; iteration latency and the LLM serving histograms (GenAI names) are recorded per event
into SDK histograms, with the trace of each as exemplar (``otlp_histograms.py``). Resource attributes
are the agent's (``service.name=aaco-agent``, ``host.name``, ``k8s.*``). Label keys map to attribute
names by the semantic conventions where they exist:

``node`` -> (the resource's ``host.name``), ``gpu`` -> ``hw.id``, ``model`` -> ``aaco.model``,
``pod`` / ``namespace`` / ``container`` -> ``k8s.pod.name`` / ``k8s.namespace.name`` /
``k8s.container.name``, ``sensor`` -> ``hw.sensor_location``, ``error_type`` -> ``error.type``;
any other label keeps its name.

Every export's outcome is counted (``CountedExporter``): the SDK's reader keeps only a log line of a
failure, so a failed export moves ``aaco_export_errors_total{exporter="otlp_metrics"}`` and its data
points ``aaco_events_dropped_total{component="exporter:otlp_metrics", reason="export_failed"}``
(``shutdown`` for the last one), and delivered points ``aaco_events_emitted_total``. ``force_flush``
and ``shutdown`` keep their timeout although the SDK's OTLP exporters do not (they retry for their
own ``timeout_s``): an export still running at the deadline is given up, its points counted dropped.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import grpc
from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter
from opentelemetry.exporter.otlp.proto.http import Compression as HttpCompression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource

from aaco.contract.schemas import EventBatch
from aaco.contract.serving import request_series
from aaco.contract.signals import MetricDef, MetricPoint
from aaco.contract.snapshot import AnalysisSnapshot
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, EXPORT_ERRORS, Stats
from aaco.exporters.base import Exporter, ExportResult
from aaco.exporters.context import ExporterContext
from aaco.exporters.otlp_histograms import EventHistograms, views
from aaco.exporters.otlp_settings import OtlpConfig, OtlpTarget, resolve, resource_attributes

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
COMPONENT = "exporter:otlp_metrics"


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


def data_points(data: MetricsData) -> int:
    """The data points of one export."""
    return sum(len(m.data.data_points) for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics)


class CountedExporter(MetricExporter):
    """An SDK metric exporter whose outcomes are counted (see the module docstring)."""

    def __init__(self, inner: MetricExporter, stats: Stats) -> None:
        # The reader takes its temporality and aggregation from these two (the SDK's exporter contract).
        super().__init__(inner._preferred_temporality, inner._preferred_aggregation)
        self.inner = inner
        self.stats = stats
        self.closing = False
        self._shut = False
        self._lock = threading.Lock()
        self._pending: int | None = None  # data points of the export running now

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        """Export through the SDK's exporter, counting what it delivered or lost."""
        n = data_points(metrics_data)
        with self._lock:
            self._pending = n
        result = MetricExportResult.FAILURE
        try:
            result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
        finally:
            with self._lock:
                given_up, self._pending = self._pending is None, None  # given up: counted by abandon()
            if not given_up:
                self._count(n, result is MetricExportResult.SUCCESS)
        return result

    def _count(self, n: int, ok: bool) -> None:
        if ok:
            self.stats.inc(EVENTS_EMITTED, n, component=COMPONENT)
            return
        self.stats.inc(EXPORT_ERRORS, 1, exporter="otlp_metrics")
        self.stats.inc(EVENTS_DROPPED, n, component=COMPONENT, reason="shutdown" if self.closing else "export_failed")

    def abandon(self) -> None:
        """Give up the export running now (shutdown's deadline): its points are counted dropped."""
        with self._lock:
            n, self._pending = self._pending, None
        if n is not None:
            self._count(n, False)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """The SDK's exporter buffers nothing."""
        return self.inner.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Stop: retries end and a gRPC call in flight is cancelled (the SDK's exporter closes its channel)."""
        with self._lock:
            if self._shut:
                return
            self._shut = self.closing = True
        self.inner.shutdown(timeout_millis=timeout_millis)


def within(call: Callable[[], object], timeout_s: float, name: str) -> bool:
    """Run ``call`` on a daemon thread and wait for it at most ``timeout_s``; True if it ended.

    Hand-written because the SDK's OTLP exporters ignore the timeout they are given (their TODO #2663);
    a call still running at the deadline is left to end on its own (its thread keeps no one waiting).
    """
    thread = threading.Thread(target=call, name=name, daemon=True)
    thread.start()
    thread.join(max(0.0, timeout_s))
    return not thread.is_alive()


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
        exporter: MetricExporter | None = None,
    ) -> None:
        self.stats = stats
        self._sdk_exporter = exporter  # the SDK's OTLP exporter for the target unless given (tests)
        self.target = resolve(config, "metrics", env)
        self._lock = threading.Lock()
        self._points: dict[MetricDef, list[MetricPoint]] = {}
        self._instruments: set[str] = set()
        self._provider: MeterProvider | None = None
        self._interval_s = interval_s
        self._resource = Resource.create(resource_attributes(node, env))
        self._closed = False
        self._exporter: CountedExporter | None = None

    @classmethod
    def from_config(cls, config: OtlpConfig, ctx: ExporterContext) -> OtlpMetricsExporter | None:
        """The metrics exporter, when ``config`` (or the environment) names a metrics endpoint; None otherwise."""
        if resolve(config, "metrics", ctx.env) is None:
            return None
        return cls(config, ctx.stats, ctx.node, env=ctx.env, interval_s=config.metrics_interval_s)

    def start(self) -> None:
        """Build the meter provider and its periodic reader."""
        if self.target is None:
            return
        self._exporter = CountedExporter(self._sdk_exporter or make_exporter(self.target), self.stats)
        reader = PeriodicExportingMetricReader(self._exporter, export_interval_millis=int(self._interval_s * 1000))
        self._provider = MeterProvider(  # shut down by the agent within its deadline, not again at exit
            resource=self._resource, metric_readers=[reader], views=views(), shutdown_on_exit=False
        )
        self._meter = self._provider.get_meter("aaco")
        self._histograms = EventHistograms(self._meter)
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
        """Record each iteration's latency, or each request's serving values and tokens, into the histograms."""
        if self._provider is None or batch.rows == 0:
            return ExportResult.SUCCESS
        if batch.kind == "iterations":
            self._histograms.iterations(batch.batch)
        elif batch.kind == "requests":
            self._histograms.requests(batch.batch, request_series(batch.batch).values)
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
        """Collect and export now, within ``timeout_s`` (False if the export did not end in time)."""
        provider = self._provider
        if provider is None:
            return True
        done: list[bool] = []

        def flush() -> None:
            try:
                done.append(provider.force_flush(timeout_s * 1000))
            except Exception as exc:  # the SDK raises when its reader had no time left
                log.debug("OTLP metrics: %s", exc)
                done.append(False)

        return within(flush, timeout_s, "aaco-otlp-flush") and all(done)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Final export and stop within ``timeout_s``, what is not sent counted (idempotent, safe before start)."""
        provider, exporter = self._provider, self._exporter
        if self._closed or provider is None or exporter is None:
            self._closed = True
            return
        self._closed = True
        exporter.closing = True

        def stop() -> None:
            try:
                provider.shutdown(timeout_millis=timeout_s * 1000)
            except Exception as exc:  # the SDK raises when its reader had no time left
                log.debug("OTLP metrics: %s", exc)

        within(stop, timeout_s, "aaco-otlp-shutdown")
        exporter.shutdown()  # if the provider did not get that far: end retries, cancel the call (else a no-op)
        exporter.abandon()
