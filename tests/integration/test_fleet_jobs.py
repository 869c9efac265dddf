"""``aaco fleet jobs`` (issue 28, items 6 and 7): three nodes' lakes holding the ranks of jobs give one lake's answer.

Real rank traces, replayed by three nodes (``aaco replay --node N --out lakes/N``) and all of them by
one node into one lake:

- HTA's two ranks of a 128-rank job (``tests/data/kineto-multirank``), rank 0 on gpu-a, rank 1 on gpu-b;
- single ranks of four other real jobs (``examples/data/kineto-hta``): ``nccl_parser_config_nccl_data``
  (rank 0 of 2, 2024) on gpu-a, ``trace_diff_test_test`` (rank 1 of 2, 2022) on gpu-b,
  ``trace_diff_control_control`` (rank 3 of 8) and ``negative_queue_length_values_check_rank0``
  (rank 0 of 16) on gpu-c: one backend and world size, two jobs stay two;
- an 8-rank job made from the two real ranks (``tests/support/rank_copies.py``: rank r is real rank
  r % 2 with its ``distributedInfo`` rewritten, nothing else), ranks 0-2 on gpu-a, 3-5 on gpu-b, 6-7
  on gpu-c.

The answers are equal but for where the ranks were (``nodes``, each rank's ``node``). Each rank's
figures are its node's own analyzer's (``analysis.json``), the 8-rank job's HTA 0.5.0's (run on the
same 8 files), the bus bandwidth the rows' by hand (``contract.jobs.bus_bandwidth``), and the
per-job analysis run as one task per job on a Dask ``LocalCluster`` equals DuckDB's in process.
"""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from aaco.contract.jobs import bus_bandwidth
from tests.conftest import ROOT, skip_or_fail
from tests.support.rank_copies import write_rank_copies
from tests.support.terminal import run_in_terminal

from .helpers import run_aaco, run_aaco_each

pytestmark = [pytest.mark.integration, pytest.mark.filterwarnings("ignore:The inplace keyword")]

MULTIRANK = ROOT / "tests" / "data" / "kineto-multirank"
HTA_DATA = ROOT / "examples" / "data" / "kineto-hta"
REAL = {
    "gpu-a": [MULTIRANK / "trace_filter_sampled_rank-0.json.gz", HTA_DATA / "nccl_parser_config_nccl_data.json.gz"],
    "gpu-b": [MULTIRANK / "trace_filter_sampled_rank-1.json.gz", HTA_DATA / "trace_diff_test_test.json.gz"],
    "gpu-c": [
        HTA_DATA / "trace_diff_control_control.json.gz",
        HTA_DATA / "negative_queue_length_values_check_rank0.json.gz",
    ],
}
COPIES = {"gpu-a": range(0, 3), "gpu-b": range(3, 6), "gpu-c": range(6, 8)}
JOB128 = "nccl-128x-2023-04-28T23:51:38Z"
JOB8 = "nccl-8x-2023-04-28T23:51:38Z"  # the copies keep the real ranks' times
NCCL2 = "nccl-2x-2024-05-23T00:15:22Z"  # nccl_parser_config_nccl_data's steps


@pytest.fixture(scope="module")
def lakes(tmp_path_factory: pytest.TempPathFactory, aaco_bin: str) -> dict[str, Path]:
    """``split``: a folder of three nodes' lakes; ``one``: one lake of every rank; each node's lake by name."""
    root = tmp_path_factory.mktemp("fleet-jobs")
    ranks = write_rank_copies(root / "ranks", 8)
    files = {node: [*REAL[node], *(ranks[r] for r in COPIES[node])] for node in REAL}
    every = [f for node in REAL for f in files[node]]
    out = {node: root / "lakes" / node for node in REAL}
    commands = [
        ("replay", *map(str, files[node]), "--node", node, "--out", str(out[node]), "--no-progress") for node in REAL
    ]
    commands.append(("replay", *map(str, every), "--node", "all", "--out", str(root / "one"), "--no-progress"))
    for proc in run_aaco_each(aaco_bin, *commands):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return {"split": root / "lakes", "one": root / "one", "ranks": root / "ranks", **out}


