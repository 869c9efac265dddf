"""``aaco fleet jobs`` on lakes built in the test: a derived job name is derived again over every node's ranks.

Two nodes each held one rank of a 2-rank job whose ranks' first steps start either side of a second
boundary: each node, seeing one rank, named the job from it (10:00:00Z and 10:00:01Z); the fleet,
seeing both, names both ranks' rows by the earliest step, as one lake with both ranks would have.
A configured name is kept whatever its ranks overlap; a later window is another job.
"""

from __future__ import annotations

import calendar
from pathlib import Path

import pyarrow as pa
import pytest

from aaco.agent.fleet import jobs
from aaco.agent.fleet.lake import FleetLake
from aaco.contract.jobs import derived_name
from aaco.contract.schemas import SCHEMAS
from aaco.contract.versions import SCHEMA as VERSIONS

T0 = calendar.timegm((2025, 1, 1, 10, 0, 0)) * 10**9
MS = 10**6
COMPUTE = "void at::native::vectorized_elementwise_kernel<4>"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"


def rank_rows(node: str, job: str, rank: int, start: int, world: int = 2) -> tuple[list[dict], list[dict]]:
    """Three 100 ms steps of one rank from ``start``: per step a 40 ms compute kernel, then a 30 ms all_reduce."""
    ident = {"node": node, "job": job, "rank": rank, "world_size": world, "dist_backend": "nccl", "model": job}
    run = {"run_id": f"{node}-{rank}-{start}", "pid": 100 + rank}
    its, ks = [], []
    for step in range(3):
        s = start + step * 100 * MS
        its.append({**ident, **run, "start_ns": s, "end_ns": s + 100 * MS - 1, "iteration": step, "source": "t"})
        common = {**ident, **run, "tid": 1, "device": "0", "kind": "kernel", "source": "t", "iteration": step}
        ks.append({**common, "start_ns": s + MS, "end_ns": s + 41 * MS, "name": COMPUTE, "stream": 7})
        ks.append(
            {
                **common,
                "start_ns": s + 35 * MS,
                "end_ns": s + 65 * MS,
                "name": NCCL,
                "stream": 20,
                "launch_start_ns": s + 34 * MS,
                "collective": "all_reduce",
                "collective_bytes": 64 * 10**6,
                "collective_group_size": world,
            }
        )
    return its, ks


def fleet(*ranks: tuple[list[dict], list[dict]]) -> FleetLake:
    its = [r for i, _ in ranks for r in i]
    ks = [r for _, k in ranks for r in k]
    tables = {
        "iterations": pa.Table.from_pylist(its, schema=SCHEMAS["iterations"]),
        "kernels": pa.Table.from_pylist(ks, schema=SCHEMAS["kernels"]),
        "telemetry": SCHEMAS["telemetry"].empty_table(),
        "versions": VERSIONS.empty_table(),
    }
    return FleetLake(str(Path(".")), tables)


def answer(lake: FleetLake) -> dict:
    with lake.connect() as con:
        return jobs.jobs(con)


def test_is_derived_knows_the_form_for_its_backend_and_world():
    assert jobs.is_derived("nccl-128x-2023-04-28T23:51:38Z", "nccl", 128)
    assert jobs.is_derived("nccl-128x-2023-04-28T23:51:38Z", "NCCL", 128)
    assert not jobs.is_derived("nccl-128x-2023-04-28T23:51:38Z", "nccl", 64)  # another world
    assert not jobs.is_derived("nccl-128x-2023-04-28T23:51:38Z", "gloo", 128)
    assert not jobs.is_derived("pretrain-7b", "nccl", 128)
    assert not jobs.is_derived("nccl-128x-2023-04-28T23:51:38Z", None, None)


def test_a_job_each_node_named_apart_is_one_job_in_the_fleet():
    a_start, b_start = T0 + 900 * MS, T0 + 1100 * MS  # either side of 10:00:01
    named_a, named_b = derived_name("nccl", 2, a_start), derived_name("nccl", 2, b_start)
    assert (named_a, named_b) == ("nccl-2x-2025-01-01T10:00:00Z", "nccl-2x-2025-01-01T10:00:01Z")
    split = answer(fleet(rank_rows("gpu-a", named_a, 0, a_start), rank_rows("gpu-b", named_b, 1, b_start)))
    one = answer(fleet(rank_rows("all", named_a, 0, a_start), rank_rows("all", named_a, 1, b_start)))
    (job,) = split["jobs"]
    assert job["job"] == named_a and job["nodes"] == ["gpu-a", "gpu-b"]
    assert [(r["rank"], r["node"]) for r in job["ranks"]] == [(0, "gpu-a"), (1, "gpu-b")]
    for doc in (split, one):
        for j in doc["jobs"]:
            del j["nodes"]
            for r in j["ranks"]:
                del r["node"]
    assert split == one


def test_the_answer_is_the_analyzers_on_the_rows():
    start = T0 + 900 * MS
    name = derived_name("nccl", 2, start)
    (job,) = answer(fleet(rank_rows("gpu-a", name, 0, start), rank_rows("gpu-b", name, 1, start + 5 * MS)))["jobs"]
    assert (job["world_size"], job["backend"]) == (2, "nccl")
    r0 = job["ranks"][0]
    # HTA's window: the work launched before the last step started (steps 0 and 1), from the first kernel's
    # start (1 ms) to step 1's all_reduce end (165 ms): 164 ms, busy [1, 65] and [101, 165], compute 2 x 40 ms
    assert r0["compute_pct"] == pytest.approx(100 * 80 / 164)
    assert r0["idle_pct"] == pytest.approx(100 * (164 - 2 * 64) / 164)
    assert r0["comm_comp_overlap_pct"] == pytest.approx(100 * 6 / 30)  # 35-41 ms of each 30 ms all_reduce
    assert r0["step_p50_s"] == pytest.approx(0.1 - 1e-9)
    assert r0["step_p95_s"] == pytest.approx(0.1 - 1e-9)
    (coll,) = job["collectives"]
    assert (coll["op"], coll["count"]) == ("all_reduce", 6)
    assert coll["time_s"] == pytest.approx(6 * 0.03)
    # all_reduce over 2 ranks: bus factor 2(n-1)/n = 1; 64 MB in 30 ms
    assert coll["bus_bandwidth_gbps"] == pytest.approx(64e6 / 0.03 / 1e9)
    assert job["stragglers"] == [0, 1]  # two ranks, HTA's two candidates: both


def test_configured_names_stay_and_a_later_window_is_another_job():
    start = T0 + 900 * MS
    derived = derived_name("nccl", 2, start)
    later = start + 3600 * 10**9
    doc = answer(
        fleet(
            rank_rows("gpu-a", "pretrain-7b", 0, start),
            rank_rows("gpu-b", "pretrain-7b", 1, start),
            rank_rows("gpu-a", derived, 0, start + MS),
            rank_rows("gpu-b", derived_name("nccl", 2, later), 1, later),
        )
    )
    names = [j["job"] for j in doc["jobs"]]
    assert names == sorted(["pretrain-7b", derived, derived_name("nccl", 2, later)])
    by_name = {j["job"]: [r["rank"] for r in j["ranks"]] for j in doc["jobs"]}
    assert by_name == {"pretrain-7b": [0, 1], derived: [0], derived_name("nccl", 2, later): [1]}


def test_no_job_rows_no_jobs():
    rows = rank_rows("gpu-a", "x", 0, T0)
    for r in [*rows[0], *rows[1]]:
        r["job"] = r["rank"] = None
    assert answer(fleet(rows)) == {"jobs": [], "slurm_jobs": []}
