"""The Prometheus endpoint: ``/metrics`` (text or OpenMetrics by Accept header), and the routes the agent adds.

A prometheus-client custom collector renders, at scrape time, the latest analyzer snapshot and
the agent's self-metrics, both as ``MetricPoint``s with registered definitions (so names, help
texts and label sets are fixed in code). Each histogram bucket carries its latest observation's
trace ID as an exemplar (shown in OpenMetrics responses), so Grafana can jump to the trace.

The server takes a Prometheus web-config file (``web_config_file``, see ``web_config.py``) for TLS and basic
auth, as node-exporter does. The agent's routes (``routes.py``: ``/healthz``, ``/readyz``, ``/api/v1/capture``) skip
its basic auth: probes cannot carry a secret without putting it in the pod spec, and admin actions have their
own bearer token (both would use the Authorization header).
Connections are served by a bounded pool of threads (the TLS handshake in the worker, never in the accept
loop), each cut off ``request_timeout_s`` after it was accepted; every refusal is counted.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from http import HTTPStatus
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar as PromExemplar
from pydantic import Field, PositiveFloat, PositiveInt, conint

from aaco.contract.errors import AacoError
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import HistogramValue, MetricDef, MetricPoint, define
from aaco.contract.snapshot import AnalysisSnapshot
from aaco.contract.stats import Stats
from aaco.contract.version import version
from aaco.exporters.base import Exporter, ExportResult
from aaco.exporters.context import ExporterContext, ExporterSettings
from aaco.exporters.metrics_server import PoolServer, PoolServerV6
from aaco.exporters.routes import HttpRequest, Route
from aaco.exporters.web_config import WebConfigWatcher, WebState

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
    "Connections and requests the /metrics server refused, by reason: no_credentials and bad_credentials (401, "
    "basic auth), config_error (500: the web-config file's latest change did not load), tls_handshake, "
    "client_cert (no or unverified client certificate), client_san (not in client_allowed_sans), plaintext_http "
    "(plain HTTP sent to the TLS port: answered 400 with the https URL), timeout (request_timeout_s passed), busy "
    "(max_workers connections already served).",
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
        8,
        description="Connections served at once, one thread each (TLS handshake included); one more is closed "
        "and counted (aaco_metrics_server_refused_total{reason=busy}).",
    )
    request_timeout_s: PositiveFloat = Field(
        10.0,
        description="Longest a connection may take from accept to the end of its response (TLS handshake "
        "included); then it is cut and counted (reason=timeout).",
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


def _with_headers(start_response: Callable[..., Any], extra: list[tuple[str, str]]) -> Callable[..., Any]:
    """``start_response`` adding the web-config file's ``http_server_config.headers`` to every response."""
    if not extra:
        return start_response

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return start_response(status, headers + extra, exc_info)

    return start


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
        self._server: PoolServer | None = None
        self._web: WebConfigWatcher | None = None
        self._thread: threading.Thread | None = None
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
        return self._server.server_port if self._server else self.config.port

    def _app(self) -> Callable[..., Iterable[bytes]]:
        metrics = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "/")
            if self._web is not None:
                state = self._web.current()
                start_response = _with_headers(start_response, state.headers)
                if path not in self.routes:
                    refusal = self._refusal(state, environ, start_response)
                    if refusal is not None:
                        return refusal
            if path == "/metrics":
                return metrics(environ, start_response)
            if path in self.routes:
                return self._route(self.routes[path], environ, start_response)
            if path == "/":
                start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
                return [("AACO agent: " + " ".join(["/metrics", *self.routes]) + "\n").encode()]
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found; try /metrics\n"]

        return app

    def _refusal(
        self, state: WebState, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> list[bytes] | None:
        """The answer to a request the web-config file does not let through (counted), None when it does."""
        assert self._web is not None
        if state.error is not None:
            self.stats.inc(METRICS_SERVER_REFUSED, reason="config_error")
            start_response("500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"the agent's web-config file did not load; its log says why\n"]
        if not state.users:
            return None
        ok, why = self._web.auth.check(state.users, environ.get("HTTP_AUTHORIZATION"))
        if ok:
            return None
        self.stats.inc(METRICS_SERVER_REFUSED, reason=why)
        start_response(
            "401 Unauthorized",
            [("Content-Type", "text/plain; charset=utf-8"), ("WWW-Authenticate", 'Basic realm="aaco"')],
        )
        return [b"Unauthorized\n"]

    @staticmethod
    def _route(route: Route, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """Hand a request to one of the agent's routes and write its answer."""
        request = HttpRequest(
            method=environ.get("REQUEST_METHOD", "GET"),
            path=environ.get("PATH_INFO", "/"),
            query={k: v[-1] for k, v in urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).items()},
            authorization=environ.get("HTTP_AUTHORIZATION"),
            peer=f"{environ.get('REMOTE_ADDR', '?')}:{environ.get('REMOTE_PORT', '?')}",
        )
        answer = route(request)
        try:
            phrase = HTTPStatus(answer.status).phrase
        except ValueError:
            phrase = "Error"
        start_response(f"{answer.status} {phrase}", [("Content-Type", answer.content_type), *answer.headers])
        return [answer.body]

    def start(self) -> None:
        """Bind and serve in a background thread (an address in use, a bad web-config file: clear errors)."""
        if self.config.web_config_file is not None:
            self._web = WebConfigWatcher(self.config.web_config_file, self.stats)
        server_class = PoolServerV6 if ":" in self.config.address else PoolServer
        try:
            self._server = server_class(
                (self.config.address, self.config.port),
                workers=self.config.max_workers,
                timeout_s=self.config.request_timeout_s,
                web=self._web,
                refused=lambda reason: self.stats.inc(METRICS_SERVER_REFUSED, reason=reason),
            )
        except OSError as exc:
            raise AacoError(
                f"cannot serve metrics on {self.config.address}:{self.config.port}: {exc.strerror or exc}",
                subject="exporters.prometheus",
                hint="choose another port with --metrics-port",
            ) from exc
        self._server.set_app(self._app())
        self._thread = threading.Thread(target=self._server.serve_forever, name="aaco-prometheus", daemon=True)
        self._thread.start()
        scheme = "https" if self._web is not None and self._web.tls else "http"
        log.info("metrics on %s://%s:%d/metrics", scheme, self.config.address, self.port)
        if self._web is not None and not self._web.tls and self._web.current().users:
            log.warning(
                "%s: basic auth without tls_server_config sends passwords in the clear", self.config.web_config_file
            )

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
            self._server.shutdown()
            self._server.server_close()
            self._server.close_all()
        if self._thread is not None:
            self._thread.join(timeout_s)
