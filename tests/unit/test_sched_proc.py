"""The /proc backend and target resolution against a /proc tree built in a temporary directory."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.sched import source as sched_source
from aaco.agent.sources.sched.proc import ProcBackend, parse_stat, parse_status_switches
from aaco.agent.sources.sched.source import SchedSourceConfig, announce, select_backend
from aaco.agent.sources.sched.targets import TargetResolver, cgroup_processes, holds_gpu
from aaco.contract import sched as rows
from aaco.contract.stats import Stats

TICK = os.sysconf("SC_CLK_TCK")


def stat_line(pid: int, comm: str, minflt: int, majflt: int, start_ticks: int, state: str = "S") -> str:
    fields = [state, "1", str(pid), str(pid), "0", "-1", "4194560", str(minflt), "0", str(majflt), "0"]
    fields += ["0"] * 8 + [str(start_ticks)] + ["0"] * 30
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


class FakeProc:
    """A /proc with processes and threads whose counters the test sets."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def thread(
        self,
        tgid: int,
        tid: int,
        *,
        run: int = 0,
        wait: int = 0,
        slices: int = 0,
        vol: int = 0,
        invol: int = 0,
        minflt: int = 0,
        majflt: int = 0,
        comm: str = "w",
        start_ticks: int = 0,
    ) -> None:
        d = self.root / str(tgid) / "task" / str(tid)
        d.mkdir(parents=True, exist_ok=True)
        (d / "schedstat").write_text(f"{run} {wait} {slices}\n")
        (d / "status").write_text(
            f"Name:\t{comm}\nTgid:\t{tgid}\nvoluntary_ctxt_switches:\t{vol}\nnonvoluntary_ctxt_switches:\t{invol}\n"
        )
        (d / "stat").write_text(stat_line(tid, comm, minflt, majflt, start_ticks))
        if tid == tgid:
            for name in ("stat", "status"):
                (self.root / str(tgid) / name).write_text((d / name).read_text())

    def remove(self, tgid: int) -> None:
        import shutil

        shutil.rmtree(self.root / str(tgid))


def now_ticks() -> int:
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) * TICK // 1_000_000_000


def test_parse_stat_with_awkward_names():
    assert parse_stat(stat_line(5, "a b) (c", 11, 2, 777)) == ("a b) (c", 11, 2, 777)
    assert parse_status_switches("voluntary_ctxt_switches:\t12\nnonvoluntary_ctxt_switches:\t3\n") == (12, 3)


def test_proc_backend_deltas_new_threads_and_exits(tmp_path: Path):
    p = FakeProc(tmp_path)
    p.thread(10, 10, run=1000, wait=100, slices=10, vol=5, invol=1, minflt=50, majflt=1, comm="main")
    p.thread(10, 11, run=5000, wait=0, slices=2, vol=1, comm="worker")
    b = ProcBackend(proc=tmp_path)
    b.set_targets({10})  # baseline
    p.thread(10, 10, run=3000, wait=4100, slices=12, vol=9, invol=3, minflt=60, majflt=3, comm="main")
    p.thread(10, 12, run=700, wait=64, slices=1, vol=2, comm="born", start_ticks=now_ticks() + 10 * TICK)
    d = b.drain()
    got = {(int(t), m): int(v[i]) for m, v in d.threads.values.items() for i, t in enumerate(d.threads.tid) if v[i]}
    assert got[(10, rows.ONCPU)] == 2000
    assert got[(10, rows.RQ_WAIT)] == 4000
    assert got[(10, rows.RQ_WAITS)] == 2
    assert (got[(10, rows.VOLUNTARY)], got[(10, rows.INVOLUNTARY)]) == (4, 2)
    assert (got[(10, rows.FAULTS)], got[(10, rows.MAJOR_FAULTS)]) == (12, 2)
    assert got[(12, rows.ONCPU)] == 700  # born after the baseline: counted from zero
    assert got[(12, rows.VOLUNTARY)] == 2
    assert (11, rows.ONCPU) not in got  # no change
    # Runqueue latency: thread 10 waited 4000 ns over 2 slices (2000 each: slot 10), thread 12 64 ns (slot 6).
    hist = sorted(zip(d.hist_tgid.tolist(), d.hist_slot.tolist(), d.hist_count.tolist(), strict=True))
    assert hist == [(10, 6, 1), (10, 10, 2)]
    assert d.exited == []
    p.remove(10)
    d = b.drain()
    assert d.exited == [10]
    assert len(d.threads) == 0


