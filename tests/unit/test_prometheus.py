"""Prometheus rendering (text and OpenMetrics, exemplars) and the HTTP endpoint."""

from __future__ import annotations

import shutil
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text

from aaco.agent import __version__
from aaco.agent.http import health_routes, routes
from aaco.analyzers.kar import KarAnalyzer
from aaco.analyzers.latency import ITERATION_LATENCY, LatencyAnalyzer
from aaco.analyzers.stats import Histogram
from aaco.contract.errors import AacoError
from aaco.contract.http_app import HTTP_CONNECTIONS
from aaco.contract.signals import LATENCY_BUCKETS, Exemplar, HistogramValue, MetricPoint
from aaco.contract.snapshot import AnalysisSnapshot
from aaco.contract.stats import EVENTS_DROPPED, QUEUE_DEPTH, Stats
from aaco.exporters.base import ExportResult
from aaco.exporters.prometheus import METRICS_SERVER_REFUSED, PrometheusConfig, PrometheusExporter, render
from aaco.exporters.web_config import WEB_CONFIG_RELOADS
from tests.support.pki import Pki, basic, bcrypt_hash, issue, make_ca, make_pki

from .builders import NODE, item, iterations
from .test_web_config import bump, write

TRACE = "0af7651916cd43dd8448eb211c80319c"


class _Points:
    def __init__(self, points):
        self.points = points

    def collect(self):
        return render(self.points)


def registry(points) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Points(points))  # type: ignore[arg-type]
    return reg


