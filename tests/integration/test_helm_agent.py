"""The real agent started with the chart's rendered config, arguments and Secret files.

Paths that exist only in the container are moved to this machine (host mounts to sample trees, the
Secret volumes written as the kubelet writes them, loopback and free ports): the rest is as rendered.
With the defaults it answers the chart's probes and ingests the spool; with ci/secure-values.yaml
(Secrets from a throwaway PKI) it serves the probes over HTTPS without a credential, /metrics only
with basic auth, captures only with the rendered token (and never pid 1), and the receiver over mutual TLS.
"""

from __future__ import annotations

import shutil
import ssl
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from aaco.exporters.web_config import load as load_web_config
from tests.conftest import get_free_port
from tests.integration.helpers import http_get, metric_value, read_lake, start_aaco, wait_for
from tests.support.helm_chart import (
    RELEASE,
    SECURE,
    agent_env,
    host_paths_here,
    materialise,
    moved_text,
    render,
    scenario_values,
    secret_data,
)
from tests.support.pki import Pki, basic, make_pki

pytestmark = pytest.mark.integration

SCRAPE_PASSWORD = "aaco-scrape-test"  # the password whose bcrypt hash ci/secure-values.yaml holds


def local_env(tmp_path: Path, port: int, grpc_port: int = 0, http_port: int = 0) -> dict[str, str]:
    """The pod's environment with container-only values moved to this machine: loopback, free ports, a temp lake."""
    return {
        **agent_env(),
        "NODE_NAME": "ci-node",
        "AACO_EXPORTERS_PROMETHEUS_ADDRESS": "127.0.0.1",
        "AACO_EXPORTERS_PROMETHEUS_PORT": str(port),
        "AACO_EXPORTERS_LAKE_PATH": str(tmp_path / "lake"),
        "AACO_RECEIVERS_OTLP_ADDRESS": "127.0.0.1",
        "AACO_RECEIVERS_OTLP_GRPC_PORT": str(grpc_port),
        "AACO_RECEIVERS_OTLP_HTTP_PORT": str(http_port),
    }


