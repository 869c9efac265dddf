"""The job columns at ingest (docs/jobs.md): Kineto's distributedInfo and collectives, the process
environment, the spool's registry of jobs named from their ranks, a replay's look ahead.

Real traces: HTA's two ranks of a 128-rank NCCL job (``tests/data/kineto-multirank``) and its
``nccl_parser_config`` trace (``examples/data/kineto-hta``: NCCL kernels with the
``record_param_comms`` arguments), copied and changed where a test needs what they lack. The
environment is a real child process's, read from the real ``/proc``.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from aaco.agent.sources.job_scan import head_rank, prescan
from aaco.agent.sources.jobs import JobRegistry, environ_job, process_job, save_job, saved_job
from aaco.agent.sources.trace_dir import TraceDirConfig, TraceDirSource
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.kineto import parse_kineto
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.jobs import JobFields
from tests.conftest import ROOT

from .test_source_supervision import context, poll_until_settled

MULTIRANK = ROOT / "tests" / "data" / "kineto-multirank"
RANK0, RANK1 = MULTIRANK / "trace_filter_sampled_rank-0.json.gz", MULTIRANK / "trace_filter_sampled_rank-1.json.gz"
JOB128 = "nccl-128x-2023-04-28T23:51:38Z"
S = 1_000_000_000


def load(path: Path) -> dict:
    return orjson.loads(gzip.decompress(path.read_bytes()))


def parse(doc: dict):
    return parse_kineto(doc, node="n", identity="i", run_id="r", model="m", file_mtime_ns=0)


def write(path: Path, doc: dict) -> Path:
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return path


# -- the environment -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "want"),
    [
        (
            {"RANK": "3", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "TORCHELASTIC_RUN_ID": "ft-42", "MASTER_ADDR": "h"},
            JobFields("ft-42", 3, 16, 3),
        ),
        (  # torchrun's default rendezvous id says nothing: the master names the job
            {
                "RANK": "0",
                "WORLD_SIZE": "2",
                "TORCHELASTIC_RUN_ID": "none",
                "MASTER_ADDR": "10.0.0.1",
                "MASTER_PORT": "29500",
            },
            JobFields("10.0.0.1:29500", 0, 2),
        ),
        (
            {"GROUP_RANK": "2", "LOCAL_WORLD_SIZE": "8", "LOCAL_RANK": "5", "WORLD_SIZE": "32"},
            JobFields(None, 21, 32, 5),
        ),
        (
            {"SLURM_JOB_ID": "881234", "SLURM_PROCID": "7", "SLURM_NTASKS": "8", "SLURM_LOCALID": "3"},
            JobFields("slurm-881234", 7, 8, 3),
        ),
        ({"RANK": "9", "WORLD_SIZE": "4"}, JobFields(None, None, 4)),  # a rank outside its world: not believed
        ({"RANK": "x", "PATH": "/bin"}, JobFields()),
    ],
)
def test_the_environment_gives_rank_world_and_job(env, want):
    assert environ_job(env) == want


@pytest.fixture
def rank_process():
    """A running process with a torchrun-like environment."""
    env = {**os.environ, "RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "3", "TORCHELASTIC_RUN_ID": "run-42"}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    time.sleep(0.05)
    yield proc
    proc.kill()
    proc.wait()


def test_a_running_process_environment_is_read_unless_it_started_after_the_trace(rank_process):
    assert process_job(rank_process.pid) == JobFields("run-42", 3, 8, 3)
    assert process_job(rank_process.pid, started_before_ns=time.time_ns()) == JobFields("run-42", 3, 8, 3)
    assert process_job(rank_process.pid, started_before_ns=1_682_725_898 * S) is None  # a 2023 trace: a reused pid
    assert process_job(2**22 + 12345) is None  # no such process


def test_a_capture_window_keeps_its_process_job(tmp_path):
    save_job(tmp_path, JobFields("run-42", 3, 8, 3))
    assert saved_job(tmp_path) == JobFields("run-42", 3, 8, 3)
    (tmp_path / ".aaco-job").write_text('{"job": 7, "rank": -1, "world_size": "8"}')
    assert saved_job(tmp_path) == JobFields()
    assert saved_job(tmp_path / "none") is None


# -- Kineto: distributedInfo and collectives -------------------------------------------------------


def test_distributed_info_is_the_ranks_identity():
    for path, rank in ((RANK0, 0), (RANK1, 1)):
        p = parse(load(path))
        assert p.job == JobFields(rank=rank, world_size=128, dist_backend="nccl")
        assert p.span_ns == (p.iterations.column("start_ns")[0].as_py(), p.iterations.column("end_ns")[-1].as_py())
    single = load(MULTIRANK / "critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz")
    assert single["distributedInfo"] == {"rank": 0} and parse(single).job is None  # no world: no rank


def test_the_launching_record_param_comms_gives_sizes_when_the_kernel_has_none(samples):
    doc = load(samples / "kineto-hta" / "nccl_parser_config_nccl_data.json.gz")
    want = parse(doc).kernels
    keys = ("Collective name", "In msg nelems", "Out msg nelems", "Group size", "dtype", "Process Group Name")
    for ev in doc["traceEvents"]:  # older PyTorch: the arguments only on the operator
        if ev.get("cat") == "kernel":
            for k in keys:
                ev["args"].pop(k, None)
    got = parse(doc).kernels
    cols = ["collective", "collective_bytes", "collective_dtype", "collective_group_size", "collective_seq"]
    assert got.select(cols).equals(want.select(cols))
    assert got.filter(got.column("collective").is_valid()).column("collective_bytes").null_count == 0


def test_a_generic_kernel_takes_its_operation_from_its_launch_and_bad_values_stay_null(samples):
    doc = load(samples / "kineto-hta" / "nccl_parser_config_nccl_data.json.gz")
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "kernel" and ev["name"].startswith("nccl"):
            ev["name"] = "ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)"  # NCCL 2.19+'s generic kernel
            ev["args"]["In msg nelems"] = ev["args"]["Out msg nelems"] = str(ev["args"]["In msg nelems"])
    k = parse(doc).kernels
    coll = k.filter(k.column("collective").is_valid())
    assert set(coll.column("collective").to_pylist()) == {"all_reduce", "broadcast"}
    assert coll.column("collective_bytes").null_count == coll.num_rows  # a count written as a string: unknown
    assert set(coll.column("collective_dtype").to_pylist()) == {"float32", "int64"}


def test_collectives_of_the_ranks_are_numbered_in_start_order():
    for path in (RANK0, RANK1):
        k = parse(load(path)).kernels
        coll = k.filter(k.column("collective").is_valid())
        assert coll.column("collective").to_pylist() == ["send_recv"] * 10
        assert coll.column("collective_seq").to_pylist() == list(range(10))
        assert coll.column("collective_bytes").null_count == 10  # record_param_comms without sizes (2023)
        assert k.filter(k.column("collective").is_null()).column("collective_seq").null_count == k.num_rows - 10


# -- naming jobs: the spool, a replay --------------------------------------------------------------


def rows(ctx, kind: str) -> pa.Table:
    tables = []
    while (item := ctx.bus.get(0)) is not None:
        if item.kind == kind:
            tables.append(pa.Table.from_batches([item.batch]))
        ctx.ledger.apply(list(item.ranges))
    return pa.concat_tables(tables)


def job_rows(table: pa.Table) -> set[tuple]:
    cols = ["job", "rank", "world_size", "dist_backend", "model"]
    return set(zip(*(table.column(c).to_pylist() for c in cols), strict=True))


def test_the_spool_names_a_job_from_its_first_rank_and_later_ranks_join_it(tmp_path, samples):
    spool = tmp_path / "spool"
    spool.mkdir()
    ctx = context(tmp_path)
    src = TraceDirSource(TraceDirConfig(path=spool, settle_s=0.001), "spool")
    shutil.copy(RANK1, spool / "first.json.gz")  # rank 1 arrives first
    poll_until_settled(src, ctx)
    assert job_rows(rows(ctx, "iterations")) == {(JOB128, 1, 128, "nccl", JOB128)}
    shutil.copy(RANK0, spool / "second.json.gz")
    shutil.copy(samples / "kineto-hta" / "nccl_parser_config_nccl_data.json.gz", spool / "third.json.gz")
    poll_until_settled(src, ctx)
    other = "nccl-2x-2024-05-23T00:15:22Z"
    assert job_rows(rows(ctx, "kernels")) == {(JOB128, 0, 128, "nccl", JOB128), (other, 0, 2, "nccl", other)}


def event(cat: str, name: str, pid: int, tid: int, ts: int, dur: int, args: dict) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_the_spool_asks_the_environment_of_the_traces_process_first(tmp_path, rank_process):
    """A trace written now by a running process: its environment's job and rank win over distributedInfo."""
    now_us = time.time_ns() // 1000
    pid = rank_process.pid
    doc = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": 5, "world_size": 8},
        "traceEvents": [
            event("user_annotation", "ProfilerStep#1", pid, 1, now_us, 900, {}),
            event("cuda_runtime", "cudaLaunchKernel", pid, 1, now_us + 10, 5, {"correlation": 7}),
            event("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 7, now_us + 20, 100, {"correlation": 7}),
        ],
    }
    spool = tmp_path / "spool"
    spool.mkdir()
    write(spool / "rank.json.gz", doc)
    ctx = context(tmp_path)
    poll_until_settled(TraceDirSource(TraceDirConfig(path=spool, settle_s=0.001), "spool"), ctx)
    k = rows(ctx, "kernels").to_pylist()
    assert [(r["job"], r["rank"], r["world_size"], r["local_rank"], r["dist_backend"], r["model"]) for r in k] == [
        ("run-42", 3, 8, 3, "nccl", "run-42")
    ]
    assert (k[0]["collective"], k[0]["collective_seq"]) == ("all_reduce", 0)


