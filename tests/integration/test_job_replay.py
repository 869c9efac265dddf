"""Jobs, not processes (issue 28), through the real ``aaco replay``: real rank traces become one job.

``tests/data/kineto-multirank/trace_filter_sampled_rank-0`` and ``-1`` are two ranks of one
128-rank NCCL job (HTA's test data: ``distributedInfo`` ``{"backend": "nccl", "rank": 0|1,
"world_size": 128}``). Copied under names that say nothing (rank 1 first in name order, then the
other way round), they replay as ONE job of world size 128 with ranks 0 and 1, named from the
earliest ``ProfilerStep`` of the two files as the files themselves state it (read here with
``gzip`` and ``json``). Two real traces of two other jobs with the same backend and world size
(``trace_diff_test_test``: rank 1 of 2, August 2022; ``nccl_parser_config_nccl_data``: rank 0 of
2, May 2024) replayed beside them stay two jobs. ``--job`` names the job for every row.

The collectives of ``nccl_parser_config_nccl_data`` (NCCL 2.17, PyTorch copying the
``record_param_comms`` arguments onto its kernels): every NCCL kernel is a collective numbered in
start order, and the bus bandwidth of one all_reduce is checked against a hand computation from
the message size the trace states.
"""

from __future__ import annotations

import gzip
import json
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from aaco.contract.jobs import bus_bandwidth
from tests.conftest import ROOT

from .helpers import read_lake, run_aaco

pytestmark = pytest.mark.integration

MULTIRANK = ROOT / "tests" / "data" / "kineto-multirank"
RANK0, RANK1 = MULTIRANK / "trace_filter_sampled_rank-0.json.gz", MULTIRANK / "trace_filter_sampled_rank-1.json.gz"
TEST2 = "trace_diff_test_test.json.gz"
NCCL2 = "nccl_parser_config_nccl_data.json.gz"
JOB_COLS = ["job", "rank", "world_size", "dist_backend", "model"]


def first_step_us(path: Path) -> float:
    """The start of the file's earliest ProfilerStep, epoch microseconds (base time added), from the JSON alone."""
    with gzip.open(path, "rt") as fh:
        doc = json.load(fh)
    base_us = int(doc.get("baseTimeNanoseconds") or 0) / 1000
    return base_us + min(e["ts"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))