def test_the_agent_runs_with_the_rendered_config_and_answers_the_chart_probes(
    tmp_path: Path, aaco_bin: str, samples: Path
):
    """The real agent, started with the chart's config and arguments, serves the chart's probe paths."""
    rendered = render({})
    config = host_paths_here(yaml.safe_load(rendered.config_text()), tmp_path, samples)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = rendered.container["args"]
    assert args[:2] == ["agent", "--config"]
    port = get_free_port()
    env = local_env(tmp_path, port)
    proc = start_aaco(aaco_bin, "agent", "--config", str(path), *args[3:], log=tmp_path / "agent.log", env=env)
    try:
        c = rendered.container
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            url = f"http://127.0.0.1:{port}{c[probe]['httpGet']['path']}"
            wait_for(lambda u=url: http_get(u)[0] == 200, timeout=60, what=f"{probe} {url}")
        # A workload drops a real trace into the spool: the chart's trace_dir source ingests it.
        shutil.copy(samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz", tmp_path / "spool")
        # The GPU of the sample tree is seen through the chart's smi source.
        wait_for(
            lambda: "aaco_gpu_" in http_get(f"http://127.0.0.1:{port}/metrics")[1],
            timeout=60,
            what="GPU metrics from the smi source",
        )
        wait_for(
            lambda: (
                metric_value(http_get(f"http://127.0.0.1:{port}/metrics")[1], "aaco_kernels_total", kind="kernel") == 14
            ),
            timeout=60,
            what="the spool's kernels through the trace_dir source",
        )
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, (tmp_path / "agent.log").read_text()[-2000:]
    # Flushed on SIGTERM: the sample's 14 kernels and 2 copies, once, in the lake on the state volume.
    kernels = read_lake(tmp_path / "lake", "kernels").to_pydict()
    assert sorted(kernels["kind"]) == ["kernel"] * 14 + ["memcpy"] * 2


def tls_secret(pki: Pki) -> dict[str, bytes]:
    """A kubernetes.io/tls Secret's data with ca.crt (as cert-manager writes it)."""
    return {
        "tls.crt": pki.server_cert.read_bytes(),
        "tls.key": pki.server_key.read_bytes(),
        "ca.crt": pki.ca.read_bytes(),
    }


def request(
    url: str, ctx: ssl.SSLContext, method: str = "GET", headers: dict[str, str] | None = None, data=None
) -> int:
    """The HTTP status of one request (an HTTP error status included)."""
    req = urllib.request.Request(url, method=method, headers=headers or {}, data=data)
    try:
        with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def answers(url: str, ctx: ssl.SSLContext) -> int:
    """The status of a GET, 0 while nothing listens yet."""
    try:
        return request(url, ctx)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0


def test_the_agent_serves_the_secure_scenario_as_rendered(tmp_path: Path, aaco_bin: str, samples: Path):
    """The real agent with ci/secure-values.yaml's config, arguments and Secret files: every door guarded."""
    rendered = render(scenario_values(SECURE))
    pki = make_pki(tmp_path / "pki")
    moved = materialise(
        rendered, tmp_path / "pod", {"aaco-metrics-tls": tls_secret(pki), "aaco-receiver-tls": tls_secret(pki)}
    )
    web_config = Path(moved["/etc/aaco/web"]) / "web-config.yml"
    web_config.write_text(moved_text(web_config.read_text(), moved))
    assert load_web_config(web_config).basic_auth_users, "the rendered file is the agent's web-config format"
    config = host_paths_here(yaml.safe_load(moved_text(rendered.config_text(), moved)), tmp_path, samples)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    port, grpc_port, http_port = get_free_port(), get_free_port(), get_free_port()
    env = {
        **local_env(tmp_path, port, grpc_port, http_port),
        "AACO_PIPELINE_SHUTDOWN_TIMEOUT_S": "3",  # the upstream is unreachable here: do not wait for it
    }
    args = rendered.container["args"]
    proc = start_aaco(aaco_bin, "agent", "--config", str(path), *args[3:], log=tmp_path / "agent.log", env=env)
    trusting = ssl.create_default_context(cafile=str(pki.ca))
    base = f"https://127.0.0.1:{port}"
    try:
        c = rendered.container
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["scheme"] == "HTTPS"
            url = base + c[probe]["httpGet"]["path"]  # as the kubelet probes: HTTPS, no credential
            wait_for(lambda u=url: answers(u, trusting) == 200, timeout=60, what=f"{probe} {url}")
        with pytest.raises(urllib.error.HTTPError) as plain:  # plain HTTP to the TLS port: told to use https
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
        assert plain.value.code == 400 and f"use https://127.0.0.1:{port}/metrics" in plain.value.read().decode()
        assert request(base + "/metrics", trusting) == 401
        assert request(base + "/metrics", trusting, headers={"Authorization": basic("prometheus", "wrong")}) == 401
        scrape = {"Authorization": basic("prometheus", SCRAPE_PASSWORD)}
        assert request(base + "/metrics", trusting, headers=scrape) == 200
        # The admin action: no token 401, the rendered Secret's token passes, and the capture policy refuses pid 1.
        capture = base + "/api/v1/capture?pid=1"
        assert request(capture, trusting, method="POST", data=b"") == 401
        token = secret_data(rendered, f"{RELEASE}-admin")["token"].decode()
        bearer = {"Authorization": f"Bearer {token}"}
        assert request(capture, trusting, method="POST", headers=bearer, data=b"") == 403
        # The receiver: mutual TLS, so a client without a certificate is refused in the handshake.
        traces = f"https://127.0.0.1:{http_port}/v1/traces"
        otlp = {"Content-Type": "application/x-protobuf"}
        with pytest.raises(OSError):
            request(traces, trusting, method="POST", headers=otlp, data=b"")
        client = ssl.create_default_context(cafile=str(pki.ca))
        client.load_cert_chain(pki.client_cert, pki.client_key)
        assert request(traces, client, method="POST", headers=otlp, data=b"") == 200
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    log = (tmp_path / "agent.log").read_text()
    assert "OTLP receiver on 127.0.0.1 (mutual TLS)" in log
    assert "capture of pid 1 asked by token from 127.0.0.1" in log and "refused (403 forbidden)" in log
