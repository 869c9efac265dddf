"""The agent's health verdict live: a real capture sampled and a real kernel log followed, on /metrics and in the lake.

The smi source reads a copy of the real H100 capture (file backend); the xid source follows a kernel
log that starts clean and then receives the real XID 79 line of GPUd's log, for the GPU at the PCI
address the sysfs tree numbers 0 (the H100's, 0000:91:00.0 for this test). The GPU goes from healthy
to unhealthy on /metrics, the finding is in the lake's analysis, and the XID counter is exported.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.nvidia_health_captures import H100, with_field

from .helpers import http_get, metric_value, start_aaco, wait_for

pytestmark = pytest.mark.integration

XID79 = ROOT / "tests" / "data" / "kernel-log" / "gpud-sxid-readme-xid79.log"


def test_a_gpu_turns_unhealthy_live_when_the_kernel_logs_an_xid_79(tmp_path: Path, aaco_bin: str, free_port: int):
    capture = with_field(H100, tmp_path / "h100.xml", "pci/pci_bus_id", "00000000:91:00.0")
    sysfs = tmp_path / "sys" / "bus" / "pci" / "devices" / "0000:91:00.0"
    sysfs.mkdir(parents=True)
    (sysfs / "vendor").write_text("0x10de\n")
    (sysfs / "class").write_text("0x030200\n")
    log = tmp_path / "kern.log"
    log.write_text("[    1.000000] Linux version 6.8.0 (a kernel log with no XID yet)\n")
    lake = tmp_path / "lake"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"""
node: gpu-node-1
sources:
  - {{type: smi, backend: file, file: {capture}, interval_s: 0.2, kubelet_socket: null}}
  - {{type: xid, path: {log}, interval_s: 0.2, sysfs_root: {tmp_path / "sys"}}}
exporters:
  prometheus: {{port: {free_port}}}
  lake: {{path: {lake}, flush_interval_s: 0.5}}
pipeline: {{snapshot_interval_s: 0.2}}
"""
    )
    proc = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=tmp_path / "agent.log")
    url = f"http://127.0.0.1:{free_port}/metrics"
    gpu = {"node": "gpu-node-1", "gpu": "0", "gpu_uuid": "GPU-dab60736-6049-d541-3661-0407a2d7284c"}

    def status(body: str, want: str) -> bool:
        try:
            return metric_value(body, "aaco_gpu_health", status=want, **gpu) == 1.0
        except (AssertionError, KeyError, ValueError):
            return False

    try:
        body = wait_for(lambda: (b := http_get(url)[1]) and status(b, "healthy") and b, timeout=60, what="healthy")
        assert metric_value(body, "aaco_gpu_ecc_uncorrected_errors_total", block="dram", gpu="0") == 0.0
        with log.open("a") as fh:
            fh.write(XID79.read_text())
        body = wait_for(lambda: (b := http_get(url)[1]) and status(b, "unhealthy") and b, timeout=60, what="unhealthy")
        assert metric_value(body, "aaco_gpu_health_reason", reason="xid_79", node="gpu-node-1", gpu="0") == 1.0
        assert metric_value(body, "aaco_gpu_xid_errors_total", xid="79", gpu="0") == 1.0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, (tmp_path / "agent.log").read_text()[-3000:]
    analysis = json.loads((lake / "analysis.json").read_text())
    (gpu0,) = [g for g in analysis["health"]["gpus"] if g["gpu"] == "0"]
    assert gpu0["status"] == "unhealthy" and [r["code"] for r in gpu0["reasons"]] == ["xid_79"]
