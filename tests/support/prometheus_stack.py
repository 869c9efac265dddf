"""A real Prometheus and Alertmanager (Debian ``prometheus``, ``prometheus-alertmanager``) for tests.

Each runs on 127.0.0.1 with a temporary configuration and data directory, started by hand (the
Debian system services are not used), and is ready in well under a second. Short scrape and
evaluation intervals keep a live check to seconds.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import get_free_port

PROMETHEUS_NAMES = ("prometheus",)
PROMTOOL_NAMES = ("promtool",)
ALERTMANAGER_NAMES = ("prometheus-alertmanager", "alertmanager")


def find(names: Sequence[str]) -> str | None:
    """The first of ``names`` on PATH."""
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def missing_binaries() -> list[str]:
    """Which of prometheus, promtool and alertmanager are not installed."""
    wanted = {"prometheus": PROMETHEUS_NAMES, "promtool": PROMTOOL_NAMES, "alertmanager": ALERTMANAGER_NAMES}
    return [what for what, names in wanted.items() if find(names) is None]


def http_json(url: str, data: dict[str, str] | None = None, timeout: float = 10.0) -> Any:
    """GET (or form-POST ``data`` to) ``url`` and decode its JSON."""
    body = urllib.parse.urlencode(data).encode() if data is not None else None
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=timeout) as resp:
        return json.loads(resp.read())


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return False


@dataclass
class Server:
    """A started server process and its base URL."""

    name: str
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Wait for ``/-/ready``; fail with the log when the process exits or never gets ready."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            if _ready(self.url + "/-/ready"):
                return
            time.sleep(0.05)
        raise AssertionError(f"{self.name} not ready after {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        """Terminate (then kill) the process."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_alertmanager(workdir: Path) -> Server:
    """Alertmanager with one receiver that delivers nowhere: alerts are read back through its API."""
    binary = find(ALERTMANAGER_NAMES)
    assert binary, "alertmanager not installed"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "alertmanager.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "route": {"receiver": "test", "group_wait": "0s", "group_interval": "1s", "repeat_interval": "1h"},
                "receivers": [{"name": "test"}],
            }
        )
    )
    port = get_free_port()
    log = workdir / "alertmanager.log"
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # no gossip port: a single instance
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    server = Server("alertmanager", proc, f"http://127.0.0.1:{port}", log)
    server.wait_ready()
    return server


@dataclass
class ScrapeJob:
    """A scrape job: name, targets and the labels the targets get."""

    name: str
    targets: list[str]
    labels: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # more scrape settings: scheme, tls_config, basic_auth


def start_prometheus(
    workdir: Path,
    jobs: Sequence[ScrapeJob],
    rule_files: Sequence[Path] = (),
    alertmanager: Server | None = None,
    interval: str = "1s",
) -> Server:
    """Prometheus scraping ``jobs`` every ``interval``, evaluating ``rule_files`` as often, with exemplars."""
    binary = find(PROMETHEUS_NAMES)
    assert binary, "prometheus not installed"
    workdir.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [
            {
                "job_name": job.name,
                # As the Helm chart's ServiceMonitor: the agent's own node/pod labels win over the target's.
                "honor_labels": True,
                "static_configs": [{"targets": job.targets, "labels": job.labels}],
                **job.settings,
            }
            for job in jobs
        ],
    }
    if alertmanager is not None:
        host = alertmanager.url.removeprefix("http://")
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [host]}]}]}
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = get_free_port()
    log = workdir / "prometheus.log"
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--enable-feature=exemplar-storage",
            "--web.enable-lifecycle",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    server = Server("prometheus", proc, f"http://127.0.0.1:{port}", log)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def instant_query(prom: Server, expr: str) -> list[dict[str, Any]]:
    """Evaluate ``expr`` now; the result list (an error raises with Prometheus's message)."""
    try:
        doc = http_json(prom.url + "/api/v1/query", {"query": expr})
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{expr}: {exc.read().decode(errors='replace')}") from exc
    assert doc["status"] == "success", doc
    result = doc["data"]["result"]
    if doc["data"]["resultType"] == "scalar":
        return [{"metric": {}, "value": result}]
    return result


def range_query(prom: Server, expr: str, seconds: float, step: str = "1s") -> list[dict[str, Any]]:
    """Evaluate ``expr`` over the last ``seconds`` (as Grafana runs a time series panel)."""
    end = time.time()
    try:
        doc = http_json(
            prom.url + "/api/v1/query_range",
            {"query": expr, "start": f"{end - seconds:.3f}", "end": f"{end:.3f}", "step": step},
        )
    except urllib.error.HTTPError as exc:
        raise AssertionError(f"{expr}: {exc.read().decode(errors='replace')}") from exc
    assert doc["status"] == "success", doc
    return doc["data"]["result"]
