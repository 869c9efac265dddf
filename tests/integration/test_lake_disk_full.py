"""A lake whose filesystem fills (issue 27, kept so): the agent keeps running and answering, and once the
disk grows every kernel lands exactly once, with every Parquet part readable.

The lake is on a 1 MiB tmpfs (root mounts it) while 600,000 kernels arrive through the spool as
rocprofv3 CSVs (about 2.6 MiB of Parquet: the kernels come at random gaps, which Parquet cannot fold
away); the agent must answer ``/healthz`` throughout, and for a while after a commit failed for want
of space; then the tmpfs is remounted at 256 MiB and the lake must come to hold each kernel once.
"""

from __future__ import annotations

import os
import subprocess
import time

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import get_free_port, skip_or_fail
from tests.support import tracegen

from .helpers import http_get, metric_value, start_aaco, wait_for

pytestmark = pytest.mark.integration

KERNELS, FILES = 600_000, 6
FULL_S = 10.0  # how long the agent runs with its lake full before the disk grows


def mount(args: list[str]) -> bool:
    return subprocess.run(["mount", *args], capture_output=True, check=False).returncode == 0


def test_a_full_lake_keeps_the_agent_up_and_loses_nothing_once_the_disk_grows(tmp_path, aaco_bin, samples):
    if os.geteuid() != 0:
        skip_or_fail("mounting a small tmpfs for the lake needs root")
    lake, spool, port = tmp_path / "lake", tmp_path / "spool", get_free_port()
    lake.mkdir()
    spool.mkdir()
    if not mount(["-t", "tmpfs", "-o", "size=1m", "tmpfs", str(lake)]):
        skip_or_fail("cannot mount a tmpfs here")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "sources": [{"type": "trace_dir", "path": str(spool), "settle_s": 0.5, "poll_interval_s": 0.2}],
                "exporters": {"prometheus": {"port": port}, "lake": {"path": str(lake)}},
            }
        )
    )
    agent = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=tmp_path / "agent.log")
    healthy: list[int] = []
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200, timeout=60, what="a running agent")
        per_file = KERNELS // FILES
        for i in range(FILES):  # consecutive dispatches, written beside the spool, then moved in whole
            part = tmp_path / f"run{i}_kernel_trace.csv"
            tracegen.rocprofv3_varied_csv(samples, part, per_file, i * per_file, seed=i)
            part.rename(spool / part.name)
        metrics = f"http://127.0.0.1:{port}/metrics"
        deadline, full_since = time.monotonic() + 120, None
        while time.monotonic() < deadline:  # the lake fills; the agent must stay up and answer meanwhile
            healthy.append(http_get(f"http://127.0.0.1:{port}/healthz", timeout=5)[0])
            if agent.poll() is not None:
                break
            if full_since is None and (
                metric_value(http_get(metrics)[1], "aaco_export_errors_total", exporter="lake") or 0
            ):
                full_since = time.monotonic()  # a commit failed: the disk is full
            if full_since is not None and time.monotonic() - full_since > FULL_S:
                break
            time.sleep(0.5)
        assert full_since is not None, "the lake never filled its filesystem"
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
        assert healthy and all(code == 200 for code in healthy), healthy
        assert mount(["-o", "remount,size=256m", str(lake)])

        def landed() -> int:
            try:
                return ds.dataset(lake / "kernels", format="parquet", partitioning="hive").count_rows()
            except (OSError, ValueError):
                return 0

        wait_for(lambda: landed() >= KERNELS, timeout=300, interval=2, what="every kernel in the lake")
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        agent.terminate()
        assert agent.wait(60) == 0
        parts = sorted((lake / "kernels").rglob("part-*.parquet"))
        assert parts and all(pq.ParquetFile(p).metadata.num_rows > 0 for p in parts)  # every part readable
        table = ds.dataset(lake / "kernels", format="parquet", partitioning="hive").to_table(
            columns=["start_ns", "correlation_id", "name"]
        )
        assert table.num_rows == KERNELS
        assert pc.count_distinct(table["correlation_id"]).as_py() == KERNELS  # each kernel once
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(30)
        subprocess.run(["umount", "-l", str(lake)], capture_output=True, check=False)
