"""Slurm jobs on GPU series end to end: ``aaco agent`` reading a real nvidia-smi capture (an H100)
with dcgm-exporter's job mapping directory beside it, as a Slurm prolog writes it; /metrics shows
the GPU's series with the job's labels, the lake's telemetry rows carry them as attributes and
``aaco fleet jobs`` lists the jobs from them."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from tests.conftest import ROOT

from .helpers import http_get, metric_value, read_lake, run_aaco, start_aaco, wait_for

pytestmark = pytest.mark.integration

H100 = ROOT / "examples" / "data" / "nvidia-smi" / "h100-sxm5-v13.xml.gz"
UUID = "GPU-dab60736-6049-d541-3661-0407a2d7284c"


def test_agent_labels_gpu_series_with_the_slurm_jobs_of_a_mapping_directory(
    tmp_path: Path, aaco_bin: str, free_port: int
):
    jobs = tmp_path / "dcgm-job-map"
    jobs.mkdir()
    (jobs / "0").write_text("81234\n81230\n")  # two jobs sharing GPU 0
    (jobs / "1").write_text("999\n")  # a GPU this node does not have
    lake = tmp_path / "lake"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"""
node: slurm-node-1
sources:
  - type: smi
    backend: file
    file: {H100}
    interval_s: 0.2
    kubelet_socket: null
    slurm_job_mapping_dir: {jobs}
    slurm_refresh_s: 0.2
exporters:
  prometheus: {{port: {free_port}}}
  lake: {{path: {lake}, flush_interval_s: 0.5}}
pipeline: {{snapshot_interval_s: 0.2}}
"""
    )
    proc = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=tmp_path / "agent.log")
    try:
        url = f"http://127.0.0.1:{free_port}/metrics"

        def scraped(want: str) -> str | None:
            status, body = http_get(url)
            return body if status == 200 and want in body else None

        body = wait_for(lambda: scraped('job="slurm-81230,slurm-81234"'), timeout=60, what="job labels")
        gpu = {"node": "slurm-node-1", "gpu": "0", "gpu_uuid": UUID}
        assert metric_value(body, "aaco_gpu_power_watts", job="slurm-81230,slurm-81234", **gpu) == 79.73
        assert metric_value(body, "aaco_gpu_up", job="slurm-81230,slurm-81234", **gpu) == 1.0
        assert "slurm-999" not in body
        (jobs / "0").write_text("81240\n")  # the next job's prolog
        body = wait_for(lambda: scraped('job="slurm-81240"'), timeout=60, what="the next job's label")
        assert metric_value(body, "aaco_gpu_power_watts", job="slurm-81240", **gpu) == 79.73
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, (tmp_path / "agent.log").read_text()[-3000:]
    rows = [r for r in read_lake(lake, "telemetry").to_pylist() if r["metric"] == "hw.power"]
    names = {dict(r["attributes"]).get("aaco.job.name") for r in rows}
    assert {"slurm-81230,slurm-81234", "slurm-81240"} <= names
    fleet = run_aaco(aaco_bin, "fleet", "jobs", "--lake", str(lake), "--json")
    assert fleet.returncode == 0, fleet.stderr
    slurm = {j["job"]: j for j in json.loads(fleet.stdout)["slurm_jobs"]}
    assert {"slurm-81230", "slurm-81234", "slurm-81240"} <= set(slurm)
    assert slurm["slurm-81240"]["gpus"] == ["slurm-node-1:0"] and slurm["slurm-81240"]["power_w"] == 79.73
    text = run_aaco(aaco_bin, "fleet", "jobs", "--lake", str(lake))
    assert text.returncode == 0 and "Slurm jobs on GPUs" in text.stdout and "slurm-81240" in text.stdout