def utc_second(ts_us: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(int(ts_us // 1_000_000)))


def replay(aaco_bin: str, lake: Path, *args: str) -> None:
    result = run_aaco(aaco_bin, "replay", *args, "--out", str(lake), "--no-progress")
    assert result.returncode == 0, result.stdout + result.stderr


def jobs_of(lake: Path, kind: str) -> set[tuple]:
    t = read_lake(lake, kind).select(JOB_COLS)
    return set(zip(*(t.column(c).to_pylist() for c in JOB_COLS), strict=True))


@pytest.mark.parametrize("names", [("a.json.gz", "z.json.gz"), ("z.json.gz", "a.json.gz")])
def test_the_ranks_of_one_job_are_one_job_and_two_jobs_stay_two(tmp_path, aaco_bin, samples, names):
    spool = tmp_path / "traces"
    spool.mkdir()
    shutil.copy(RANK1, spool / names[0])  # the file names say nothing of the ranks
    shutil.copy(RANK0, spool / names[1])
    shutil.copy(samples / "kineto-hta" / TEST2, spool / "b.json.gz")
    shutil.copy(samples / "kineto-hta" / NCCL2, spool / "c.json.gz")
    lake = tmp_path / "lake"
    replay(aaco_bin, lake, str(spool))

    job = f"nccl-128x-{utc_second(min(first_step_us(RANK0), first_step_us(RANK1)))}"
    assert job == "nccl-128x-2023-04-28T23:51:38Z"  # rank 0's step 551 starts at 23:51:38.079292
    test2 = f"nccl-2x-{utc_second(first_step_us(samples / 'kineto-hta' / TEST2))}"
    nccl2 = f"nccl-2x-{utc_second(first_step_us(samples / 'kineto-hta' / NCCL2))}"
    assert test2 != nccl2  # one backend, one world size, two jobs (2022 and 2024)
    want = {
        (job, 0, 128, "nccl", job),
        (job, 1, 128, "nccl", job),
        (test2, 1, 2, "nccl", test2),
        (nccl2, 0, 2, "nccl", nccl2),
    }
    assert jobs_of(lake, "iterations") == want
    assert jobs_of(lake, "kernels") == want  # every kernel row: GPU work, copies and sets alike
    kernels = read_lake(lake, "kernels")
    ranks = kernels.filter(pc.equal(kernels.column("job"), job)).group_by("rank").aggregate([("start_ns", "count")])
    assert dict(zip(*(ranks.column(c).to_pylist() for c in ("rank", "start_ns_count")), strict=True)) == {
        0: 1204,  # the files' kernel, memcpy and memset events
        1: 1154,
    }


def test_a_configured_job_names_every_row(tmp_path, aaco_bin):
    lake = tmp_path / "lake"
    replay(aaco_bin, lake, str(RANK0), str(RANK1), "--job", "pretrain-7b")
    assert jobs_of(lake, "iterations") == {("pretrain-7b", r, 128, "nccl", "pretrain-7b") for r in (0, 1)}
    lake2 = tmp_path / "lake2"
    replay(aaco_bin, lake2, str(RANK0), "--job", "pretrain-7b", "--model-name", "llama")
    assert jobs_of(lake2, "kernels") == {("pretrain-7b", 0, 128, "nccl", "llama")}  # the configured model stays


def test_collectives_and_a_bus_bandwidth_by_hand(tmp_path, aaco_bin, samples):
    path = samples / "kineto-hta" / NCCL2
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    nccl = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    lake = tmp_path / "lake"
    replay(aaco_bin, lake, str(path))
    kernels = read_lake(lake, "kernels").sort_by("start_ns")
    coll = kernels.filter(kernels.column("collective").is_valid())
    assert coll.num_rows == len(nccl) == 21
    assert coll.column("collective_seq").to_pylist() == list(range(21))
    assert sorted(pc.value_counts(coll.column("collective")).to_pylist(), key=str) == [
        {"values": "all_reduce", "counts": sum("AllReduce" in e["name"] for e in nccl)},
        {"values": "broadcast", "counts": sum("Broadcast" in e["name"] for e in nccl)},
    ]
    assert set(coll.column("collective_group_size").to_pylist()) == {2}
    # The all_reduce of External id 12945 (the trace's own numbers): "In msg nelems": 6637568 of "Float"
    # (4 bytes) = 26,550,272 bytes, "dur": 2636.669 us. Algorithm bandwidth 26,550,272 B / 2.636669 ms =
    # 10.0696 GB/s; nccl-tests' all_reduce bus factor for 2 ranks, 2(n-1)/n = 1: bus bandwidth 10.0696 GB/s.
    (ev,) = [e for e in nccl if e["args"]["External id"] == 12945]
    assert (ev["args"]["In msg nelems"], ev["args"]["dtype"], ev["dur"]) == (6637568, "Float", 2636.669)
    row = coll.filter(pc.equal(coll.column("correlation_id"), ev["args"]["correlation"])).to_pylist()[0]
    assert (row["collective"], row["collective_bytes"], row["collective_dtype"]) == (
        "all_reduce",
        26_550_272,
        "float32",
    )
    assert row["end_ns"] - row["start_ns"] == 2_636_669
    busbw = bus_bandwidth(row["collective"], row["collective_bytes"], row["end_ns"] - row["start_ns"], 2)
    assert busbw == pytest.approx(10.0696e9, rel=1e-5)
    # the others: bytes = the larger element count times the type's size, as the kernel's own args state them
    sizes = {"Float": 4, "Long": 8}
    by_corr = {e["args"]["correlation"]: e["args"] for e in nccl}
    for r in coll.to_pylist():
        args = by_corr[r["correlation_id"]]
        assert r["collective_bytes"] == max(args["In msg nelems"], args["Out msg nelems"]) * sizes[args["dtype"]]
    assert pa.types.is_int64(kernels.schema.field("collective_seq").type)
