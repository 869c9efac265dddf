"""The sched source against the real kernel: bcc eBPF on tracepoints (as root), and /proc.

Under AACO_REQUIRE_REAL=1 the eBPF tests fail, not skip, when eBPF cannot run here (not root, no
bcc, no tracefs or kernel headers): ``.ci/setup --test`` sets all of that up as root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from aaco.agent.sources.sched.source import SchedCollector, SchedSourceConfig
from aaco.analyzers.sched import SchedAnalyzer
from aaco.contract import sched as rows
from aaco.contract.schemas import EventBatch, conform
from tests.conftest import skip_or_fail

from .helpers import http_get, read_lake, run_aaco, start_aaco, wait_for

pytestmark = pytest.mark.integration

SLEEPER = "import time\nwhile True:\n    time.sleep(0.001)\n"
HOG = "while True:\n    pass\n"


@pytest.fixture(scope="module")
def ebpf() -> None:
    """eBPF can run here (root, bcc, tracefs, headers), or the test skips (fails under AACO_REQUIRE_REAL=1)."""
    from aaco.agent.sources.sched.host import unavailable_reason

    reason = unavailable_reason()
    if reason is not None:
        skip_or_fail(f"eBPF backend unavailable: {reason}")


def spawn(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


@pytest.fixture
def sleeper_under_load() -> Iterator[int]:
    """A process sleeping 1 ms in a loop while two CPU hogs load both cores; yields its pid."""
    procs = [spawn(SLEEPER), spawn(HOG), spawn(HOG)]
    time.sleep(0.3)
    try:
        yield procs[0].pid
    finally:
        for p in procs:
            p.kill()
            p.wait()


def collector(**kw) -> SchedCollector:
    kw.setdefault("gpu_processes", False)
    return SchedCollector(SchedSourceConfig(**kw))


def feed(analyzer: SchedAnalyzer, c: SchedCollector) -> rows.Drain:
    d = c.drain()
    table = rows.drain_to_table(d, node="t", source="sched")
    if table.num_rows:
        analyzer.update(EventBatch("sched", conform("sched", table), "sched"))
    return d


def bpf_fds() -> int:
    """This process's file descriptors on BPF programs, maps and links, and perf events (attachments)."""
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("anon_inode:bpf") or target == "anon_inode:[perf_event]":
            n += 1
    return n


def test_ebpf_counts_a_sleeper_under_load_and_proc_agrees(ebpf, sleeper_under_load):
    pid = sleeper_under_load
    ebpf_c = collector(backend="ebpf", pids=[pid])
    proc_c = collector(backend="proc", pids=[pid])
    try:
        assert ebpf_c.backend.name == "ebpf" and proc_c.backend.name == "proc"
        ebpf_c.refresh_targets()
        proc_c.refresh_targets()
        a_ebpf, a_proc = SchedAnalyzer(), SchedAnalyzer()
        feed(a_ebpf, ebpf_c)  # both windows start here...
        feed(a_proc, proc_c)
        time.sleep(3.0)
        feed(a_ebpf, ebpf_c)  # ...and end here
        feed(a_proc, proc_c)
    finally:
        ebpf_c.close()
        proc_c.close()
    (we,) = [w for w in a_ebpf.snapshot().to_dict()["workloads"] if w["pid"] == pid]
    (wp,) = [w for w in a_proc.snapshot().to_dict()["workloads"] if w["pid"] == pid]
    assert we["context_switches"] > 1000, we
    assert we["runqueue_latency_p99_s"] is not None and we["runqueue_latency_p99_s"] > 0, we
    assert we["runqueue_waits"] > 0 and we["oncpu_s"] > 0 and we["offcpu_s"] > 0
    assert we["comm"].startswith("python")
    assert abs(we["context_switches"] - wp["context_switches"]) <= 0.10 * wp["context_switches"], (we, wp)


