"""The Prometheus endpoint: ``/metrics`` (text or OpenMetrics by Accept header), and the routes the agent adds.

A prometheus-client custom collector renders, at scrape time, the latest analyzer snapshot and
the agent's self-metrics, both as ``MetricPoint``s with registered definitions (so names, help
texts and label sets are fixed in code). Each histogram bucket carries its latest observation's
trace ID as an exemplar (shown in OpenMetrics responses), so Grafana can jump to the trace.

The server takes a Prometheus web-config file (``web_config_file``, see ``web_config.py``) for TLS and basic
auth, as node-exporter does. The agent's routes (``routes.py``: ``/healthz``, ``/readyz``, ``/api/v1/capture``) skip
its basic auth: probes cannot carry a secret without putting it in the pod spec, and admin actions have their
own bearer token (both would use the Authorization header).
The port runs on ``contract/http_loop`` (one selector loop, lanes of threads for probes, scrapes, bcrypt
checks and admin actions, connections bounded and the idle oldest evicted): ``metrics_server.py``.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar as PromExemplar
from pydantic import Field, PositiveFloat, PositiveInt, conint

from aaco.contract.errors import AacoError
from aaco.contract.http_app import Limits
from aaco.contract.http_loop import LoopServer
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import HistogramValue, MetricDef, MetricPoint, define
from aaco.contract.snapshot import AnalysisSnapshot
from aaco.contract.stats import Stats
from aaco.contract.version import version
from aaco.exporters.base import Exporter, ExportResult
from aaco.exporters.context import ExporterContext, ExporterSettings
from aaco.exporters.metrics_server import MetricsApp, lanes
from aaco.exporters.routes import Route
from aaco.exporters.web_config import WebConfigWatcher

log = logging.getLogger("aaco.exporters.prometheus")

AGENT_INFO = define(
    "aaco.agent.info",
    "aaco_agent_info",
    "gauge",
    "1",
    "The agent's version and node (value 1).",
    ("version", "node"),
)
AGENT_START = define(
    "aaco.agent.start_time",
    "aaco_agent_start_time_seconds",
    "gauge",
    "s",
    "When the agent started (Unix time).",
)
COLLECT_DURATION = define(
    "aaco.agent.collect.duration",
    "aaco_collect_duration_seconds",
    "gauge",
    "s",
    "Time the previous scrape took to render.",
)
METRICS_SERVER_REFUSED = define(
    "aaco.metrics_server.refused",
    "aaco_metrics_server_refused",
    "counter",
    "{request}",
    "Requests the /metrics server refused, by reason: no_credentials and bad_credentials (401, basic auth), "
    "config_error (500: the web-config file's latest change did not load), timeout (request_timeout_s passed "
    "before the request was whole: 408), busy (its lane's queue full: 503), malformed, headers_too_large, "
    "too_large, client_gone. Connections: aaco_http_connections_total{port=metrics}.",
    ("reason",),
)

Port = conint(ge=0, le=65535)


class PrometheusConfig(ExporterSettings):
    """The Prometheus scrape endpoint."""

    section = "prometheus"
    summary = "Scrape endpoint."

    enabled: bool = Field(True, description="Serve /metrics, /healthz and /readyz.")
    address: str = Field("127.0.0.1", description="Bind address; 0.0.0.0 (or ::) to be scraped from elsewhere.")
    port: Port = Field(9464, description="Port (9464 is OpenTelemetry's Prometheus exporter default; 0 picks one).")
    web_config_file: Path | None = Field(
        None,
        description="A Prometheus web-config file for TLS and basic auth, as node-exporter's --web.config.file "
        "(tls_server_config, basic_auth_users with bcrypt hashes, http_server_config.headers); relative paths in "
        "it are relative to its folder; read again when it or a file it names changes. /healthz and /readyz "
        "stay open (probes carry no secret); /api/v1/capture has its own bearer token. null: plain HTTP, no auth.",
    )
    max_workers: PositiveInt = Field(
        2,
        description="Threads rendering scrapes. Probes (/healthz, /readyz), first checks of a credential's "
        "password (bcrypt) and admin actions have a thread each of their own, so none waits behind the others.",
    )
    max_connections: PositiveInt = Field(
        128,
        description="Open connections at most. At the bound (or max_connections_per_peer), the oldest connection "
        "holding no work (idle, half-sent, handshaking) is closed to make room: a flood of half-open connections "
        "cannot keep a scrape or a probe out (aaco_http_connections_total{port=metrics,outcome=evicted}).",
    )
    max_connections_per_peer: PositiveInt = Field(
        64, description="Open connections from one address at most (then its own oldest idle one is closed)."
    )
    request_timeout_s: PositiveFloat = Field(
        5.0,
        description="Longest a request's line, headers (and body) may take from their first byte, and a TLS "
        "handshake from accept; then the connection is closed and counted (reason=timeout).",
    )
    idle_timeout_s: PositiveFloat = Field(
        60.0, description="How long a kept-alive connection may wait for its next request (scrapers reuse theirs)."
    )


def render(points: Iterable[MetricPoint]) -> Iterator[Metric]:
    """Prometheus metric families from points, grouped by definition."""
    grouped: dict[MetricDef, list[MetricPoint]] = defaultdict(list)
    for p in points:
        grouped[p.metric].append(p)
    for metric, pts in grouped.items():
        labels = list(metric.labels)
        if metric.kind == "counter":
            fam: Metric = CounterMetricFamily(metric.prom_name, metric.description, labels=labels)
            for p in pts:
                fam.add_metric([p.labels[k] for k in labels], float(p.value))  # type: ignore[arg-type]
        elif metric.kind == "histogram":
            fam = HistogramMetricFamily(metric.prom_name, metric.description, labels=labels)
            for p in pts:
                h = p.value
                assert isinstance(h, HistogramValue)
                exemplars = h.exemplars or (None,) * (len(h.bounds) + 1)
                les = [*(_le(b) for b in h.bounds), "+Inf"]
                counts = [*(float(c) for c in h.bucket_counts), float(h.count)]
                buckets: list[Any] = []
                for le, count, ex in zip(les, counts, exemplars, strict=True):
                    bucket: list[Any] = [le, count]
                    if ex is not None:
                        bucket.append(PromExemplar({"trace_id": ex.trace_id}, ex.value, ex.ts_s))
                    buckets.append(bucket)
                fam.add_metric([p.labels[k] for k in labels], buckets, h.total)
        else:
            fam = GaugeMetricFamily(metric.prom_name, metric.description, labels=labels)
            for p in pts:
                fam.add_metric([p.labels[k] for k in labels], float(p.value))  # type: ignore[arg-type]
        yield fam


def _le(bound: float) -> str:
    return repr(float(bound))


class _Collector:
    def __init__(self, exporter: PrometheusExporter) -> None:
        self._exp = exporter

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        snap = self._exp.snapshot
        points: list[MetricPoint] = list(self._exp.stats.points())
        if snap is not None:
            points += list(snap.points())
        points.append(MetricPoint(AGENT_INFO, {"version": version(), "node": self._exp.node}, 1.0))
        points.append(MetricPoint(AGENT_START, {}, self._exp.started_at))
        points.append(MetricPoint(COLLECT_DURATION, {}, self._exp.last_collect_s))
        yield from render(points)
        self._exp.last_collect_s = time.perf_counter() - t0


class PrometheusExporter(Exporter):
    """Serves the latest snapshot and the self-metrics over HTTP."""

    name = "prometheus"

    def __init__(
        self,
        config: PrometheusConfig,
        stats: Stats,
        node: str,
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        self.config = config
        self.routes = dict(routes or {})
        self.stats = stats
        self.node = node
        self.snapshot: AnalysisSnapshot | None = None
        self.started_at = time.time()
        self.last_collect_s = 0.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))  # type: ignore[arg-type]
        self._server: LoopServer | None = None
        self._web: WebConfigWatcher | None = None
        self._closed = False

    @classmethod
    def from_config(cls, config: PrometheusConfig, ctx: ExporterContext) -> PrometheusExporter | None:
        """The endpoint ``config`` describes, serving ``ctx.routes`` beside /metrics; None when disabled."""
        if not config.enabled:
            return None
        return cls(config, ctx.stats, ctx.node, ctx.routes)

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self._server.port if self._server else self.config.port

    def start(self) -> None:
        """Bind and serve (an address in use, a bad web-config file: clear errors)."""
        cfg = self.config
        if cfg.web_config_file is not None:
            self._web = WebConfigWatcher(cfg.web_config_file, self.stats)
        app = MetricsApp(self.registry, self.routes, self._web, self.stats, METRICS_SERVER_REFUSED)
        limits = Limits(cfg.max_connections, cfg.max_connections_per_peer, cfg.request_timeout_s, cfg.idle_timeout_s)
        self._server = LoopServer("metrics", cfg.address, cfg.port, limits, lanes(cfg.max_workers), app, log)
        try:
            self._server.bind()
        except OSError as exc:
            raise AacoError(
                f"cannot serve metrics on {cfg.address}:{cfg.port}: {exc.strerror or exc}",
                subject="exporters.prometheus",
                hint="choose another port with --metrics-port",
            ) from exc
        self._server.start()
        scheme = "https" if self._web is not None and self._web.tls else "http"
        log.info("metrics on %s://%s:%d/metrics", scheme, cfg.address, self.port)
        if self._web is not None and not self._web.tls and self._web.current().users:
            log.warning("%s: basic auth without tls_server_config sends passwords in the clear", cfg.web_config_file)

    def export(self, batch: EventBatch) -> ExportResult:
        """Events are not exposed one by one: their analyzers' snapshots are."""
        return ExportResult.SUCCESS

    def export_snapshot(self, snapshot: AnalysisSnapshot) -> ExportResult:
        """Serve this snapshot from now on."""
        self.snapshot = snapshot
        return ExportResult.SUCCESS

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Nothing is buffered."""
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Stop serving (idempotent, safe before start)."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.stop(timeout_s)
