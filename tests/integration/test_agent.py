"""`aaco agent`: the long-running daemon with an ORT workload, SIGHUP reload, SIGTERM flush."""

from __future__ import annotations

import json
import signal
import time

import pytest
import yaml

from .helpers import http_get, metric_value, read_lake, start_aaco, wait_for

pytestmark = pytest.mark.integration


def write_config(path, lake, port, sources):
    path.write_text(
        yaml.safe_dump(
            {
                "node": "test-node",
                "sources": sources,
                "exporters": {"prometheus": {"port": port}, "lake": {"path": str(lake), "flush_interval_s": 1}},
                "pipeline": {"snapshot_interval_s": 1},
            }
        )
    )


def test_agent_runs_reloads_and_flushes(tmp_path, aaco_bin, samples, free_port):
    lake = tmp_path / "lake"
    cfg = tmp_path / "agent.yaml"
    ort = {"type": "ort", "iterations": 5, "warmup": 1, "interval_s": 0.5}
    write_config(cfg, lake, free_port, [ort])
    log = tmp_path / "agent.log"
    proc = start_aaco(aaco_bin, "agent", "--config", str(cfg), "--log-level", "info", log=log)
    base = f"http://127.0.0.1:{free_port}"
    try:
        wait_for(lambda: http_get(base + "/readyz")[0] == 200, 60, what="/readyz")

        def kar():
            body = http_get(base + "/metrics")[1]
            return metric_value(body, "aaco_kar_ratio", model="light_resnet50", node="test-node")

        assert wait_for(kar, 90, what="KAR on /metrics") > 0
        # the workload keeps cycling: more than one cycle of iterations shows up
        wait_for(
            lambda: (
                (
                    metric_value(
                        http_get(base + "/metrics")[1], "aaco_iteration_latency_seconds_count", model="light_resnet50"
                    )
                    or 0
                )
                >= 10
            ),
            90,
            what="a second cycle",
        )

        # SIGHUP: add a replay source; the ORT source is unchanged and keeps running
        write_config(
            cfg,
            lake,
            free_port,
            [ort, {"type": "replay", "paths": [str(samples / "kineto" / "a100_alexnet_trace.json.gz")]}],
        )
        proc.send_signal(signal.SIGHUP)
        wait_for(
            lambda: metric_value(http_get(base + "/metrics")[1], "aaco_kernels_total", kind="memset") == 3,
            60,
            what="the replayed trace after SIGHUP",
        )

        # SIGHUP with a broken file: logged, the running configuration is kept
        cfg.write_text("sources: [{type: nope}]\n")
        proc.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert proc.poll() is None
        assert http_get(base + "/healthz")[0] == 200

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    assert "configuration not reloaded" in text and "nope" in text
    assert "Traceback" not in text
    iterations = read_lake(lake, "iterations")
    kernels = read_lake(lake, "kernels")
    assert iterations.num_rows >= 10
    assert set(iterations.column("node").to_pylist()) == {"test-node"}
    memsets = [k for k in kernels.column("kind").to_pylist() if k == "memset"]
    assert len(memsets) == 3  # the replay ran exactly once, not again after the failed reload
    doc = json.loads((lake / "analysis.json").read_text())
    assert doc["node"] == "test-node" and doc["kar"]["value"] > 0


def test_agent_flag_overrides_and_env(tmp_path, aaco_bin, samples, free_port):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "sources": [{"type": "replay", "paths": [str(samples / "kineto")]}],
                "exporters": {"prometheus": {"port": 1}, "lake": {"path": "/nonexistent/x"}},
            }
        )
    )
    lake = tmp_path / "lake"
    proc = start_aaco(
        aaco_bin,
        "agent",
        "--config",
        str(cfg),
        "--metrics-port",
        str(free_port),
        "--lake",
        str(lake),
        env={"AACO_NODE": "from-env"},
    )
    try:
        body = wait_for(lambda: http_get(f"http://127.0.0.1:{free_port}/metrics")[1] or None, 60, what="metrics")
        assert 'node="from-env"' in body
        wait_for(
            lambda: (
                (metric_value(http_get(f"http://127.0.0.1:{free_port}/metrics")[1], "aaco_source_files_total") or 0)
                == 2
            ),
            60,
            what="both files replayed",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert read_lake(lake, "kernels").num_rows == 114