def test_proc_backend_all_tasks_and_thread_cap(tmp_path: Path):
    p = FakeProc(tmp_path)
    for tgid in (1, 2, 3):
        p.thread(tgid, tgid, run=10)
    b = ProcBackend(all_tasks=True, max_threads=2, proc=tmp_path)
    for tgid in (1, 2, 3):
        p.thread(tgid, tgid, run=20)
    d = b.drain()
    assert sorted(d.threads.tid.tolist()) == [1, 2]
    assert d.dropped == {"thread_cap": 1}
    assert b.sizes()["user_threads"] == 2


def test_target_resolution(tmp_path: Path):
    p = FakeProc(tmp_path)
    for tgid in (100, 200, 300, 400):
        p.thread(tgid, tgid)
    p.thread(100, 101)
    (tmp_path / "101").mkdir()
    (tmp_path / "101" / "status").write_text("Tgid:\t100\n")
    fds = {200: "/dev/kfd", 300: "/dev/dri/renderD128", 400: "/dev/null"}
    for pid, target in fds.items():
        (tmp_path / str(pid) / "fd").mkdir()
        os.symlink(target, tmp_path / str(pid) / "fd" / "3")
    (tmp_path / "100" / "fd").mkdir()
    os.symlink("/dev/nvidiactl", tmp_path / "100" / "fd" / "7")
    assert holds_gpu(200, tmp_path) and holds_gpu(300, tmp_path) and holds_gpu(100, tmp_path)
    assert not holds_gpu(400, tmp_path)
    r = TargetResolver(pids=[101, 400, 999], gpu=True, proc=tmp_path).resolve()
    assert r.tgids == {100, 200, 300, 400}  # 101 is a thread of 100
    assert r.missing_pids == [999]
    assert r.gpu == 3
    capped = TargetResolver(pids=[400], gpu=True, max_processes=2, proc=tmp_path).resolve()
    assert capped.tgids == {100, 200} and capped.over_cap == 2
    cg = tmp_path / "cg"
    (cg / "child").mkdir(parents=True)
    (cg / "cgroup.procs").write_text("100\n")
    (cg / "child" / "cgroup.procs").write_text("200\n300\n")
    assert cgroup_processes(cg) == {100, 200, 300}
    assert cgroup_processes(tmp_path / "nope") is None
    r = TargetResolver(cgroups=[cg, tmp_path / "nope"], gpu=False, include_self=True, proc=tmp_path).resolve()
    assert r.tgids == {100, 200, 300, os.getpid()}
    assert r.missing_cgroups == [tmp_path / "nope"]


def test_config_needs_targets_and_validates_backend():
    with pytest.raises(ValidationError, match="no targets"):
        SchedSourceConfig(gpu_processes=False)
    with pytest.raises(ValidationError):
        SchedSourceConfig(backend="kprobe")  # type: ignore[arg-type]
    assert SchedSourceConfig(all_tasks=True, gpu_processes=False).all_tasks


def test_configured_proc_backend_and_announced_once(caplog: pytest.LogCaptureFixture):
    backend, reason = select_backend(SchedSourceConfig(backend="proc", include_self=True))
    assert backend.name == "proc" and "configured" in reason
    sched_source._announced.discard(("proc", "no root here (test)"))
    with caplog.at_level(logging.INFO, logger="aaco.sources.sched"):
        assert announce("proc", "no root here (test)")
        assert not announce("proc", "no root here (test)")
    lines = [r for r in caplog.records if "using the proc backend" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "no root here (test)" in lines[0].getMessage()


def test_source_reports_a_missing_pid_once_and_publishes(tmp_path: Path):
    stats = Stats()
    ctx = SourceContext("n1", stats, Bus(stats, 100, 100_000), Journal(stats))
    cfg = SchedSourceConfig(
        backend="proc", gpu_processes=False, include_self=True, pids=[2**22 + 1], interval_s=0.05,
        discover_interval_s=0.01,
    )  # fmt: skip
    src = sched_source.create(cfg, "sched")
    thread = threading.Thread(target=src.run, args=(ctx,))
    thread.start()
    deadline = time.monotonic() + 10
    while ctx.bus.depth == 0 and time.monotonic() < deadline:
        sum(i * i for i in range(20000))  # give our own process something to be measured doing
        time.sleep(0.01)
    time.sleep(0.2)
    ctx.stop.set()
    thread.join(10)
    assert not thread.is_alive()
    problems = [p for p in ctx.journal.problems if p.reason == "no_such_process"]
    assert len(problems) == 1 and not problems[0].fatal
    assert problems[0].subject == f"pid {2**22 + 1}"
    item = ctx.bus.get(1.0)
    assert item is not None and item.kind == "sched"
    assert set(item.batch.column("pid").to_pylist()) == {os.getpid()}
    rec = ctx.journal.records_json()[-1]
    assert rec["format"] == "sched-proc" and rec["events"]["sched"] > 0