def samples_of(text: str, parser=parse_text) -> dict[tuple[str, tuple[tuple[str, str], ...]], object]:
    out = {}
    for fam in parser(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s
    return out


def hist(values_s: list[float], exemplar: tuple[str, float] | None) -> HistogramValue:
    """A latency histogram of ``values_s``; ``exemplar`` (trace id, value) on the bucket its value falls in."""
    counts = tuple(sum(1 for v in values_s if v <= b) for b in LATENCY_BUCKETS)
    exemplars: list[Exemplar | None] = [None] * (len(LATENCY_BUCKETS) + 1)
    if exemplar:
        exemplars[sum(1 for b in LATENCY_BUCKETS if b < exemplar[1])] = Exemplar(*exemplar)
    return HistogramValue(LATENCY_BUCKETS, counts, len(values_s), sum(values_s), tuple(exemplars))


def test_render_counters_and_gauges_text():
    pts = [
        MetricPoint(EVENTS_DROPPED, {"component": "source:ort", "reason": "queue_full"}, 5.0),
        MetricPoint(EVENTS_DROPPED, {"component": "source:ort", "reason": "shutdown"}, 2.0),
        MetricPoint(QUEUE_DEPTH, {"queue": "bus"}, 17.0),
    ]
    text = generate_latest(registry(pts)).decode()
    assert "# TYPE aaco_events_dropped_total counter" in text
    assert "# HELP aaco_events_dropped_total Events a component dropped" in text
    assert "# TYPE aaco_queue_depth gauge" in text
    s = samples_of(text)
    assert s[("aaco_events_dropped_total", (("component", "source:ort"), ("reason", "queue_full")))].value == 5.0
    assert s[("aaco_events_dropped_total", (("component", "source:ort"), ("reason", "shutdown")))].value == 2.0
    assert s[("aaco_queue_depth", (("queue", "bus"),))].value == 17.0


def test_render_histogram_text():
    h = hist([0.0001, 0.003, 0.07], (TRACE, 0.07))
    pts = [MetricPoint(ITERATION_LATENCY, {"node": NODE, "model": "resnet"}, h)]
    text = generate_latest(registry(pts)).decode()
    assert "# TYPE aaco_iteration_latency_seconds histogram" in text
    s = samples_of(text)
    lab = (("model", "resnet"), ("node", NODE))

    def bucket(le):
        return s[("aaco_iteration_latency_seconds_bucket", tuple(sorted((*lab, ("le", le)))))].value

    assert bucket("0.0001") == 1
    assert bucket("0.0025") == 1
    assert bucket("0.005") == 2
    assert bucket("0.1") == 3
    assert bucket("60.0") == 3
    assert bucket("+Inf") == 3
    assert s[("aaco_iteration_latency_seconds_count", lab)].value == 3
    assert s[("aaco_iteration_latency_seconds_sum", lab)].value == pytest.approx(0.0731)
    assert "trace_id" not in text  # exemplars only in OpenMetrics


def test_openmetrics_exemplar_in_the_right_bucket():
    h = hist([0.0001, 0.003, 0.07], (TRACE, 0.07))
    pts = [MetricPoint(ITERATION_LATENCY, {"node": NODE, "model": "resnet"}, h)]
    text = generate_openmetrics(registry(pts)).decode()
    assert text.rstrip().endswith("# EOF")
    with_exemplar = [s for fam in parse_openmetrics(text) for s in fam.samples if s.exemplar is not None]
    assert len(with_exemplar) == 1
    s = with_exemplar[0]
    assert s.name == "aaco_iteration_latency_seconds_bucket"
    assert s.labels["le"] == "0.1"  # the first bucket whose bound holds 70 ms
    assert s.exemplar.labels == {"trace_id": TRACE}
    assert s.exemplar.value == pytest.approx(0.07)
    line = next(x for x in text.splitlines() if "trace_id" in x)
    assert 'le="0.1"' in line
    assert f'# {{trace_id="{TRACE}"}} 0.07' in line


def test_openmetrics_an_exemplar_on_each_bucket_from_the_analyzer():
    traces = ["a" * 32, "b" * 32, "c" * 32, "d" * 32]
    h = Histogram(np.array(LATENCY_BUCKETS))
    values = np.array([0.0004, 0.003, 0.07, 0.0045])  # the 5 ms bucket's latest is the 4th
    h.add(values, np.array(traces, dtype=object), np.array([1, 2, 3, 4_000_000_000]))
    pts = [MetricPoint(ITERATION_LATENCY, {"node": NODE, "model": "m"}, h.value())]
    text = generate_openmetrics(registry(pts)).decode()
    got = {
        s.labels["le"]: s.exemplar
        for fam in parse_openmetrics(text)
        for s in fam.samples
        if s.name.endswith("_bucket") and s.exemplar is not None
    }
    assert set(got) == {"0.0005", "0.005", "0.1"}
    assert {le: e.labels["trace_id"] for le, e in got.items()} == {
        "0.0005": traces[0],
        "0.005": traces[3],
        "0.1": traces[2],
    }
    assert got["0.005"].value == pytest.approx(0.0045) and float(got["0.005"].timestamp) == pytest.approx(4.0)
    plain = samples_of(generate_latest(registry(pts)).decode())
    lab = (("model", "m"), ("node", NODE))
    assert plain[("aaco_iteration_latency_seconds_bucket", (("le", "0.005"), *lab))].value == 3
    assert plain[("aaco_iteration_latency_seconds_count", lab)].value == 4


def test_openmetrics_exemplar_on_a_bound():
    h = hist([0.005], (TRACE, 0.005))
    text = generate_openmetrics(registry([MetricPoint(ITERATION_LATENCY, {"node": NODE, "model": "m"}, h)])).decode()
    line = next(x for x in text.splitlines() if "trace_id" in x)
    assert 'le="0.005"' in line


def test_histogram_without_exemplar():
    h = hist([0.01], None)
    text = generate_openmetrics(registry([MetricPoint(ITERATION_LATENCY, {"node": NODE, "model": "m"}, h)])).decode()
    assert "trace_id" not in text


def test_exemplar_beyond_the_last_bound_goes_to_inf_bucket():
    h = hist([100.0], (TRACE, 100.0))
    text = generate_openmetrics(registry([MetricPoint(ITERATION_LATENCY, {"node": NODE, "model": "m"}, h)])).decode()
    lines = [x for x in text.splitlines() if "trace_id" in x]
    assert len(lines) == 1, "the exemplar was dropped"
    assert 'le="+Inf"' in lines[0]


def test_render_analyzer_points_roundtrip():
    lat = LatencyAnalyzer()
    lat.update(item("iterations", iterations([(0, 2_000_000), (10, 4_000_010)], model="resnet")))
    kar = KarAnalyzer()
    kar.update(item("iterations", iterations([(0, 1)], graph_nodes=[100])))
    snap = AnalysisSnapshot(1, NODE, {"latency": lat.snapshot(), "kar": kar.snapshot()})
    text = generate_latest(registry(list(snap.points()))).decode()
    s = samples_of(text)
    assert s[("aaco_iteration_throughput_per_second", (("model", "resnet"), ("node", NODE)))].value == pytest.approx(
        1 / 0.003
    )
    assert s[("aaco_model_graph_nodes", (("model", "m"), ("node", NODE)))].value == 100
    assert s[("aaco_iteration_latency_seconds_count", (("model", "resnet"), ("node", NODE)))].value == 2


# --- the HTTP endpoint ---------------------------------------------------------------------------------


class Health:
    def __init__(self) -> None:
        self.is_live = True
        self.is_ready = False

    def live(self):
        return self.is_live, "live" if self.is_live else "pipeline stalled for 61 s"

    def ready(self):
        return self.is_ready, "ready" if self.is_ready else "starting"


def get(url: str, accept: str | None = None) -> tuple[int, str, str]:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.headers.get("Content-Type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("Content-Type", ""), e.read().decode()


@pytest.fixture
def served():
    stats = Stats()
    health = Health()
    exp = PrometheusExporter(PrometheusConfig(port=0), stats, NODE, health_routes(health))
    exp.start()
    try:
        yield exp, stats, health, f"http://127.0.0.1:{exp.port}"
    finally:
        exp.shutdown(5)


def test_metrics_endpoint(served):
    exp, stats, _, base = served
    assert exp.port != 0
    stats.inc(EVENTS_DROPPED, 3, component="source:ort", reason="queue_full")
    status, ctype, body = get(base + "/metrics")
    assert status == 200
    assert ctype.startswith("text/plain")
    s = samples_of(body)
    assert s[("aaco_events_dropped_total", (("component", "source:ort"), ("reason", "queue_full")))].value == 3
    assert s[("aaco_agent_info", (("node", NODE), ("version", __version__)))].value == 1
    assert s[("aaco_agent_start_time_seconds", ())].value == pytest.approx(exp.started_at)
    assert ("aaco_stats_series_dropped_total", ()) in s
    assert ("aaco_collect_duration_seconds", ()) in s


def test_metrics_serves_latest_snapshot_with_exemplar(served):
    exp, _, _, base = served
    lat = LatencyAnalyzer()
    b = iterations([(0, 2_000_000)], model="resnet")
    lat.update(item("iterations", b))
    assert exp.export_snapshot(AnalysisSnapshot(1, NODE, {"latency": lat.snapshot()})) is ExportResult.SUCCESS
    _, _, body = get(base + "/metrics")
    assert ("aaco_iteration_latency_seconds_count", (("model", "resnet"), ("node", NODE))) in samples_of(body)
    status, ctype, om = get(base + "/metrics", accept="application/openmetrics-text; version=1.0.0")
    assert status == 200
    assert ctype.startswith("application/openmetrics-text")
    assert b.column("trace_id")[0].as_py() in om
    assert om.rstrip().endswith("# EOF")


def test_healthz_and_readyz(served):
    _, _, health, base = served
    assert get(base + "/healthz")[0] == 200
    assert get(base + "/readyz")[:1] == (503,)
    assert get(base + "/readyz")[2] == "starting\n"
    health.is_ready = True
    assert get(base + "/readyz")[0] == 200
    health.is_live = False
    status, _, body = get(base + "/healthz")
    assert status == 503
    assert "stalled" in body


def test_root_and_unknown_paths(served):
    _, _, _, base = served
    status, _, body = get(base + "/")
    assert status == 200
    assert "/metrics" in body
    assert get(base + "/nope")[0] == 404
    assert get(base + "/metrics/extra")[0] == 404


def test_port_in_use_is_a_clear_error(served):
    exp, _, health, _ = served
    other = PrometheusExporter(PrometheusConfig(port=exp.port), Stats(), NODE, health_routes(health))
    with pytest.raises(AacoError, match="cannot serve metrics") as exc:
        other.start()
    assert exc.value.subject == "exporters.prometheus"
    other.shutdown(1)


def test_shutdown_idempotent_and_stops_serving():
    exp = PrometheusExporter(PrometheusConfig(port=0), Stats(), NODE, health_routes(Health()))
    exp.start()
    url = f"http://127.0.0.1:{exp.port}/healthz"
    assert get(url)[0] == 200
    exp.shutdown(5)
    exp.shutdown(5)
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)


def test_shutdown_before_start_and_noop_contract():
    exp = PrometheusExporter(PrometheusConfig(port=0), Stats(), NODE, health_routes(Health()))
    exp.shutdown(1)
    exp.shutdown(1)
    assert exp.force_flush(1) is True
    assert exp.port == 0


# --- TLS and basic auth (a Prometheus web-config file), the worker pool and the deadline ----------------------------


def wait_for(predicate, timeout_s: float = 20.0) -> bool:
    """Poll ``predicate`` until true or ``timeout_s`` passed (a hang fails instead of blocking)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def fetch(url: str, context: ssl.SSLContext | None = None, auth: str | None = None) -> tuple[int, dict[str, str], str]:
    """GET over http or https; (status, headers, body), an HTTP error status included."""
    req = urllib.request.Request(url, headers={"Authorization": auth} if auth else {})
    try:
        with urllib.request.urlopen(req, timeout=10, context=context) as r:
            return r.status, dict(r.headers), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def client_context(pki: Pki, ca: Path | None = None, cert: bool = False) -> ssl.SSLContext:
    """A client SSLContext trusting ``ca`` (the PKI's CA by default), with the client certificate if asked."""
    ctx = ssl.create_default_context(cafile=str(ca or pki.ca))
    if cert:
        ctx.load_cert_chain(pki.client_cert, pki.client_key)
    return ctx


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """One PKI for the module."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture
def serve_with(tmp_path: Path):
    """Start an exporter whose web-config file is ``doc`` (more PrometheusConfig fields as keywords)."""
    started: list[PrometheusExporter] = []

    def start(doc: dict, **fields) -> tuple[PrometheusExporter, Stats, Path]:
        path = write(tmp_path / "web-config.yml", doc)
        stats = Stats()
        health = Health()
        exp = PrometheusExporter(
            PrometheusConfig(port=0, web_config_file=path, **fields),
            stats,
            NODE,
            routes(health, {"/api/v1/capture": lambda params, who: {}}, None),
        )
        exp.start()
        started.append(exp)
        return exp, stats, path

    yield start
    for exp in started:
        exp.shutdown(5)


def tls_doc(pki: Pki, **tls) -> dict:
    return {"tls_server_config": {"cert_file": str(pki.server_cert), "key_file": str(pki.server_key), **tls}}


def test_tls_and_basic_auth(serve_with, pki: Pki):
    hashed = bcrypt_hash("s3cret")
    doc = {
        **tls_doc(pki),
        "basic_auth_users": {"prometheus": hashed},
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    }
    exp, stats, _ = serve_with(doc)
    base = f"https://127.0.0.1:{exp.port}"
    ctx = client_context(pki)
    status, headers, body = fetch(base + "/metrics", ctx, basic("prometheus", "s3cret"))
    assert status == 200
    assert "aaco_agent_info" in body
    assert headers["X-Content-Type-Options"] == "nosniff"
    status, headers, _ = fetch(base + "/metrics", ctx, basic("prometheus", "wrong"))
    assert status == 401
    assert headers["WWW-Authenticate"].startswith("Basic")
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert fetch(base + "/metrics", ctx)[0] == 401
    assert fetch(base + "/", ctx)[0] == 401
    assert fetch(base + "/nope", ctx)[0] == 401, "no path is told apart before the credentials"
    assert stats.get(METRICS_SERVER_REFUSED, reason="bad_credentials") == 1
    assert stats.get(METRICS_SERVER_REFUSED, reason="no_credentials") == 3
    # the probes need no secret; the admin action has its own credential (here: none configured, 403, not 401)
    assert fetch(base + "/healthz", ctx)[0] == 200
    assert fetch(base + "/readyz", ctx)[0] == 503
    req = urllib.request.Request(base + "/api/v1/capture", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=10, context=ctx)
    assert exc.value.code == 403
    # the refusals are on /metrics
    _, _, body = fetch(base + "/metrics", ctx, basic("prometheus", "s3cret"))
    s = samples_of(body)
    assert s[("aaco_metrics_server_refused_total", (("reason", "bad_credentials"),))].value == 1


def test_plain_http_to_the_tls_port_is_answered_400_naming_the_https_url(serve_with, pki: Pki):
    """As Go's net/http (so node-exporter) does: a request line where a TLS handshake belongs gets a hint."""
    exp, stats, _ = serve_with(tls_doc(pki))
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"http://127.0.0.1:{exp.port}/metrics", timeout=10).read()
    assert err.value.code == 400
    assert err.value.read().decode() == (
        f"Client sent an HTTP request to an HTTPS server: this port speaks TLS; use https://127.0.0.1:{exp.port}/metrics\n"
    )
    assert conns(stats, "plaintext_http") == 1  # counted before the answer was sent
    assert fetch(f"https://127.0.0.1:{exp.port}/metrics", client_context(pki))[0] == 200
    assert conns(stats, "tls_failed") == 0


def test_client_certificate_required(serve_with, pki: Pki):
    doc = tls_doc(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca))
    exp, stats, _ = serve_with(doc)
    url = f"https://127.0.0.1:{exp.port}/metrics"
    with pytest.raises(OSError):
        fetch(url, client_context(pki))
    assert wait_for(lambda: conns(stats, "client_cert") == 1)
    assert fetch(url, client_context(pki, cert=True))[0] == 200
    # the probes too need the certificate then: the TLS layer is below every path
    with pytest.raises(OSError):
        fetch(f"https://127.0.0.1:{exp.port}/healthz", client_context(pki))


