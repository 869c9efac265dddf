"""Helpers for integration tests: run the real ``aaco`` command, wait for HTTP endpoints."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow.dataset as ds
import yaml

from tests.conftest import ROOT, get_free_port


def run_aaco(
    aaco_bin: str, *args: str, timeout: float = 240, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``aaco ARGS`` to completion and capture its output."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [aaco_bin, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=full_env, check=False
    )


def run_aaco_each(
    aaco_bin: str, *commands: tuple[str, ...], env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess[str]]:
    """Run independent ``aaco`` commands side by side (one per CPU at most); their results in order."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(commands), os.cpu_count() or 1))) as pool:
        return list(pool.map(lambda args: run_aaco(aaco_bin, *args, env=env), commands))


def start_aaco(
    aaco_bin: str, *args: str, cwd: Path | None = None, log: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """Start ``aaco ARGS`` in the background (stdout and stderr to ``log`` when given)."""
    out = open(log, "w") if log else subprocess.DEVNULL  # noqa: SIM115 - closed with the process by the caller
    return subprocess.Popen(
        [aaco_bin, *args], stdout=out, stderr=subprocess.STDOUT, text=True, cwd=cwd, env={**os.environ, **(env or {})}
    )


def http_get(url: str, timeout: float = 5.0, accept: str | None = None, auth: str | None = None) -> tuple[int, str]:
    """GET ``url`` (with an Accept and an Authorization header when given): (status, body); connection errors: 0."""
    headers = {"Accept": accept} if accept else {}
    if auth:
        headers["Authorization"] = auth
    req = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, ""


def wait_for(predicate, timeout: float = 60.0, interval: float = 0.2, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def read_lake(root: Path, kind: str):
    """A lake dataset as a table (hive partitioning)."""
    return ds.dataset(root / kind, partitioning="hive").to_table()


def metric_value(text: str, name: str, **labels: str) -> float | None:
    """The value of the first sample of ``name`` whose labels include ``labels`` in exposition ``text``."""
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.partition(" ") if "{" not in line else line.rpartition("} ")
        metric = head.split("{", 1)[0]
        if metric != name:
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(value.split(" ")[0])
    return None


def demo_on_free_ports(path: Path) -> Path:
    """examples/demo.yaml as it is, written to ``path`` with its receiver (and the LLM requests to it) on free ports."""
    doc = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    rx = doc["receivers"]["otlp"]
    assert rx["enabled"] is True, "the demo turns its receiver on"
    http_port, grpc_port = get_free_port(), get_free_port()
    rx.update(http_port=http_port, grpc_port=grpc_port)
    (llm,) = [s for s in doc["sources"] if s["type"] == "llm_requests"]
    llm["endpoint"] = f"http://127.0.0.1:{http_port}"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
