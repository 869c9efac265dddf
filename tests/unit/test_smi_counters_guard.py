"""The activity counters' back-off: another profiler on the node (a /proc tree), busy, turned off; the config."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from aaco.agent.sources.smi import SmiSourceConfig
from aaco.agent.sources.smi.counters_guard import DEFAULT_PROFILERS, CountersGuard
from aaco.contract.telemetry import GpuIdentity, GpuSample

from .smi_fakes_activity import end, proc_tree


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def found(tmp_path: Path, processes: dict[int, tuple[str, list[str]]], profilers=DEFAULT_PROFILERS):
    guard = CountersGuard(profilers, proc_root=proc_tree(tmp_path / "proc", processes))
    guard.start_sample()
    return guard.profiler


@pytest.mark.parametrize(
    ("comm", "argv", "name"),
    [
        ("ncu", ["/usr/local/cuda/bin/ncu", "--set", "full", "./app"], "ncu"),
        ("nsys", ["nsys", "profile", "python", "train.py"], "nsys"),
        ("nv-nsight-cu-cli", ["/opt/nvidia/nv-nsight-cu-cli", "./app"], "nv-nsight-cu-cli"),  # comm cut to 15
        ("python3", ["/usr/bin/python3", "/opt/rocm/bin/rocprofv3", "--kernel-trace", "--", "./app"], "rocprofv3"),
        ("rocprofv3", ["/usr/bin/python3", "-u", "/opt/rocm/bin/rocprofv3", "--sys-trace"], "rocprofv3"),
        ("bash", ["/bin/bash", "/opt/rocm/bin/rocprof", "--stats", "./app"], "rocprof"),
        ("rocprof-compute", ["/usr/bin/python3", "/opt/rocm/bin/rocprof-compute", "profile"], "rocprof-compute"),
        ("omniperf", ["/usr/bin/python3", "/usr/bin/omniperf", "profile", "-n", "x"], "omniperf"),
        ("dcgmi", ["dcgmi", "profile", "--pause"], "dcgmi"),
        ("aaco", ["/usr/bin/python3", "/usr/local/bin/aaco", "capture", "--pid", "42"], "aaco"),
    ],
)
def test_profilers_are_found_by_name_script_or_argument(tmp_path: Path, comm: str, argv: list[str], name: str):
    assert found(tmp_path, {1: ("systemd", ["/sbin/init"]), 4242: (comm, argv)}) == (name, 4242)


@pytest.mark.parametrize(
    ("comm", "argv"),
    [
        ("dcgmi", ["dcgmi", "discovery", "-l"]),  # dcgmi without profile
        ("aaco", ["/usr/bin/python3", "/usr/local/bin/aaco", "agent", "--config", "capture"]),  # capture as a value
        ("python3", ["/usr/bin/python3", "train.py", "--profile-with", "ncu"]),  # a word, not the program
        ("ncu-helper", ["ncu-helper"]),
        ("kworker/u16:2-e", []),  # a kernel thread: no cmdline
    ],
)
def test_other_processes_are_not_profilers(tmp_path: Path, comm: str, argv: list[str]):
    assert found(tmp_path, {4242: (comm, argv)}) is None


def test_own_process_vanished_processes_and_no_proc_are_not_profilers(tmp_path: Path):
    assert found(tmp_path, {os.getpid(): ("aaco", ["aaco", "capture"])}) is None
    proc = proc_tree(tmp_path / "p2", {9: ("ncu", ["ncu"])})
    (proc / "9" / "comm").unlink()  # exited between the listing and the read
    guard = CountersGuard(["ncu"], proc_root=proc)
    guard.start_sample()
    assert guard.profiler is None
    guard = CountersGuard(["ncu"], proc_root=tmp_path / "absent")
    guard.start_sample()
    assert guard.profiler is None
    assert found(tmp_path, {9: ("ncu", ["ncu"])}, profilers=[]) is None  # profilers: [] never looks


def test_the_process_table_is_read_at_most_every_few_seconds(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    proc = proc_tree(tmp_path / "proc", {})
    clock = Clock()
    guard = CountersGuard(["rocprofv3"], proc_root=proc, scan_every_s=5.0, clock=clock)
    with caplog.at_level(logging.INFO, logger="aaco.sources.smi"):
        guard.start_sample()
        proc_tree(proc, {300: ("python3", ["python3", "/opt/rocm/bin/rocprofv3", "-d", "out"])})
        clock.t = 4.9
        guard.start_sample()
        assert not guard.paused("0")  # not looked again yet
        clock.t = 5.0
        for _ in range(3):
            guard.start_sample()
            clock.t += 5.0
        assert guard.paused("0") and guard.reason("0") == "another_profiler"
        end(proc, 300)
        for _ in range(3):
            guard.start_sample()
            clock.t += 5.0
        assert not guard.paused("0")
    assert caplog.messages == [
        "activity counters paused: another profiler runs (rocprofv3, pid 300)",
        "activity counters resumed: rocprofv3 (pid 300) is gone",
    ]


def sample() -> GpuSample:
    s = GpuSample(GpuIdentity("0"))
    s.add("aaco.gpu.sm.active", 0.5)
    s.add("hw.gpu.utilization", 0.9)
    return s


def paused(s: GpuSample) -> dict[str, float]:
    return {dict(r.attrs)["reason"]: r.value for r in s.readings if r.metric == "aaco.gpu.counters.paused"}


def test_publish_says_why_and_withholds_the_activity_readings(tmp_path: Path):
    guard = CountersGuard(["ncu"], proc_root=proc_tree(tmp_path / "proc", {}))
    guard.start_sample()
    s = sample()
    guard.publish("0", s)
    assert paused(s) == {"another_profiler": 0.0, "busy": 0.0, "off": 0.0}
    assert s.has("aaco.gpu.sm.active")
    guard.busy("0")
    s = sample()
    guard.publish("0", s)
    assert paused(s)["busy"] == 1.0 and not s.has("aaco.gpu.sm.active") and s.has("hw.gpu.utilization")
    s = sample()
    guard.publish("0", s)
    assert paused(s)["busy"] == 0.0  # busy was that sample's


def test_consecutive_failures_turn_a_gpu_off_until_restart(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    guard = CountersGuard([], max_failures=3)
    with caplog.at_level(logging.WARNING, logger="aaco.sources.smi"):
        guard.failed("0", "x")
        guard.failed("0", "x")
        guard.succeeded("0")  # a success between: the count starts again
        guard.failed("0", "x")
        guard.failed("0", "x")
        assert not guard.is_off("0")
        guard.failed("0", "boom")
        guard.succeeded("0")  # too late: off stays off
        guard.failed("0", "again")
    assert guard.is_off("0") and guard.paused("0") and guard.reason("0") == "off"
    assert not guard.paused("1")  # per GPU
    assert len(caplog.messages) == 1 and "GPU 0" in caplog.messages[0] and "boom" in caplog.messages[0]


def test_smi_config_passes_activity_settings_to_the_backends():
    cfg = SmiSourceConfig(kubelet_socket=None)
    opts = cfg.backend_options()
    assert (opts.activity, opts.activity_max_failures, opts.profilers) == (True, 3, DEFAULT_PROFILERS)
    cfg = SmiSourceConfig(kubelet_socket=None, activity=False, activity_max_failures=5, profilers=["ncu", "dcgmi dmon"])
    opts = cfg.backend_options()
    assert (opts.activity, opts.activity_max_failures, opts.profilers) == (False, 5, ("ncu", "dcgmi dmon"))
    assert opts.counters_guard() is None
    with pytest.raises(ValueError, match="activity_max_failures"):
        SmiSourceConfig(kubelet_socket=None, activity_max_failures=0)
