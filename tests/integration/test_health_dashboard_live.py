"""The GPU health dashboard against a real Prometheus scraping agents that read real captures and a real kernel log.

Four agents (four nodes of one GPU each) sample real captures (a copy of the Tesla T4's with a
retirement pending, the A10G's row remapper, a copy of the H100's with a pending remap and 2
uncorrected DRAM errors, amd-smi's with AMD's activity); the first also follows a kernel log of
GPUd's real XID lines. Prometheus (Debian's, loopback, the project's rules loaded) scrapes them, and
every panel query of ``dashboards/gpu-health.json`` (variables All, intervals 1m) must return data,
but those no source here can feed (``NO_SOURCE_HERE``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, get_free_port, skip_or_fail
from tests.integration.helpers import start_aaco
from tests.support.nvidia_health_captures import H100, T4, with_field
from tests.support.prometheus_stack import (
    ScrapeJob,
    Server,
    instant_query,
    missing_binaries,
    range_query,
    start_prometheus,
)

pytestmark = pytest.mark.integration

A10G = ROOT / "tests" / "data" / "nvidia-smi" / "a10g.xml"
AMD_SMI = ROOT / "examples" / "data" / "amd-smi" / "amd-smi-metric.json"  # its usage section: AMD's activity
LOGS = ROOT / "tests" / "data" / "kernel-log"
# metric -> why no source of this test gives it (NVML and amdsmi need a GPU; GPM needs Hopper)
NO_SOURCE_HERE = {
    "aaco_gpu_nvlink_errors_total": "NVLink error counters come from NVML only (no GPU here)",
    "aaco_gpu_sm_active_ratio": "activity counters come from NVML's GPM or the amdsmi library (no GPU here)",
    "aaco_gpu_sm_occupancy_ratio": "activity counters come from NVML's GPM (no GPU here)",
    "aaco_gpu_tensor_active_ratio": "activity counters come from NVML's GPM (no GPU here)",
    "aaco_gpu_counters_paused": "published by the activity counters' sampling, which needs a GPU",
}


def test_every_health_panel_query_has_data(tmp_path: Path, aaco_bin: str):
    from dashboards.queries import expand, load, panel_queries

    missing = missing_binaries()
    if missing:
        skip_or_fail(f"not installed: {', '.join(missing)} (Debian prometheus)")
    queries = list(panel_queries(load(ROOT / "dashboards" / "gpu-health.json")))
    assert len(queries) >= 15
    h100 = with_field(H100, tmp_path / "h100.xml", "remapped_rows/remapped_row_pending", "Yes")
    h100 = with_field(h100, tmp_path / "h100-ecc.xml", "ecc_errors/volatile/dram_uncorrectable", "2")
    t4 = with_field(T4, tmp_path / "t4.xml", "retired_pages/pending_retirement", "Yes")
    log = tmp_path / "kern.log"
    log.write_bytes(b"".join(p.read_bytes() for p in sorted(LOGS.glob("*.log"))))
    # four nodes, one GPU each (each capture is its GPU 0), the kernel log on the first
    nodes = {"gpu-h100": h100, "gpu-t4": t4, "gpu-a10g": A10G, "gpu-mi": AMD_SMI}
    ports = {node: get_free_port() for node in nodes}
    agents = []
    for node, capture in nodes.items():
        xid = f"  - {{type: xid, path: {log}, interval_s: 0.5, sysfs_root: {tmp_path}}}\n" if node == "gpu-h100" else ""
        cfg = tmp_path / f"{node}.yaml"
        cfg.write_text(
            f"""
node: {node}
sources:
  - {{type: smi, backend: file, file: {capture}, interval_s: 0.5, kubelet_socket: null}}
{xid}exporters:
  prometheus: {{port: {ports[node]}}}
  lake: {{path: {tmp_path / node}}}
pipeline: {{snapshot_interval_s: 0.5}}
"""
        )
        agents.append(start_aaco(aaco_bin, "agent", "--config", str(cfg), log=tmp_path / f"{node}.log"))
    servers: list[Server] = []
    try:
        rules = sorted((ROOT / "dashboards" / "rules").glob("*.yaml"))
        targets = [f"127.0.0.1:{p}" for p in ports.values()]
        prom = start_prometheus(tmp_path / "prom", [ScrapeJob("aaco", targets)], rules)
        servers.append(prom)
        started = time.monotonic()

        def empty() -> list[str]:
            since = max(10.0, time.monotonic() - started)
            out = []
            for q in queries:
                if any(name in q.expr for name in NO_SOURCE_HERE):
                    continue
                expr = expand(q.expr)
                has = (
                    instant_query(prom, expr)
                    if q.instant
                    else any(r["values"] for r in range_query(prom, expr, since, step="2s"))
                )
                if not has:
                    out.append(q.where)
            return out

        deadline = time.monotonic() + 90
        while (left := empty()) and time.monotonic() < deadline:
            time.sleep(1)
        assert left == [], f"health panel queries without data: {left}"
        # the verdicts behind the panels
        status = {
            (r["metric"]["node"], r["metric"]["gpu"]): r["metric"]["status"]
            for r in instant_query(prom, "aaco_gpu_health == 1")
        }
        assert status[("gpu-h100", "0")] == "unhealthy" and status[("gpu-t4", "0")] == "warning", status
        assert status[("gpu-a10g", "0")] == "healthy" and status[("gpu-h100", "0000:91:00.0")] == "unhealthy", status
        for agent, node in zip(agents, nodes, strict=True):
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=60) == 0, (tmp_path / f"{node}.log").read_text()[-3000:]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
        for s in servers:
            s.stop()
