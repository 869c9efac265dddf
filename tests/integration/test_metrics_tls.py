"""A real Prometheus (Debian ``prometheus``) scrapes the agent's ``/metrics`` over TLS with basic auth.

The agent's exporter takes a web-config file in exporter-toolkit's format (TLS, a client certificate
required and verified, a bcrypt-hashed user); Prometheus scrapes it with ``scheme: https``, ``tls_config``
(the CA, its own client certificate) and ``basic_auth``, as it scrapes node-exporter or dcgm-exporter set up
the same way. A second job with a wrong password and a third without a client certificate show the
target down, with the reason Prometheus gives.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml

from aaco.contract.stats import Stats
from aaco.exporters.prometheus import PrometheusConfig, PrometheusExporter
from tests.conftest import skip_or_fail
from tests.support.pki import make_pki
from tests.support.prometheus_stack import (
    PROMETHEUS_NAMES,
    ScrapeJob,
    Server,
    find,
    http_json,
    instant_query,
    start_prometheus,
)

pytestmark = pytest.mark.integration

PASSWORD = "correct horse battery staple"


def _job(name: str, port: int, tls: dict[str, str], password: str) -> ScrapeJob:
    settings = {"scheme": "https", "tls_config": tls, "basic_auth": {"username": "prometheus", "password": password}}
    return ScrapeJob(name, [f"127.0.0.1:{port}"], settings=settings)


def _targets(prom: Server) -> dict[str, dict[str, Any]]:
    doc = http_json(prom.url + "/api/v1/targets")
    return {t["labels"]["job"]: t for t in doc["data"]["activeTargets"]}


def test_prometheus_scrapes_metrics_over_tls_with_basic_auth(tmp_path: Path):
    if find(PROMETHEUS_NAMES) is None:
        skip_or_fail("prometheus is not installed (Debian prometheus)")
    pki = make_pki(tmp_path / "pki")
    web = tmp_path / "web"
    web.mkdir()
    (web / "tls.crt").write_bytes(pki.server_cert.read_bytes())
    (web / "tls.key").write_bytes(pki.server_key.read_bytes())
    (web / "ca.crt").write_bytes(pki.ca.read_bytes())
    web_config = web / "web-config.yml"
    web_config.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {  # relative paths: relative to this file, as a mounted Secret has them
                    "cert_file": "tls.crt",
                    "key_file": "tls.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": "ca.crt",
                },
                "basic_auth_users": {"prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(10)).decode()},
            }
        )
    )
    exporter = PrometheusExporter(PrometheusConfig(port=0, web_config_file=web_config), Stats(), "node-1")
    exporter.start()
    prom: Server | None = None
    try:
        tls = {"ca_file": str(pki.ca), "cert_file": str(pki.client_cert), "key_file": str(pki.client_key)}
        prom = start_prometheus(
            tmp_path / "prometheus",
            [
                _job("aaco", exporter.port, tls, PASSWORD),
                _job("aaco-wrong-password", exporter.port, tls, "wrong"),
                _job("aaco-no-client-cert", exporter.port, {"ca_file": str(pki.ca)}, PASSWORD),
            ],
        )

        def settled() -> bool:
            targets = _targets(prom)
            return len(targets) == 3 and all(t["health"] != "unknown" for t in targets.values())

        assert _wait(settled), f"targets never scraped: {_targets(prom)}\n{prom.log.read_text()[-3000:]}"
        assert _wait(lambda: _targets(prom)["aaco"]["health"] == "up"), _targets(prom)["aaco"]
        assert _wait(lambda: bool(instant_query(prom, 'aaco_agent_info{job="aaco",node="node-1"}')))
        wrong = _targets(prom)["aaco-wrong-password"]
        assert wrong["health"] == "down"
        assert "401" in wrong["lastError"], wrong["lastError"]
        no_cert = _targets(prom)["aaco-no-client-cert"]
        assert no_cert["health"] == "down"  # its error is the TLS alert or a broken pipe, as the handshake races
        assert no_cert["lastError"]
        # the refusals are counted, and scraped through the door that works
        for query in (
            'aaco_metrics_server_refused_total{job="aaco",reason="bad_credentials"} > 0',
            'aaco_http_connections_total{job="aaco",port="metrics",outcome="client_cert"} > 0',
        ):
            assert _wait(lambda q=query: bool(instant_query(prom, q))), query
    finally:
        if prom is not None:
            prom.stop()
        exporter.shutdown(5)


def _wait(predicate: Any, timeout_s: float = 60.0) -> bool:
    """Poll ``predicate`` until true or ``timeout_s`` passed (a hang fails instead of blocking)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return bool(predicate())
