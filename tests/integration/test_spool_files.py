"""Files (issue 14 point 5), with the real ``aaco`` process run under umask 000 (so nothing is private by accident).

The spool holds a link to a 0600 trace in a 0700 directory outside it, a trace owned by another user
(uid 65534), a damaged 0600 trace and a good one: only the good one and the damaged one's readable
part land, the link and the other user's file are counted and never read, and every file of the lake
and the quarantine is 0640 or tighter (the damaged file's copy 0600, as its source), every directory
0750. ``aaco replay --out`` makes a private lake too.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import get_free_port, skip_or_fail
from tests.support.modes import loose

from .helpers import http_get, read_lake, run_aaco, start_aaco, wait_for
from .test_spool_bad_files import files_read, source_errors, stop
from .test_trace_sources import ROCPROF_DIR, all_committed, checkpoints, kineto_truth, spool_config

pytestmark = pytest.mark.integration

A100 = "a100_alexnet_trace.json.gz"
MI250 = "mi250_minitoy_train_ROCm6_2_kineto.json.gz"


def under_open_umask(aaco_bin: str, *args: str, log: Path) -> subprocess.Popen[bytes]:
    """``aaco ARGS`` exec'd by a shell that set umask 000 (the pid is aaco's)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            ["bash", "-c", 'umask 000 && exec "$0" "$@"', aaco_bin, *args], stdout=out, stderr=subprocess.STDOUT
        )


def test_the_spool_reads_no_link_out_nor_another_users_file_and_the_lake_is_private(tmp_path, aaco_bin, samples):
    if os.geteuid() != 0:
        skip_or_fail("the owner rule is tested by giving a file to uid 65534, which needs root")
    spool, lake, private = tmp_path / "spool", tmp_path / "lake", tmp_path / "private"
    spool.mkdir()
    private.mkdir(mode=0o700)
    secret = private / "secret.json.gz"
    shutil.copy(samples / "kineto" / MI250, secret)
    secret.chmod(0o600)
    (spool / "link.json.gz").symlink_to(secret)
    other = spool / "other.json.gz"
    shutil.copy(samples / "kineto" / MI250, other)
    os.chown(other, 65534, 65534)
    damaged = spool / "damaged.json"
    damaged.write_bytes(b'{"schemaVersion": 1, "traceEvents": [' + b"[" * 4096)
    damaged.chmod(0o600)
    good = spool / A100
    shutil.copy(samples / "kineto" / A100, good)

    port = get_free_port()
    base = f"http://127.0.0.1:{port}"
    cfg = spool_config(tmp_path / "agent.yaml", spool, lake, port)
    log = tmp_path / "agent.log"
    agent = under_open_umask(aaco_bin, "agent", "--config", str(cfg), log=log)
    try:
        wait_for(lambda: http_get(base + "/readyz")[0] == 200, 60, what="agent ready")
        wait_for(lambda: files_read(base) >= 2, 120, what="the good and the damaged file read")
        wait_for(lambda: all_committed(lake, [good, damaged]), 120, what="both committed")
        time.sleep(1.0)  # a few more polls: the refused files stay refused and are not counted again
        errors = source_errors(http_get(base + "/metrics")[1], "trace_dir")
        wait_for((lake / "sources.json").exists, 30, what="sources.json")
        assert stop(agent) == 0
    finally:
        if agent.poll() is None:
            agent.kill()

    assert errors.get("symlink") == 1 and errors.get("owner_policy") == 1, errors
    truth = sum(n for n, _ in kineto_truth(samples / "kineto" / A100).values())
    assert read_lake(lake, "kernels").num_rows == truth  # the good file only: nothing of MI250 (link, other)
    text = log.read_text()
    assert text.count(str(spool / "link.json.gz")) == 1 and text.count(str(other)) == 1  # named once each
    assert "Traceback" not in text

    copy = lake / "quarantine" / "trace_dir" / "damaged.json"
    assert copy.read_bytes() == damaged.read_bytes()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600  # never looser than its source
    assert not (lake / "quarantine" / "trace_dir" / "link.json.gz").exists()
    assert not (lake / "quarantine" / "trace_dir" / "other.json.gz").exists()
    assert {"analysis.json", "sources.json", "offsets.json", ".lock"} <= {p.name for p in lake.rglob("*")}
    assert loose(lake) == []


def test_a_replay_makes_a_private_lake(tmp_path, aaco_bin, samples):
    out = tmp_path / "new" / "lake"
    proc = under_open_umask(aaco_bin, "replay", str(samples / "kineto" / A100), "--out", str(out), log=tmp_path / "log")
    assert proc.wait(240) == 0, (tmp_path / "log").read_text()[-3000:]
    assert list(out.rglob("part-*.parquet"))
    assert loose(tmp_path / "new") == []


def test_a_rocprofv3_directory_in_the_spool_and_the_model_its_csv_names(tmp_path, aaco_bin, samples):
    """Statistics and counters beside the traces are named once and committed, never quarantined; a kernel
    trace tailed by the spool names the model a replay of it names."""
    spool, lake = tmp_path / "spool", tmp_path / "lake"
    run = spool / "host" / "4242"
    shutil.copytree(ROCPROF_DIR, run, ignore=shutil.ignore_patterns("README.md"))
    shutil.copy(samples / "rocprofv3" / "kernel_trace.csv", run / "kernel_trace.csv")
    single = spool / "single" / "77_kernel_trace.csv"
    single.parent.mkdir()
    shutil.copy(samples / "rocprofv3" / "kernel_trace.csv", single)
    not_read = [run / n for n in ("counter_collection.csv", "hip_api_stats.csv", "kernel_names.csv")]
    port = get_free_port()
    base = f"http://127.0.0.1:{port}"
    cfg = spool_config(tmp_path / "agent.yaml", spool, lake, port)
    log = tmp_path / "agent.log"
    agent = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=log)
    try:
        wait_for(lambda: http_get(base + "/readyz")[0] == 200, 60, what="agent ready")
        traces = [run / "kernel_trace.csv", run / "marker_api_trace.csv", run / "hsa_api_trace.csv", single]
        wait_for(lambda: all_committed(lake, traces), 120, what="the traces committed")
        wait_for(lambda: all(os.fspath(p) in checkpoints(lake) for p in not_read), 60, what="the others seen")
        time.sleep(1.0)  # more polls: named once, not again
        errors = source_errors(http_get(base + "/metrics")[1], "trace_dir")
        assert stop(agent) == 0
    finally:
        if agent.poll() is None:
            agent.kill()

    assert not any(errors.values()), errors  # named, not counted as bad input
    text = log.read_text()
    for p in not_read:
        assert checkpoints(lake)[os.fspath(p)]["meta"]["not_read"] is True
        assert text.count(str(p)) == 1, text
    quarantine = lake / "quarantine" / "trace_dir"
    assert not quarantine.exists() or list(quarantine.iterdir()) == []

    replayed = tmp_path / "replayed"
    proc = run_aaco(aaco_bin, "replay", str(single), "--out", str(replayed))
    assert proc.returncode == 0, proc.stderr
    by_replay = read_lake(replayed, "kernels").column("model").to_pylist()
    by_spool = read_lake(lake, "kernels").column("model").to_pylist()
    assert by_replay == ["77_kernel_trace"] * 9
    assert by_spool.count("77_kernel_trace") == 9  # the tailed copy: the same model, not null
