"""The Prometheus endpoint: ``/metrics`` (text or OpenMetrics by Accept header), ``/healthz``, ``/readyz``.

A prometheus-client custom collector renders, at scrape time, the latest analyzer snapshot and
the agent's self-metrics, both as ``MetricPoint``s with registered definitions (so names, help
texts and label sets are fixed in code). The iteration latency histogram carries its latest
trace ID as an exemplar (shown in OpenMetrics responses), so Grafana can jump to the trace.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import urllib.parse
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar
from pydantic import Field, conint

from aaco.agent import __version__
from aaco.agent.config_base import StrictModel
from aaco.agent.errors import AacoError
from aaco.agent.pipeline.schemas import EventBatch
from aaco.agent.pipeline.signals import HistogramValue, MetricDef, MetricPoint, define
from aaco.agent.pipeline.stats import Stats
from aaco.analyzers.base import AnalysisSnapshot

from .base import Exporter, ExportResult

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

Port = conint(ge=0, le=65535)
Action = Callable[[dict[str, str], str], tuple[int, dict[str, Any]]]  # (query, who asked) -> (status, body)


class PrometheusConfig(StrictModel):
    """The Prometheus scrape endpoint."""

    enabled: bool = Field(True, description="Serve /metrics, /healthz and /readyz.")
    address: str = Field("127.0.0.1", description="Bind address; 0.0.0.0 (or ::) to be scraped from elsewhere.")
    port: Port = Field(9464, description="Port (9464 is OpenTelemetry's Prometheus exporter default; 0 picks one).")


class AdminAuth(Protocol):
    """Who may run admin actions (``agent/admin.py``)."""

    def authorize(self, authorization: str | None, peer: str) -> tuple[bool, str]:
        """(True, who asked) when the ``Authorization`` header allows admin actions, else (False, why not)."""


class Health(Protocol):
    """Liveness and readiness as the service sees them."""

    def live(self) -> tuple[bool, str]:
        """True while the pipeline makes progress."""

    def ready(self) -> tuple[bool, str]:
        """True once sources and exporters have started."""


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
                buckets: list[Any] = []
                placed = False
                for bound, count in zip(h.bounds, h.bucket_counts, strict=True):
                    bucket: list[Any] = [_le(bound), float(count)]
                    if (
                        h.exemplar_trace_id
                        and not placed
                        and h.exemplar_value is not None
                        and h.exemplar_value <= bound
                    ):
                        bucket.append(Exemplar({"trace_id": h.exemplar_trace_id}, h.exemplar_value))
                        placed = True
                    buckets.append(bucket)
                inf: list[Any] = ["+Inf", float(h.count)]
                if h.exemplar_trace_id and not placed and h.exemplar_value is not None:
                    inf.append(Exemplar({"trace_id": h.exemplar_trace_id}, h.exemplar_value))
                buckets.append(inf)
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
        points.append(MetricPoint(AGENT_INFO, {"version": __version__, "node": self._exp.node}, 1.0))
        points.append(MetricPoint(AGENT_START, {}, self._exp.started_at))
        points.append(MetricPoint(COLLECT_DURATION, {}, self._exp.last_collect_s))
        yield from render(points)
        self._exp.last_collect_s = time.perf_counter() - t0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _V6Server(_Server):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged (scrapes every few seconds would flood the log)."""


class PrometheusExporter(Exporter):
    """Serves the latest snapshot and the self-metrics over HTTP."""

    name = "prometheus"

    def __init__(
        self,
        config: PrometheusConfig,
        stats: Stats,
        health: Health,
        node: str,
        actions: dict[str, Action] | None = None,
        admin: AdminAuth | None = None,
    ) -> None:
        self.config = config
        self.actions = dict(actions or {})
        self.admin = admin
        self.stats = stats
        self.health = health
        self.node = node
        self.snapshot: AnalysisSnapshot | None = None
        self.started_at = time.time()
        self.last_collect_s = 0.0
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))  # type: ignore[arg-type]
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def port(self) -> int:
        """The bound port (useful with port 0)."""
        return self._server.server_port if self._server else self.config.port

    def _app(self) -> Callable[..., Iterable[bytes]]:
        metrics = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "/")
            if path in ("/healthz", "/readyz"):
                ok, why = self.health.live() if path == "/healthz" else self.health.ready()
                status = "200 OK" if ok else "503 Service Unavailable"
                start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
                return [(why + "\n").encode()]
            if path == "/metrics":
                return metrics(environ, start_response)
            if path in self.actions:
                return self._action(path, environ, start_response)
            if path == "/":
                start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
                return [b"AACO agent: /metrics /healthz /readyz\n"]
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"not found; try /metrics\n"]

        return app

    def _action(self, path: str, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """A POST to an admin action (``/api/v1/capture``), with a credential ``admin`` accepts."""
        if environ.get("REQUEST_METHOD") != "POST":
            start_response("405 Method Not Allowed", [("Content-Type", "application/json"), ("Allow", "POST")])
            return [b'{"error": "use POST"}\n']
        peer = f"{environ.get('REMOTE_ADDR', '?')}:{environ.get('REMOTE_PORT', '?')}"
        if self.admin is None:
            start_response("403 Forbidden", [("Content-Type", "application/json")])
            return [b'{"error": "admin actions are off on this agent (no admin credential configured)"}\n']
        ok, who = self.admin.authorize(environ.get("HTTP_AUTHORIZATION"), peer)
        if not ok:
            log.warning("admin action %s refused from %s: %s", path, peer, who)
            start_response(
                "401 Unauthorized", [("Content-Type", "application/json"), ("WWW-Authenticate", 'Bearer realm="aaco"')]
            )
            return [json.dumps({"error": who}).encode() + b"\n"]
        params = {k: v[-1] for k, v in urllib.parse.parse_qs(environ.get("QUERY_STRING", "")).items()}
        code, doc = self.actions[path](params, who)
        reason = {
            200: "OK",
            202: "Accepted",
            400: "Bad Request",
            403: "Forbidden",
            404: "Not Found",
            409: "Conflict",
            429: "Too Many Requests",
        }.get(code, "Error")
        start_response(f"{code} {reason}", [("Content-Type", "application/json")])
        return [json.dumps(doc).encode() + b"\n"]

    def start(self) -> None:
        """Bind and serve in a background thread (an address in use is a clear error)."""
        server_class = _V6Server if ":" in self.config.address else _Server
        try:
            self._server = make_server(
                self.config.address,
                self.config.port,
                self._app(),
                server_class=server_class,
                handler_class=_QuietHandler,
            )
        except OSError as exc:
            raise AacoError(
                f"cannot serve metrics on {self.config.address}:{self.config.port}: {exc.strerror or exc}",
                subject="exporters.prometheus",
                hint="choose another port with --metrics-port",
            ) from exc
        self._thread = threading.Thread(target=self._server.serve_forever, name="aaco-prometheus", daemon=True)
        self._thread.start()
        log.info("metrics on http://%s:%d/metrics", self.config.address, self.port)

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
        if self._thread is not None:
            self._thread.join(timeout_s)