def fleet_jobs(aaco_bin: str, lake: Path, *args: str) -> dict:
    proc = run_aaco(aaco_bin, "fleet", "jobs", "--lake", str(lake), "--json", *args)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def without_nodes(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    for job in doc["jobs"]:
        del job["nodes"]
        for r in job["ranks"]:
            del r["node"]
    return doc


@pytest.fixture(scope="module")
def answers(lakes: dict[str, Path], aaco_bin: str) -> tuple[dict, dict]:
    return fleet_jobs(aaco_bin, lakes["split"]), fleet_jobs(aaco_bin, lakes["one"])


def by_job(doc: dict) -> dict[str, dict]:
    return {j["job"]: j for j in doc["jobs"]}


def test_three_nodes_lakes_give_one_lakes_answer(answers):
    split, one = answers
    assert without_nodes(split) == without_nodes(one)
    jobs = by_job(split)
    others = ["nccl-2x-2022-08-31T09:34:26Z", "nccl-8x-2022-08-22T21:24:22Z", "nccl-16x-2023-05-08T16:55:01Z"]
    assert sorted(jobs) == sorted([JOB128, JOB8, NCCL2, *others])
    assert jobs[JOB128]["nodes"] == ["gpu-a", "gpu-b"] and by_job(one)[JOB128]["nodes"] == ["all"]
    assert [(r["rank"], r["node"]) for r in jobs[JOB128]["ranks"]] == [(0, "gpu-a"), (1, "gpu-b")]
    assert jobs[JOB8]["nodes"] == ["gpu-a", "gpu-b", "gpu-c"]
    assert [r["node"] for r in jobs[JOB8]["ranks"]] == ["gpu-a"] * 3 + ["gpu-b"] * 3 + ["gpu-c"] * 2
    assert (jobs[JOB8]["world_size"], jobs[JOB8]["backend"]) == (8, "nccl")
    # one backend and world size, two jobs (2022 and 2024), each the one rank the lakes hold
    assert [r["rank"] for r in jobs[NCCL2]["ranks"]] == [0]
    assert [r["rank"] for r in jobs["nccl-2x-2022-08-31T09:34:26Z"]["ranks"]] == [1]
    for job in split["jobs"]:
        assert set(job) >= {"job", "world_size", "backend", "ranks", "stragglers", "collectives"}
        for r in job["ranks"]:
            assert set(r) >= {"rank", "node", "idle_pct", "compute_pct", "non_compute_pct", "comm_comp_overlap_pct"}
            assert 0 <= r["idle_pct"] <= 100 and 0 <= r["compute_pct"] <= 100
            assert 0 < r["step_p50_s"] <= r["step_p95_s"]


def test_each_ranks_figures_are_its_nodes_own_analyzers(lakes, answers):
    """The node's analyzer and the fleet agree by construction: the same analyzer, fed the lake's rows."""
    split, one = answers
    fleet = {(j["job"], r["rank"]): r for j in split["jobs"] for r in j["ranks"]}
    seen = 0
    for node in REAL:
        own = json.loads((lakes[node] / "analysis.json").read_text())["jobs"]["jobs"]
        for job in own:
            for r in job["ranks"]:
                ours = fleet[(job["job"], r["rank"])]
                assert ours["node"] == node
                assert ours["idle_pct"] == r["idle_time_pctg"] and ours["compute_pct"] == r["compute_time_pctg"]
                assert ours["non_compute_pct"] == r["non_compute_time_pctg"]
                assert ours["comm_comp_overlap_pct"] == r["comp_comm_overlap_pctg"]
                assert ours["step_p50_s"] == pytest.approx(r["step_p50_s"], rel=1e-12)
                seen += 1
    assert seen == len(fleet) == 2 + 8 + 4
    # the node that held every rank named the stragglers the fleet names
    own = {j["job"]: j for j in json.loads((lakes["one"] / "analysis.json").read_text())["jobs"]["jobs"]}
    for job in one["jobs"]:
        found = own[job["job"]]["stragglers"]
        assert job["stragglers"] == (found["stragglers"] if found else [])


def test_the_8_rank_job_is_htas(lakes, answers):
    """HTA 0.5.0 on the same 8 files: temporal breakdown, overlap (HTA's two decimals) and stragglers."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as e:  # pragma: no cover - depends on the environment
        skip_or_fail(f"holistictraceanalysis is not installed ({e}); bash .ci/setup --test installs it")
    logging.getLogger("hta").setLevel(logging.WARNING)
    hta = TraceAnalysis(trace_dir=str(lakes["ranks"]))
    breakdown = hta.get_temporal_breakdown(visualize=False).set_index("rank")
    overlap = hta.get_comm_comp_overlap(visualize=False).set_index("rank")["comp_comm_overlap_pctg"]
    job = by_job(answers[0])[JOB8]
    assert [r["rank"] for r in job["ranks"]] == sorted(breakdown.index) == list(range(8))
    for r in job["ranks"]:
        for key, col in (("idle_pct", "idle"), ("compute_pct", "compute"), ("non_compute_pct", "non_compute")):
            assert round(r[key], 2) == pytest.approx(float(breakdown.loc[r["rank"], f"{col}_time_pctg"]))
        assert round(r["comm_comp_overlap_pct"], 2) == pytest.approx(float(overlap.loc[r["rank"]]))
    assert sorted(job["stragglers"]) == sorted(hta.get_potential_stragglers(visualize=False))


def test_bus_bandwidth_by_hand(lakes, answers):
    """nccl_parser_config_nccl_data's collectives: per op, the bus bytes of the rows over their kernel time."""
    job = by_job(answers[0])[NCCL2]
    kernels = ds.dataset(lakes["gpu-a"] / "kernels", format="parquet", partitioning="hive").to_table()
    rows = kernels.filter(pc.and_(pc.equal(kernels.column("job"), NCCL2), kernels.column("collective").is_valid()))
    assert rows.num_rows == 21
    got = {c["op"]: c for c in job["collectives"]}
    assert {op: c["count"] for op, c in got.items()} == {"all_reduce": 15, "broadcast": 6}
    for op in ("all_reduce", "broadcast"):
        mine = [r for r in rows.to_pylist() if r["collective"] == op]
        ns = [r["end_ns"] - r["start_ns"] for r in mine]
        assert got[op]["time_s"] == pytest.approx(sum(ns) / 1e9, rel=1e-12)
        # every one of them lies in a step and states its size: the bytes each moved over the bus
        # (bus bandwidth x its time) over their summed time, in GB/s
        moved = sum(
            bus_bandwidth(op, r["collective_bytes"], t, r["collective_group_size"]) * t / 1e9
            for r, t in zip(mine, ns, strict=True)
        )
        assert all(r["iteration"] is not None and r["collective_group_size"] == 2 for r in mine)
        assert got[op]["bus_bandwidth_gbps"] == pytest.approx(moved / (sum(ns) / 1e9) / 1e9, rel=1e-9)
    # HTA's 2023 ranks launch their NCCL kernels with no sizes: counted and timed, no bandwidth
    (send_recv,) = by_job(answers[0])[JOB128]["collectives"]
    assert send_recv["op"] == "send_recv" and send_recv["count"] == 20 and send_recv["bus_bandwidth_gbps"] is None


def test_critical_path_shares_are_the_lakes_paths(lakes, answers):
    """Each rank's critical path: the cp_* columns of its steps in the lake, summed by hand."""
    rows = ds.dataset(lakes["one"] / "iterations", format="parquet", partitioning="hive").to_table().to_pylist()
    bounds = ("cpu", "compute", "comm", "launch", "gap")
    paths = {}
    for job in answers[1]["jobs"]:
        for r in job["ranks"]:
            mine = [x for x in rows if (x["job"], x["rank"]) == (job["job"], r["rank"]) and x["cp_length_ns"]]
            paths[(job["job"], r["rank"])] = len(mine)
            cp = r["critical_path"]
            if not mine:
                assert cp is None
                continue
            length = sum(x["cp_length_ns"] for x in mine)
            assert cp["steps"] == len(mine)
            for bound in bounds:
                assert cp[f"{bound}_pct"] == pytest.approx(100 * sum(x[f"cp_{bound}_ns"] for x in mine) / length)
            assert sum(cp[f"{b}_pct"] for b in bounds) == pytest.approx(100)
    # the ranks of distributed jobs have paths (critical_path: ranks, the default)
    assert paths[(JOB128, 0)] > 0 and paths[(JOB128, 1)] > 0 and all(paths[(JOB8, r)] > 0 for r in range(8))
    assert without_nodes(answers[0]) == without_nodes(answers[1])


def test_since_leaves_the_old_traces_out(lakes, aaco_bin):
    assert fleet_jobs(aaco_bin, lakes["split"], "--since", "1h") == {"jobs": [], "slurm_jobs": []}
    proc = run_aaco(aaco_bin, "fleet", "jobs", "--lake", str(lakes["split"]), "--since", "1h")
    assert proc.returncode == 0 and "no distributed job in the lake" in proc.stdout + proc.stderr


@pytest.mark.parametrize("columns", [80, 120])
def test_the_tables_at_a_terminal(lakes, aaco_bin, answers, columns):
    """Per job a heading and its tables; nothing wider than the terminal, job names and numbers whole."""
    run = run_in_terminal([aaco_bin, "fleet", "jobs", "--lake", str(lakes["split"])], columns=columns)
    assert run.returncode == 0 and "Traceback" not in run.raw, run.describe()
    assert run.wide_lines() == [], run.describe()
    text = run.text
    for job in answers[0]["jobs"]:
        assert f"job {job['job']}:" in text, run.describe()
    assert "stragglers: 1, 3" in text  # the 8-rank job's, as HTA names them
    with_paths = [j for j in answers[0]["jobs"] if any(r["critical_path"] for r in j["ranks"])]
    assert text.count("critical path (HTA)") == len(with_paths) >= 3
    assert "6.55839" in text  # nccl_parser_config_nccl_data's all_reduce bus bandwidth, GB/s


def test_one_task_per_job_on_a_dask_cluster_agrees_with_duckdb(lakes, answers):
    try:
        import distributed
    except ImportError as exc:
        skip_or_fail(f"Dask is not installed ({exc}): pip install -e '.[dev]' (dask[dataframe], distributed)")
    from aaco.agent.fleet import jobs
    from aaco.agent.fleet.lake import FleetLake

    url = str(lakes["split"])
    with FleetLake.open(url).connect() as con:
        plan = jobs.plan(con)
    assert len(plan) == len(answers[0]["jobs"])
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        workers = set(client.scheduler_info()["workers"])
        with distributed.get_task_stream(client) as stream:
            futures = client.map(jobs.analyze_at, [url] * len(plan), [None] * len(plan), plan, pure=False)
            got = client.gather(futures)
    assert len(stream.data) == len(plan) and {t["worker"] for t in stream.data} <= workers
    assert {"jobs": got, "slurm_jobs": []} == answers[0]