def test_client_certificate_of_another_ca_is_refused(serve_with, pki: Pki):
    doc = tls_doc(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.other_ca))
    exp, stats, _ = serve_with(doc)
    with pytest.raises(OSError):
        fetch(f"https://127.0.0.1:{exp.port}/metrics", client_context(pki, cert=True))
    assert wait_for(lambda: conns(stats, "client_cert") == 1)


def test_client_allowed_sans(serve_with, pki: Pki):
    doc = tls_doc(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki.ca), client_allowed_sans=["x.test"]
    )
    exp, stats, _ = serve_with(doc)
    with pytest.raises(OSError):
        fetch(f"https://127.0.0.1:{exp.port}/metrics", client_context(pki, cert=True))
    assert wait_for(lambda: conns(stats, "client_san") == 1)


def test_certificate_rotation_is_picked_up(serve_with, pki: Pki, tmp_path: Path):
    (tmp_path / "new").mkdir()
    new_ca = make_ca(tmp_path / "new", "new-ca")
    new_cert, new_key = issue(tmp_path / "new", "rotated", new_ca, "subjectAltName=IP:127.0.0.1\n")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    shutil.copy(pki.server_cert, cert)
    shutil.copy(pki.server_key, key)
    exp, stats, _ = serve_with({"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}})
    url = f"https://127.0.0.1:{exp.port}/metrics"
    assert fetch(url, client_context(pki))[0] == 200
    with pytest.raises(OSError):
        fetch(url, client_context(pki, ca=new_ca[0]))
    # as a Secret update: new files, then the agent's next connection uses them (no restart)
    shutil.copy(new_key, key)
    shutil.copy(new_cert, cert)
    bump(cert)
    assert fetch(url, client_context(pki, ca=new_ca[0]))[0] == 200
    with pytest.raises(OSError):
        fetch(url, client_context(pki))
    assert stats.get(WEB_CONFIG_RELOADS, result="ok") == 1


def test_a_broken_change_answers_500_but_probes_stay_open(serve_with, pki: Pki):
    exp, stats, path = serve_with({"basic_auth_users": {"p": bcrypt_hash("x")}})
    base = f"http://127.0.0.1:{exp.port}"
    assert fetch(base + "/metrics", auth=basic("p", "x"))[0] == 200
    path.write_text("basic_auth_users: {p: not-a-hash}\n")
    bump(path)
    assert fetch(base + "/metrics", auth=basic("p", "x"))[0] == 500
    assert fetch(base + "/healthz")[0] == 200
    assert stats.get(METRICS_SERVER_REFUSED, reason="config_error") == 1
    assert stats.get(WEB_CONFIG_RELOADS, result="error") == 1


def test_a_bad_web_config_file_stops_the_start(tmp_path: Path):
    path = write(tmp_path / "w.yml", {"tls_server_config": {"cert_file": "no.crt", "key_file": "no.key"}})
    exp = PrometheusExporter(PrometheusConfig(port=0, web_config_file=path), Stats(), NODE, health_routes(Health()))
    with pytest.raises(AacoError, match="cannot read") as exc:
        exp.start()
    assert exc.value.subject == str(tmp_path / "no.crt")
    exp.shutdown(1)


def test_a_silent_client_is_cut_at_the_deadline(serve_with, pki: Pki):
    exp, stats, _ = serve_with(tls_doc(pki), request_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", exp.port), timeout=30) as sock:
        assert sock.recv(1) == b"", "the server closed the connection (no TLS handshake came)"
    assert wait_for(lambda: conns(stats, "timeout") == 1)
    assert fetch(f"https://127.0.0.1:{exp.port}/metrics", client_context(pki))[0] == 200


def test_a_slow_request_is_cut_at_the_deadline(serve_with):
    exp, stats, _ = serve_with({}, request_timeout_s=0.5)
    with socket.create_connection(("127.0.0.1", exp.port), timeout=30) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
        answer = b""
        while chunk := sock.recv(4096):  # the answer, then the close
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 ")
    assert wait_for(lambda: stats.get(METRICS_SERVER_REFUSED, reason="timeout") == 1)


def test_half_open_connections_are_evicted_for_a_probe_and_a_scrape(serve_with):
    exp, stats, _ = serve_with({}, max_connections=4, max_connections_per_peer=4, request_timeout_s=60)
    held = [socket.create_connection(("127.0.0.1", exp.port), timeout=30) for _ in range(4)]
    try:
        for sock in held:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # half a request each, then nothing
        assert wait_for(lambda: conns(stats, "accepted") == 4)
        assert fetch(f"http://127.0.0.1:{exp.port}/healthz")[0] == 200
        assert conns(stats, "evicted") == 1
        assert held[0].recv(1) == b"", "the oldest made room"
        held[0] = socket.create_connection(("127.0.0.1", exp.port), timeout=30)  # the bound again
        held[0].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        assert wait_for(lambda: conns(stats, "accepted") == 6)
        assert fetch(f"http://127.0.0.1:{exp.port}/metrics")[0] == 200
        assert conns(stats, "evicted") == 2
        assert held[1].recv(1) == b"", "then the next oldest"
    finally:
        for sock in held:
            sock.close()


def conns(stats: Stats, outcome: str) -> float:
    return stats.get(HTTP_CONNECTIONS, port="metrics", outcome=outcome)
