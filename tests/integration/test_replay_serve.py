"""`aaco replay --serve`: /healthz, /metrics with aaco_ series, SIGTERM flushes the lake and exits 0."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from .helpers import http_get, metric_value, read_lake, start_aaco, wait_for

pytestmark = pytest.mark.integration


def test_replay_serve_scrape_and_sigterm(tmp_path, aaco_bin, samples, free_port):
    trace = samples / "kineto" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    out = tmp_path / "D"
    log = tmp_path / "agent.log"
    proc = start_aaco(
        aaco_bin,
        *("replay", str(trace), "--out", str(out), "--serve", "--metrics-port", str(free_port)),
        log=log,
        env={"AACO_PIPELINE_SNAPSHOT_INTERVAL_S": "0.5"},  # the analyzers' first results sooner than the default 5 s
    )
    base = f"http://127.0.0.1:{free_port}"
    try:
        wait_for(lambda: http_get(base + "/healthz")[0] == 200, 60, what="/healthz")
        wait_for(lambda: http_get(base + "/readyz")[0] == 200, 10, what="/readyz")

        def scraped():
            status, body = http_get(base + "/metrics")
            return body if status == 200 and "aaco_kernels_per_iteration" in body else None

        body = wait_for(scraped, 60, what="analyzer metrics on /metrics")
        assert metric_value(body, "aaco_kernels_total", kind="kernel") == 14
        assert metric_value(body, "aaco_kernels_total", kind="memcpy") == 2
        assert metric_value(body, "aaco_iteration_latency_seconds_count") == 2
        assert metric_value(body, "aaco_events_received_total", component="bus") == 18
        assert metric_value(body, "aaco_queue_capacity", queue="bus") > 0
        assert metric_value(body, "aaco_agent_info") == 1
        # OpenMetrics when asked, with an exemplar carrying a trace id
        status, om = http_get(base + "/metrics", accept="application/openmetrics-text; version=1.0.0")
        assert status == 200 and "# EOF" in om and 'trace_id="' in om
        assert http_get(base + "/nope")[0] == 404

        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=15)
        assert rc == 0, log.read_text()
        assert time.monotonic() - t0 < 15
    finally:
        if proc.poll() is None:
            proc.kill()
    kernels = read_lake(out, "kernels")
    assert kernels.num_rows == 16
    assert read_lake(out, "iterations").num_rows == 2
    doc = json.loads((out / "analysis.json").read_text())
    assert doc["kar"]["models"]["mi250_minitoy_train_ROCm6_2_kineto"]["kernels_per_iteration"] == 7
    assert http_get(base + "/healthz")[0] == 0  # the server is gone
    assert "Traceback" not in log.read_text()


def test_sigint_also_flushes(tmp_path, aaco_bin, samples, free_port):
    trace = samples / "kineto" / "a100_alexnet_trace.json.gz"
    out = tmp_path / "D"
    proc = start_aaco(aaco_bin, "replay", str(trace), "--out", str(out), "--serve", "--metrics-port", str(free_port))
    try:
        wait_for(
            lambda: "aaco_kernels_total" in http_get(f"http://127.0.0.1:{free_port}/metrics")[1], 60, what="metrics"
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert read_lake(out, "kernels").num_rows == 79 + 16 + 3


def test_replay_without_serve_exits_by_itself(tmp_path, aaco_bin, samples):
    out = tmp_path / "D"
    proc = subprocess.run(
        [aaco_bin, "replay", str(samples / "kineto"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert read_lake(out, "kernels").num_rows == 14 + 2 + 79 + 16 + 3