def test_the_registry_joins_overlapping_ranks_and_forgets_the_oldest():
    reg = JobRegistry(max_jobs=2)
    t = 1_682_725_898 * S
    assert reg.name("a", "NCCL", 4, t, t + S) == "nccl-4x-2023-04-28T23:51:38Z"
    assert reg.name("b", "nccl", 4, t + S // 2, t + 5 * S) == "nccl-4x-2023-04-28T23:51:38Z"
    assert reg.name("c", "nccl", 4, t + 4 * S, t + 6 * S) == "nccl-4x-2023-04-28T23:51:38Z"  # through b's widening
    assert reg.name("d", "nccl", 8, t, t + S) == "nccl-8x-2023-04-28T23:51:38Z"
    # a third job: the one ending first (d's) is forgotten
    assert reg.name("e", "nccl", 4, t + 100 * S, t + 101 * S) == "nccl-4x-2023-04-28T23:53:18Z"
    assert reg.name("f", "nccl", 1, t, t + S) is None
    reg.preset({"g": "given"})
    assert reg.name("g", "nccl", 4, t, t + S) == "given"


def test_a_replay_looks_ahead_at_the_ranks_that_share_a_world(tmp_path, samples):
    assert head_rank(identify(RANK0)) == ("nccl", 128)
    late = samples / "kineto-hta" / "cupti_profiler_trace.json.gz"  # its distributedInfo follows its events
    assert head_rank(identify(late)) is None
    # rank 1's copy shifted one second later: named alone it would be 23:51:39; with rank 0, 23:51:38
    doc = load(RANK1)
    for ev in doc["traceEvents"]:
        if isinstance(ev.get("ts"), int | float):
            ev["ts"] += 1_000_000
    r1 = identify(write(tmp_path / "r1.json.gz", doc))
    files = [r1, identify(RANK0), identify(samples / "kineto-hta" / "trace_diff_test_test.json.gz")]
    ahead = prescan(files, lambda tf: context_for(tf, node="n", source="replay"))
    assert ahead.names == {files[0].identity: JOB128, files[1].identity: JOB128}  # the third is alone in its world
    alone = next(parse_any(r1, context_for(r1, node="n", source="replay")))
    assert alone.iterations.column("job")[0].as_py() == "nccl-128x-2023-04-28T23:51:39Z"


def test_the_ranks_read_ahead_are_kept_and_give_what_a_read_gives(tmp_path):
    """Kept chunks, given their job, equal the file read again; past keep_bytes a file is read for its span alone."""
    files = [identify(RANK0), identify(RANK1)]
    jobs = JobRegistry()

    def context(tf):
        return context_for(tf, node="n", source="replay", jobs=jobs)

    ahead = prescan(files, context)
    jobs.preset(ahead.names)
    assert sorted(ahead.chunks) == sorted(tf.identity for tf in files)
    for tf in files:
        kept = list(parse_any(tf, context(tf), read=ahead.take(tf.identity)))
        again = list(parse_any(tf, context(tf)))
        assert len(kept) == len(again) >= 1
        for a, b in zip(kept, again, strict=True):
            assert a.kernels.equals(b.kernels) and a.iterations.equals(b.iterations)
        assert kept[0].iterations.column("job")[0].as_py() == JOB128
        assert kept[0].iterations.column("cp_length_ns").drop_null().to_pylist()  # the critical path came along
        assert ahead.take(tf.identity) is None  # once
    first = prescan(files, context, keep_bytes=1)  # the first file fills the budget: the second is read again
    assert list(first.chunks) == [files[0].identity] and first.names == ahead.names
