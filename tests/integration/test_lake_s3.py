"""The lake shipped to a real S3 store (SeaweedFS on loopback): exactly once through kill -9 and outages.

Issue 16's acceptance: three nodes replay different real samples into one ``s3://`` lake, one killed
-9 while it uploads and run again, and the lake holds each node's events exactly once (row counts of
local replays, no duplicate by start, end, correlation id and name); the agent with a store stopped
for 30 s loses and repeats nothing, and shows its backlog and failures on /metrics.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest
import yaml

from tests.conftest import get_free_port

from .helpers import http_get, metric_value, run_aaco, wait_for

pytestmark = pytest.mark.integration

NODES = {
    "gpu-a": ["kineto/a100_alexnet_trace.json.gz"],
    "gpu-b": [
        "kineto-hta/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
        "kineto-hta/trace_diff_test_test.json.gz",
    ],
    "gpu-c": ["rocprofv3/kernel_trace.csv"],
}
KILLED = "gpu-b"  # replays its first sample, then is killed -9 while the second one's parts upload
KEY = ["start_ns", "end_ns", "correlation_id", "name"]


def node_env(seaweed, spool: Path, node: str) -> dict[str, str]:
    return {**seaweed.env, "AACO_NODE": node, "AACO_EXPORTERS_LAKE_PATH": str(spool)}


def remote_table(seaweed, url: str, kind: str, node: str | None = None) -> pa.Table | None:
    fs = seaweed.filesystem()
    base = url.removeprefix("s3://").rstrip("/") + f"/{kind}"
    if fs.get_file_info(base).type == pafs.FileType.NotFound:
        return None
    table = ds.dataset(base, filesystem=fs, format="parquet", partitioning="hive").to_table()
    return table.filter(pc.equal(table["node"], node)) if node is not None else table


def local_table(lake: Path, kind: str) -> pa.Table | None:
    return ds.dataset(lake / kind, format="parquet", partitioning="hive").to_table() if (lake / kind).is_dir() else None


def rows(table: pa.Table | None) -> int:
    return 0 if table is None else table.num_rows


def distinct_keys(table: pa.Table) -> int:
    return table.group_by(KEY).aggregate([]).num_rows


def shipped_marks(spool: Path) -> dict[str, int]:
    try:
        return json.loads((spool / "checkpoints" / "shipped.json").read_text())["marks"]
    except (OSError, ValueError, KeyError):
        return {}


def sealed_parts(spool: Path) -> int:
    return sum(1 for _ in spool.glob("*/date=*/node=*/part-*.parquet"))


@contextmanager
def frozen(seaweed) -> Iterator[None]:
    """The store stopped with SIGSTOP: connections are accepted and no request is answered (a stalled store)."""
    assert seaweed.proc is not None
    os.kill(seaweed.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(seaweed.proc.pid, signal.SIGCONT)


def test_three_nodes_ship_one_lake_exactly_once_through_a_kill_9(tmp_path, aaco_bin, samples, seaweed, s3_lake_url):
    url = s3_lake_url
    alone = {node: tmp_path / f"alone-{node}" for node in NODES}

    def replay_alone(node: str) -> subprocess.CompletedProcess[str]:
        paths = [str(samples / f) for f in NODES[node]]
        return run_aaco(aaco_bin, "replay", *paths, "--out", str(alone[node]), env={"AACO_NODE": node})

    with ThreadPoolExecutor(max_workers=1) as pool:  # the replays into the nodes' own lakes, beside the shipping
        local = pool.map(replay_alone, NODES)
        for node, files in NODES.items():
            env = node_env(seaweed, tmp_path / node, node)
            proc = run_aaco(aaco_bin, "replay", str(samples / files[0]), "--out", url, env=env)
            assert proc.returncode == 0, proc.stderr
        for proc in local:
            assert proc.returncode == 0, proc.stderr

    # The killed node's second sample: the store is frozen (SIGSTOP) so that its uploads hang in flight,
    # the replay is killed -9 once its parts are sealed, the store resumes, and the same command runs again.
    spool = tmp_path / KILLED
    args = [aaco_bin, "replay", str(samples / NODES[KILLED][1]), "--out", url, "--node", KILLED]
    env = {**os.environ, **node_env(seaweed, spool, KILLED)}
    before = sealed_parts(spool)
    assert before == sum(m + 1 for m in shipped_marks(spool).values()) > 0  # the first sample shipped whole
    with frozen(seaweed):
        victim = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: sealed_parts(spool) > before or victim.poll() is not None, timeout=120, what="parts sealed")
        time.sleep(0.5)  # the shipper is woken by the commit: its upload is now waiting on the frozen store
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
    assert victim.returncode == -signal.SIGKILL, "the replay ended before the kill"
    assert sum(m + 1 for m in shipped_marks(spool).values()) == before, "a part shipped to a frozen store"
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert again.returncode == 0, again.stderr
    assert sum(m + 1 for m in shipped_marks(spool).values()) == sealed_parts(spool) > before

    for node in NODES:
        for kind in ("kernels", "iterations"):
            own, got = local_table(alone[node], kind), remote_table(seaweed, url, kind, node)
            assert rows(got) == rows(own), (node, kind)
            if kind == "kernels":
                assert got.num_rows > 0 and distinct_keys(got) == distinct_keys(own), node  # nothing twice or missing
    proc = run_aaco(aaco_bin, "fleet", "summary", "--lake", url, "--json", env=seaweed.env)
    assert proc.returncode == 0, proc.stderr
    doc = {n["node"]: n for n in json.loads(proc.stdout)["nodes"]}
    for node in NODES:
        assert doc[node]["kernels"] == rows(local_table(alone[node], "kernels"))
        assert doc[node]["iterations"] == rows(local_table(alone[node], "iterations"))


def agent_config(path: Path, spool_dir: Path, lake: Path, url: str, port: int) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "node": "gpu-outage",
                "sources": [{"type": "trace_dir", "path": str(spool_dir), "poll_interval_s": 0.1, "settle_s": 0.3}],
                "exporters": {
                    "prometheus": {"enabled": True, "port": port},
                    "lake": {
                        "path": str(lake),
                        "remote": url,
                        "flush_interval_s": 0.3,
                        "upload": {"interval_s": 0.3, "retry_initial_s": 0.2, "retry_max_s": 2.0},
                    },
                },
                "pipeline": {"snapshot_interval_s": 0.5},
            }
        )
    )
    return path


def test_a_store_down_for_30_s_loses_and_repeats_nothing(tmp_path, aaco_bin, samples, seaweed, s3_lake_url):
    url = s3_lake_url
    spool_dir, lake = tmp_path / "spool", tmp_path / "lake"
    spool_dir.mkdir()
    port = get_free_port()
    cfg = agent_config(tmp_path / "agent.yaml", spool_dir, lake, url, port)
    log = tmp_path / "agent.log"
    with log.open("wb") as out:
        agent = subprocess.Popen(
            [aaco_bin, "agent", "--config", str(cfg)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, **seaweed.env},
        )
    base = f"http://127.0.0.1:{port}"

    def metric(name: str) -> float:
        status, text = http_get(base + "/metrics")
        return (metric_value(text, name) or 0.0) if status == 200 else -1.0

    try:
        wait_for(lambda: metric("aaco_lake_upload_parts_total") >= 1, timeout=60, what="the versions row shipped")
        (spool_dir / "a.json.gz").write_bytes((samples / NODES["gpu-a"][0]).read_bytes())
        wait_for(lambda: metric("aaco_lake_upload_backlog_parts") == 0 and (lake / "kernels").is_dir(), timeout=60)
        seaweed.stop()
        down_at = time.monotonic()
        (spool_dir / "b.csv").write_bytes((samples / NODES["gpu-c"][0]).read_bytes())
        wait_for(lambda: metric("aaco_lake_upload_backlog_parts") >= 1, timeout=30, what="a backlog while down")
        wait_for(lambda: metric("aaco_lake_upload_failures_total") >= 2, timeout=30, what="failures counted")
        time.sleep(max(0.0, 30 - (time.monotonic() - down_at)))
        seaweed.start()
        wait_for(lambda: metric("aaco_lake_upload_backlog_parts") == 0, timeout=90, what="the backlog shipped")
        assert metric("aaco_lake_upload_dropped_parts_total") == 0
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(60)
    assert agent.returncode == 0, log.read_text()[-3000:]
    for kind in ("kernels", "iterations"):
        own, got = local_table(lake, kind), remote_table(seaweed, url, kind)
        assert rows(got) == rows(own), kind
        if kind == "kernels":
            assert distinct_keys(got) == distinct_keys(own) and got.num_rows > 0
