"""The Training jobs dashboard against a real Prometheus scraping a real replay of real ranks.

The demo has no distributed job (tests/integration/test_dashboards_live.py explains those panels'
absence there), so here ``aaco replay --serve`` replays HTA's two ranks of a 128-rank job
(``tests/data/kineto-multirank``) and ``nccl_parser_config_nccl_data`` (a rank whose NCCL kernels state
their message sizes), Prometheus (Debian's, loopback, the project's rules loaded) scrapes it with
``honor_labels`` as the chart's ServiceMonitor does, and every panel query of ``dashboards/jobs.json``
(variables All, intervals 1m, as Grafana sends them) must return data. The bus bandwidth Prometheus
holds is the one ``aaco fleet jobs`` computes from the lake the replay wrote.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, get_free_port, skip_or_fail
from tests.integration.helpers import run_aaco, start_aaco
from tests.support.prometheus_stack import (
    ScrapeJob,
    Server,
    http_json,
    instant_query,
    missing_binaries,
    range_query,
    start_prometheus,
)

pytestmark = pytest.mark.integration

RANKS = [
    ROOT / "tests" / "data" / "kineto-multirank" / "trace_filter_sampled_rank-0.json.gz",
    ROOT / "tests" / "data" / "kineto-multirank" / "trace_filter_sampled_rank-1.json.gz",
    ROOT / "examples" / "data" / "kineto-hta" / "nccl_parser_config_nccl_data.json.gz",
]
JOB128, NCCL2 = "nccl-128x-2023-04-28T23:51:38Z", "nccl-2x-2024-05-23T00:15:22Z"


def test_every_jobs_panel_query_has_data(tmp_path: Path, aaco_bin: str):
    from dashboards.queries import expand, load, panel_queries

    missing = missing_binaries()
    if missing:
        skip_or_fail(f"not installed: {', '.join(missing)} (Debian prometheus)")
    queries = list(panel_queries(load(ROOT / "dashboards" / "jobs.json")))
    assert len(queries) >= 10
    port, lake = get_free_port(), tmp_path / "lake"
    agent = start_aaco(
        aaco_bin,
        *("replay", *map(str, RANKS), "--out", str(lake), "--no-progress", "--serve", "--metrics-port", str(port)),
        log=tmp_path / "agent.log",
        env={"AACO_PIPELINE_SNAPSHOT_INTERVAL_S": "0.5", "AACO_NODE": "gpu-a"},
    )
    servers: list[Server] = []
    try:
        rules = sorted((ROOT / "dashboards" / "rules").glob("*.yaml"))
        prom = start_prometheus(tmp_path / "prom", [ScrapeJob("aaco", [f"127.0.0.1:{port}"])], rules)
        servers.append(prom)
        started = time.monotonic()

        def empty() -> list[str]:
            since = max(10.0, time.monotonic() - started)
            return [
                q.where
                for q in queries
                if not (
                    instant_query(prom, expand(q.expr))
                    if q.instant
                    else any(r["values"] for r in range_query(prom, expand(q.expr), since, step="2s"))
                )
            ]

        # rates need two scrapes: poll until every query has data
        deadline = time.monotonic() + 90
        while (left := empty()) and time.monotonic() < deadline:
            time.sleep(1)
        assert left == [], f"jobs panel queries without data: {left}"

        # the training job is the job label (honor_labels), and the variables find jobs and ranks
        jobs = http_json(f"{prom.url}/api/v1/label/job/values?match[]=aaco_job_step_seconds")["data"]
        assert sorted(jobs) == sorted([JOB128, NCCL2])
        ranks = http_json(f"{prom.url}/api/v1/label/rank/values?match[]=aaco_job_step_seconds")["data"]
        assert sorted(ranks) == ["0", "1"]
        # HTA's two candidates among two ranks: both straggle
        straggling = instant_query(prom, f'sum by (job) (aaco_job_straggler{{job="{JOB128}"}})')
        assert float(straggling[0]["value"][1]) == 2
        (series,) = instant_query(prom, 'aaco_job_collective_bus_bandwidth_bytes_per_second{op="all_reduce"}')
        bus = float(series["value"][1])
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=60) == 0, (tmp_path / "agent.log").read_text()[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
        for s in servers:
            s.stop()
    proc = run_aaco(aaco_bin, "fleet", "jobs", "--lake", str(lake), "--json")
    assert proc.returncode == 0, proc.stderr
    (fleet,) = [j for j in json.loads(proc.stdout)["jobs"] if j["job"] == NCCL2]
    (all_reduce,) = [c for c in fleet["collectives"] if c["op"] == "all_reduce"]
    assert bus == pytest.approx(all_reduce["bus_bandwidth_gbps"] * 1e9, rel=1e-9)