@contextmanager
def stopped(pid: int) -> Iterator[None]:
    """``pid`` stopped (SIGSTOP, and off its CPU) for the block, then continued."""
    os.kill(pid, signal.SIGSTOP)
    try:
        wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T", 5, 0.01)
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def _totals(d: rows.Drain, tgid: int) -> dict[str, int]:
    mine = d.threads.tgid == tgid
    v = d.threads.values
    return {
        "oncpu": int(v[rows.ONCPU][mine].sum()),
        "rq_wait": int(v[rows.RQ_WAIT][mine].sum()),
        "switches": int(v[rows.VOLUNTARY][mine].sum() + v[rows.INVOLUNTARY][mine].sum()),
    }


@pytest.mark.parametrize("attach", ["task", "raw"])
def test_agrees_with_proc_within_one_percent(ebpf, sleeper_under_load, attach):
    """Over the same 3 s, the eBPF source's on-CPU time, runqueue wait and context switches of a
    sleeper among CPU hogs are within 1 % of what /proc reports (issue 18's bound).

    The raw fallback times a slice between its two tracepoints, where the kernel's sum_exec_runtime
    (what /proc reports) also holds the scheduler's own work around them: on 15 µs slices in a VM
    that is a quarter more, so only its waits and switches are held to 1 % (docs/sched.md)."""
    from aaco.agent.sources.sched.btf import task_layout, task_program_layout
    from aaco.agent.sources.sched.ebpf import EbpfBackend, EbpfSettings, kernel_counts_waits
    from aaco.agent.sources.sched.proc import ProcBackend

    if task_layout() is None or not kernel_counts_waits() or (attach == "task" and task_program_layout() is None):
        pytest.skip(f"{attach} needs BTF and the kernel's sched_info here")
    pid = sleeper_under_load
    ebpf_b, proc_b = EbpfBackend(EbpfSettings(attach=attach)), ProcBackend()
    try:
        assert ebpf_b.attach == attach
        for b in (ebpf_b, proc_b):
            b.set_targets({pid})
        time.sleep(0.2)  # past the sleeper's first switch-out: its entry exists
        with stopped(pid):  # both windows start here...
            proc_b.drain()
            ebpf_b.drain()
        time.sleep(3.0)
        with stopped(pid):  # ...and end here, with the sleeper stopped: the same window, however loaded the machine
            proc_d = proc_b.drain()
            ebpf_d = ebpf_b.drain()
    finally:
        ebpf_b.close()
    got, want = _totals(ebpf_d, pid), _totals(proc_d, pid)
    assert want["switches"] > 1000 and want["rq_wait"] > 0 and want["oncpu"] > 0, want
    for key in ("oncpu", "rq_wait", "switches") if attach == "task" else ("rq_wait", "switches"):
        assert abs(got[key] - want[key]) <= 0.01 * want[key], (key, got, want)


