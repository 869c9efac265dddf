"""Holistic Trace Analysis 0.5.0 and AACO, per rank, on HTA's two ranks of a 128-rank NCCL job.

HTA runs for real on copies of ``tests/data/kineto-multirank/trace_filter_sampled_rank-{0,1}``
named as it expects (``rank-0.json.gz``, ``rank-1.json.gz``); AACO replays the same two files
together (``aaco replay``: the ingest names their job from the traces' ``distributedInfo``) and its
``analysis.json`` is compared: the temporal breakdown in HTA's own microseconds exactly (so the
percentages within 0.1 point, HTA rounding them to two decimals), the communication/computation
overlap within 0.1 point, the straggler metric (normalised start of the chosen collective) and the
stragglers equal, with HTA's default of two candidates and with one. The same figures are on
/metrics while the replay serves.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import skip_or_fail

from .helpers import http_get, metric_value, start_aaco, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore:The inplace keyword")]

DATA = Path(__file__).resolve().parents[1] / "data" / "kineto-multirank"
RANKS = ("trace_filter_sampled_rank-0.json.gz", "trace_filter_sampled_rank-1.json.gz")


def _traces() -> list[Path]:
    return [DATA / name for name in RANKS]


@pytest.fixture(scope="module")
def hta(tmp_path_factory):
    """HTA's TraceAnalysis over both ranks."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as e:  # pragma: no cover - depends on the environment
        skip_or_fail(f"holistictraceanalysis is not installed ({e}); bash .ci/setup --test installs it")
    logging.getLogger("hta").setLevel(logging.WARNING)
    d = tmp_path_factory.mktemp("hta")
    for rank, src in enumerate(_traces()):
        shutil.copy(src, d / f"rank-{rank}.json.gz")
    return TraceAnalysis(trace_dir=str(d))


def _replay(aaco_bin: str, out: Path, **env: str) -> dict:
    proc = subprocess.run(
        [aaco_bin, "replay", *map(str, _traces()), "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [job] = json.loads((out / "analysis.json").read_text())["jobs"]["jobs"]
    return job


@pytest.fixture(scope="module")
def job(aaco_bin: str, tmp_path_factory) -> dict:
    """AACO's job: both ranks replayed into one lake."""
    return _replay(aaco_bin, tmp_path_factory.mktemp("lake"))


def test_one_job_of_two_ranks(job):
    assert job["world_size"] == 128 and job["backend"] == "nccl"
    assert job["job"].startswith("nccl-128x-")
    assert [r["rank"] for r in job["ranks"]] == [0, 1]


def test_temporal_breakdown_per_rank_is_htas(hta, job):
    theirs = hta.get_temporal_breakdown(visualize=False).set_index("rank")
    for ours in job["ranks"]:
        row = theirs.loc[ours["rank"]]
        for col in ("idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)"):
            assert ours[col.replace("(us)", "_us")] == int(row[col]), (ours["rank"], col)
        for col in ("idle_time_pctg", "compute_time_pctg", "non_compute_time_pctg"):
            assert abs(ours[col] - float(row[col])) <= 0.1, (ours["rank"], col, ours[col], float(row[col]))
            assert round(ours[col], 2) == pytest.approx(float(row[col]))


def test_comm_comp_overlap_per_rank_is_htas(hta, job):
    theirs = hta.get_comm_comp_overlap(visualize=False).set_index("rank")["comp_comm_overlap_pctg"]
    for ours in job["ranks"]:
        assert abs(ours["comp_comm_overlap_pctg"] - float(theirs.loc[ours["rank"]])) <= 0.1
        assert round(ours["comp_comm_overlap_pctg"], 2) == pytest.approx(float(theirs.loc[ours["rank"]]))


def test_straggler_metric_and_stragglers_are_htas(hta, job):
    import pandas as pd
    from hta.analyzers.straggler import _compute_normalized_start_time_of_significant_comm_kernels

    t = hta.t
    df = pd.concat([t.get_trace(r).assign(rank=r) for r in t.get_all_traces()])
    steps = hta.get_profiler_steps()
    metric, name = _compute_normalized_start_time_of_significant_comm_kernels(
        df[df["iteration"].isin(steps)], t.symbol_table
    )
    ours = job["stragglers"]
    assert ours["steps"] == steps == [551]  # HTA leaves out each rank's last step, 552
    assert ours["stream"] == int(metric["stream"].iloc[0])
    assert ours["kernel"] == t.symbol_table.get_sym_table()[int(metric["name"].iloc[0])]
    theirs = {(int(r), int(i)): float(v) for r, i, v in metric[["rank", "iteration", name]].itertuples(index=False)}
    assert {(m["rank"], m["step"]): m["value"] for m in ours["normalized_start"]} == pytest.approx(theirs)
    # Two ranks and two candidates: HTA names both.
    assert sorted(ours["stragglers"]) == sorted(hta.get_potential_stragglers(visualize=False)) == [0, 1]
    assert [r["straggler"] for r in job["ranks"]] == [True, True]


def test_one_candidate_is_htas_too(hta, aaco_bin, tmp_path):
    job = _replay(aaco_bin, tmp_path / "lake", AACO_ANALYZERS_JOBS_STRAGGLERS="1")
    theirs = hta.get_potential_stragglers(num_candidates=1, visualize=False)
    assert job["stragglers"]["stragglers"] == theirs == [1]
    assert [r["straggler"] for r in job["ranks"]] == [False, True]


def test_live_on_metrics(hta, aaco_bin, tmp_path, free_port):
    """While the replay serves: the job series, ratios 0..1 equal to HTA's shares, rank 1 the one straggler."""
    log = tmp_path / "agent.log"
    proc = start_aaco(
        aaco_bin,
        *("replay", *map(str, _traces()), "--out", str(tmp_path / "D"), "--no-progress"),
        *("--serve", "--metrics-port", str(free_port)),
        log=log,
        env={"AACO_PIPELINE_SNAPSHOT_INTERVAL_S": "0.5", "AACO_ANALYZERS_JOBS_STRAGGLERS": "1"},
    )
    try:

        def scraped():
            status, body = http_get(f"http://127.0.0.1:{free_port}/metrics")
            return body if status == 200 and 'aaco_job_straggler{job="nccl-128x-' in body else None

        body = wait_for(scraped, 60, what="job metrics on /metrics")
        breakdown = hta.get_temporal_breakdown(visualize=False).set_index("rank")
        overlap = hta.get_comm_comp_overlap(visualize=False).set_index("rank")["comp_comm_overlap_pctg"]
        for rank in (0, 1):
            r = str(rank)
            assert metric_value(body, "aaco_job_straggler", rank=r) == (1.0 if rank == 1 else 0.0)
            for state, col in (("idle", "idle_time"), ("compute", "compute_time"), ("non_compute", "non_compute_time")):
                value = metric_value(body, "aaco_job_time_ratio", rank=r, state=state)
                expected = breakdown.loc[rank, f"{col}(us)"] / breakdown.loc[rank, "kernel_time(us)"]
                assert value == pytest.approx(expected, abs=1e-9)
            assert metric_value(body, "aaco_job_comm_comp_overlap_ratio", rank=r) == pytest.approx(
                overlap.loc[rank] / 100, abs=0.001
            )
            assert metric_value(body, "aaco_job_step_seconds", rank=r) > 0
        assert metric_value(body, "aaco_job_rows_dropped_total", reason="max_jobs") == 0
        for line in body.splitlines():  # job and rank on the job series only
            if not line.startswith("#") and re.search(r'[{,](job|rank)="', line):
                assert line.startswith("aaco_job_"), line
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
