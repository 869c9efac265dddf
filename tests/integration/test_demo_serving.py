"""The demo has LLM serving data with no GPU, no server and no upstream (issue 17).

``aaco agent --config examples/demo.yaml`` runs as the README says, with only its ports moved to free
ones (metrics, the receiver's two, and the ``llm_requests`` source's endpoint with them) and no OTLP
endpoint in the environment: the receiver reads the demo's request spans into the serving metrics,
forwards nothing, and counts what it did not forward.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.conftest import ROOT, get_free_port
from tests.integration.helpers import demo_on_free_ports, http_get, metric_value, wait_for

pytestmark = pytest.mark.integration


def test_the_demo_has_serving_metrics_without_an_upstream(tmp_path, aaco_bin):
    port = get_free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    config = str(demo_on_free_ports(tmp_path / "demo.yaml"))
    cmd = [aaco_bin, "agent", "--config", config, "--metrics-port", str(port), "--lake", str(tmp_path / "lake")]
    log = tmp_path / "agent.log"
    with open(log, "w") as out:
        agent = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
    try:

        def served() -> str | None:
            status, text = http_get(f"http://127.0.0.1:{port}/metrics")
            count = metric_value(text, "aaco_llm_time_to_first_token_seconds_count") if status == 200 else None
            return text if count else None

        text = wait_for(served, 90, interval=0.5, what="aaco_llm_time_to_first_token_seconds_count > 0")
        assert metric_value(text, "aaco_receiver_items_rejected_total", signal="traces", reason="no_upstream")
        assert metric_value(text, "aaco_llm_requests_total") is not None
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(30)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(10)
    assert "receiver on without upstream for traces, metrics, logs" in log.read_text()