def test_a_switch_storm_is_counted_switch_for_switch(ebpf):
    """``perf bench sched pipe`` with both ends on one CPU (hundreds of thousands of switches a second
    here), every task traced: the switches counted for its two processes are those the kernel counted
    for them (``getrusage`` of the reaped children), none lost and nothing counted as dropped."""
    import resource

    from aaco.agent.sources.sched.ebpf import EbpfBackend, EbpfSettings

    loops = 100_000
    backend = EbpfBackend(EbpfSettings(all_tasks=True))
    try:
        backend.drain()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        pipe = ["taskset", "-c", "0", "perf", "bench", "sched", "pipe", "-l", str(loops)]
        perf = subprocess.Popen(pipe, stdout=subprocess.PIPE, text=True)
        out, _ = perf.communicate(timeout=120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        d = backend.drain()
    finally:
        backend.close()
    assert perf.returncode == 0 and "ops/sec" in out, out
    mine = np.isin(d.threads.tgid, [perf.pid]) | np.array([c == "sched-pipe" for c in d.threads.comm], bool)
    assert len(set(d.threads.tgid[mine].tolist())) == 2  # perf and its forked partner
    v = d.threads.values
    counted = (int(v[rows.VOLUNTARY][mine].sum()), int(v[rows.INVOLUNTARY][mine].sum()))
    kernel = (after.ru_nvcsw - before.ru_nvcsw, after.ru_nivcsw - before.ru_nivcsw)
    assert sum(kernel) >= 2 * loops, kernel  # each end leaves its CPU at least once per round trip
    for got, want in zip(counted, kernel, strict=True):
        assert abs(got - want) <= 20, (counted, kernel)  # the few switches of exec and exit
    assert d.dropped == {}, d.dropped


def test_a_process_made_a_target_later_is_traced(ebpf, sleeper_under_load):
    """Tracing targets only, the task program marks tasks it found untraced; a process that becomes a
    target afterwards (the targets' generation moves) is traced from then on."""
    from aaco.agent.sources.sched.ebpf import EbpfBackend, EbpfSettings

    backend = EbpfBackend(EbpfSettings())
    try:
        backend.set_targets({os.getpid()})
        time.sleep(0.3)  # the sleeper switches hundreds of times meanwhile: marked untraced
        assert sleeper_under_load not in set(backend.drain().threads.tgid.tolist())
        backend.set_targets({os.getpid(), sleeper_under_load})
        time.sleep(0.5)
        d = backend.drain()
    finally:
        backend.close()
    mine = d.threads.tgid == sleeper_under_load
    assert int(d.threads.values[rows.VOLUNTARY][mine].sum()) > 100


def test_offcpu_intervals_are_published_with_unix_times(ebpf, sleeper_under_load):
    c = collector(backend="ebpf", pids=[sleeper_under_load], offcpu_threshold_ms=0.5, max_offcpu_events=50)
    try:
        c.refresh_targets()
        before = time.time_ns()
        time.sleep(1.0)
        d = c.drain()
    finally:
        c.close()
    ev = d.events
    assert 0 < len(ev) <= 50
    assert d.dropped.get("offcpu_events_over_cap", 0) > 0  # ~1000 one-ms sleeps, 50 kept, the rest counted
    assert (ev.end_ns - ev.start_ns >= 500_000).all()
    assert (ev.start_ns > before - 10**9).all() and (ev.end_ns <= time.time_ns()).all()
    table = conform("sched", rows.drain_to_table(d, node="t", source="sched"))
    intervals = [r for r in table.to_pylist() if r["metric"] == rows.OFFCPU_INTERVAL]
    assert len(intervals) == len(ev) and all(r["offcpu_start_ns"] < r["offcpu_end_ns"] for r in intervals)


def test_program_is_unloaded_on_close(ebpf):
    before = bpf_fds()
    c = collector(backend="ebpf", include_self=True)
    assert bpf_fds() > before  # programs, maps, tracepoint attachments
    c.close()
    assert bpf_fds() == before
    c.close()  # idempotent


def test_exited_pid_is_dropped_from_the_maps(ebpf):
    proc = spawn("import time\nfor _ in range(100000):\n    time.sleep(0.001)\n")
    c = collector(backend="ebpf", pids=[proc.pid])
    backend = c.backend
    try:
        c.refresh_targets()
        time.sleep(0.5)
        c.drain()
        assert backend.kernel_targets() == {proc.pid}
        assert backend.sizes()["threads"] >= 1
        proc.kill()
        proc.wait()
        # The exit is a flag on the thread's entry, read at the next drain after the final switch:
        # poll a few drains (a loaded machine can take longer than one short sleep). The entry must
        # survive the switches a dying task still makes after its target entry is gone (an earlier
        # program deleted it there, losing the flag: this test was flaky).
        exited: list[int] = []
        deadline = time.monotonic() + 10
        while proc.pid not in exited and time.monotonic() < deadline:
            time.sleep(0.1)
            exited += c.drain().exited
        assert exited == [proc.pid]
        sizes = backend.sizes()
        assert backend.kernel_targets() == set()
        assert sizes["threads"] == sizes["user_threads"] == 0, sizes
        c.refresh_targets()  # the resolver no longer finds it either
        assert c.targets == set()
    finally:
        c.close()
        if proc.poll() is None:
            proc.kill()


def test_thousands_of_short_lived_processes_do_not_grow_memory(ebpf):
    """Every task traced, 2,000 processes that live a moment: the maps and the agent's state stay bounded."""
    c = collector(backend="ebpf", all_tasks=True, max_threads=1024)
    backend = c.backend
    churn = ["bash", "-c", "for i in $(seq 1000); do /bin/true; done"]
    try:
        c.drain()
        base = backend.sizes()
        subprocess.run(churn, check=True)
        c.drain()
        c.drain()  # exited tasks' last counters read, then deleted
        first = backend.sizes()
        subprocess.run(churn, check=True)
        c.drain()
        c.drain()
        second = backend.sizes()
    finally:
        c.close()
    for sizes in (base, first, second):
        assert max(sizes["threads"], sizes["user_threads"]) <= 1024, sizes
    live = len([p for p in os.listdir("/proc") if p.isdigit()])
    # What remains after the churn is the machine's own tasks, not the 2,000 that came and went.
    assert second["threads"] <= base["threads"] + live, (base, second)
    assert second["user_threads"] <= base["user_threads"] + live, (base, second)
    assert second["threads"] <= first["threads"] + 64, (first, second)


def test_cli_reports_per_pid_fields_and_the_backend(ebpf, aaco_bin, sleeper_under_load):
    r = run_aaco(aaco_bin, "sched", "--pid", str(sleeper_under_load), "--duration", "1.5", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["backend"] == "ebpf"
    (row,) = doc["pids"]
    assert row["pid"] == sleeper_under_load
    for key in (
        "context_switches",
        "voluntary",
        "involuntary",
        "runqueue_latency_p50_s",
        "runqueue_latency_p99_s",
        "oncpu_s",
        "offcpu_s",
        "page_faults",
    ):
        assert key in row
    assert row["context_switches"] == row["voluntary"] + row["involuntary"] > 100


def test_cli_nonexistent_pid_is_a_clear_error(aaco_bin):
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    missing = next(p for p in range(pid_max - 1, 1, -1) if not Path(f"/proc/{p}").exists())
    r = run_aaco(aaco_bin, "sched", "--pid", str(missing), "--duration", "1", timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: --pid {missing}: no such process"
    assert "Traceback" not in r.stderr


# Runs `aaco sched` in a child that drops root after loading what it needs (the interpreter itself
# may live where an unprivileged user cannot read, e.g. under /root or a 0700 temporary checkout).
# Libraries import some modules only when first used (typer's vendored click when it parses a
# command line, numpy.ma when pyarrow converts an array), so the child first runs the same command
# as root on the proc backend, its output discarded, and only then drops root and runs it for real.
UNPRIVILEGED = """
import contextlib, io, os, sys
import aaco.agent.cli as cli
import aaco.agent.sources.sched.ebpf  # the auto backend asks it why eBPF cannot run
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    try:
        cli.app([*sys.argv[1:], "--backend", "proc", "--duration", "0.1", "--log-level", "error"], prog_name="aaco")
    except SystemExit as exc:
        if exc.code:
            raise
if os.geteuid() == 0:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
assert os.geteuid() != 0
cli.app(sys.argv[1:], prog_name="aaco")
"""


def test_without_root_the_proc_backend_is_used_and_said_once(sleeper_under_load):
    args = ["sched", "--pid", str(sleeper_under_load), "--duration", "1", "--json", "--log-level", "info"]
    proc = subprocess.run(
        [sys.executable, "-c", UNPRIVILEGED, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["backend"] == "proc"
    assert "root" in doc["reason"]
    said = [ln for ln in proc.stderr.splitlines() if "using the proc backend" in ln]
    assert len(said) == 1, proc.stderr
    assert "eBPF needs root" in said[0]
    assert doc["pids"][0]["context_switches"] > 100


def test_agent_exports_sched_metrics_and_lake_rows(ebpf, aaco_bin, free_port, tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text(
        f"""node: sched-test
sources:
  - type: sched
    backend: ebpf
    gpu_processes: false
    include_self: true
    interval_s: 0.5
exporters:
  prometheus: {{port: {free_port}}}
  lake: {{path: {tmp_path / "lake"}, flush_interval_s: 0.5}}
pipeline: {{snapshot_interval_s: 0.5}}
"""
    )
    log = tmp_path / "agent.log"
    agent = start_aaco(aaco_bin, "agent", "--config", str(config), log=log)
    try:
        url = f"http://127.0.0.1:{free_port}/metrics"
        body = wait_for(
            lambda: (b := http_get(url)[1]) and "aaco_sched_runqueue_latency_seconds_bucket" in b and b,
            timeout=60,
            what="sched metrics",
        )
        assert (
            f'aaco_sched_context_switches_total{{comm="aaco",kind="voluntary",node="sched-test",pid="{agent.pid}"}}'
            in body
        )
        for name in (
            "aaco_sched_oncpu_seconds_total",
            "aaco_sched_offcpu_seconds_total",
            "aaco_sched_interference_ratio",
        ):
            assert name in body
    finally:
        agent.send_signal(2)
        agent.wait(30)
    text = log.read_text()
    assert text.count("using the ebpf backend") == 1, text
    assert agent.returncode == 0, text
    lake = read_lake(tmp_path / "lake", "sched")
    assert lake.num_rows > 0
    metrics = set(lake.column("metric").to_pylist())
    assert {rows.VOLUNTARY, rows.ONCPU, rows.RQ_LATENCY} <= metrics
    assert set(lake.column("pid").to_pylist()) == {agent.pid}


@pytest.mark.parametrize(
    ("attach", "sched_info"),
    [("task", True), ("raw", True), ("raw", False), ("classic", True), ("classic", False)],
)
def test_every_attachment_counts_the_same_thing(ebpf, sleeper_under_load, attach, sched_info):
    """Task storage on BTF-typed tracepoints where the kernel allows, else raw tracepoints (task
    offsets from BTF), classic ones as the last fallback; runqueue waits from the kernel's
    sched_info where BTF gives its offset, else from wakeups."""
    from aaco.agent.sources.sched.btf import task_layout, task_program_layout
    from aaco.agent.sources.sched.ebpf import EbpfBackend, EbpfSettings, kernel_counts_waits

    layout = task_layout()
    if attach != "classic" and layout is None:
        pytest.skip("this kernel's BTF does not give the task layout: only classic tracepoints here")
    if attach == "task" and task_program_layout() is None:
        pytest.skip("this kernel's BTF lacks what the task-storage program reads")
    if sched_info and (layout is None or layout.sched_info_offset is None or not kernel_counts_waits()):
        pytest.skip("this kernel does not keep sched_info (or BTF does not place it): waits come from wakeups")
    backend = EbpfBackend(EbpfSettings(attach=attach, sched_info=sched_info))
    try:
        assert backend.attach == attach
        assert backend.rq_source == ("sched_info" if sched_info else "wakeup")
        backend.set_targets({sleeper_under_load})
        backend.drain()
        time.sleep(1.0)
        d = backend.drain()
    finally:
        backend.close()
    assert set(d.threads.tgid.tolist()) == {sleeper_under_load}
    switches = int(d.threads.values[rows.VOLUNTARY].sum() + d.threads.values[rows.INVOLUNTARY].sum())
    assert switches > 300
    assert d.hist_count.sum() > 0


def test_compiling_does_not_move_other_threads_working_directory(ebpf):
    """libbcc chdirs into the kernel headers while it compiles; the agent's other threads never see it."""
    import threading

    from aaco.agent.sources.sched.ebpf import EbpfBackend, EbpfSettings

    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.add(os.getcwd())
            time.sleep(0.0005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        EbpfBackend(EbpfSettings()).close()
    finally:
        done.set()
        watcher.join()
    assert seen == {os.getcwd()}
