"""AMD's activity readings: the AMD SMI library (a double with its API shape), ``amd-smi metric``'s usage
(the real capture), and their back-off."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from aaco.agent.sources.smi.amd_smi import parse_amd_smi
from aaco.agent.sources.smi.amdsmi_lib import AmdSmiReader
from aaco.agent.sources.smi.backends import BackendOptions, open_backend
from aaco.agent.sources.smi.counters_guard import ACTIVITY_METRICS, CountersGuard
from aaco.contract.telemetry import COUNTERS_PAUSED, GpuSample, Snapshot

from .smi_fakes import FakeAmdGpu
from .smi_fakes_activity import FakeAmdActivity, end, fake_amdsmi_activity, proc_tree

BUSY, NOT_SUPPORTED, API_FAILED = 30, 2, 7  # amdsmi_status_t


def activity(s: GpuSample) -> dict[str, float]:
    return {r.metric: r.value for r in s.readings if r.metric in ACTIVITY_METRICS}


def paused(s: GpuSample) -> dict[str, float]:
    return {dict(r.attrs)["reason"]: r.value for r in s.readings if r.metric == COUNTERS_PAUSED}


def reader(tmp_path: Path, answers: list[FakeAmdActivity], **guard: object) -> tuple[object, AmdSmiReader, Path]:
    gpus = [FakeAmdGpu(uuid=f"uuid-{i}", bdf=f"0000:0{i}:00.0") for i in range(len(answers))]
    lib = fake_amdsmi_activity(gpus, answers)
    proc = proc_tree(tmp_path / "proc", {1: ("systemd", ["/sbin/init"])})
    return lib, AmdSmiReader(lib, CountersGuard(["rocprofv3"], proc_root=proc, scan_every_s=0.0, **guard)), proc  # type: ignore[arg-type]


def test_library_activity_as_ratios_media_the_busiest_engine(tmp_path: Path):
    _, r, _ = reader(tmp_path, [FakeAmdActivity(), FakeAmdActivity(mm_activity=40, vcn_busy=[[5, "N/A"], [70, 3]])])
    snap = r.sample()
    first, second = snap.gpus
    assert activity(first) == pytest.approx(
        {"aaco.gpu.graphics.active": 0.92, "aaco.gpu.dram.active": 0.35, "aaco.gpu.media.active": 0.19}
    )  # gfx 92 %, umc 35 %, mm N/A and VCN 0 at 19 %
    assert activity(second)["aaco.gpu.media.active"] == pytest.approx(0.70)  # XCP 1's VCN 0
    assert paused(first) == {"another_profiler": 0.0, "busy": 0.0, "off": 0.0}
    assert first.has("hw.gpu.utilization") and snap.problems == []


def test_library_activity_off_gives_none_and_unsupported_gives_nothing(tmp_path: Path):
    lib = fake_amdsmi_activity([FakeAmdGpu()], [FakeAmdActivity()])
    s = AmdSmiReader(lib).sample().gpus[0]  # no guard: activity off
    assert activity(s) == {} and paused(s) == {}
    _, r, _ = reader(tmp_path, [FakeAmdActivity(errors=[NOT_SUPPORTED])])
    s = r.sample().gpus[0]
    assert activity(s) == {} and paused(s) == {}


def test_library_busy_pauses_that_sample_without_a_problem(tmp_path: Path):
    _, r, _ = reader(tmp_path, [FakeAmdActivity(errors=[BUSY])])
    snap = r.sample()
    s = snap.gpus[0]
    assert paused(s) == {"another_profiler": 0.0, "busy": 1.0, "off": 0.0}
    assert activity(s) == {} and not s.has("hw.gpu.utilization") and snap.problems == []
    assert activity(r.sample().gpus[0])["aaco.gpu.graphics.active"] == pytest.approx(0.92)


def test_library_failures_turn_activity_off_utilisation_goes_on(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    answers = FakeAmdActivity(errors=[API_FAILED] * 3)
    lib, r, _ = reader(tmp_path, [answers])
    with caplog.at_level(logging.WARNING, logger="aaco.sources.smi"):
        snaps = [r.sample() for _ in range(5)]
    assert [paused(s.gpus[0])["off"] for s in snaps] == [0, 0, 1, 1, 1]
    assert [len(s.problems) for s in snaps] == [1, 1, 1, 0, 0]
    assert activity(snaps[-1].gpus[0]) == {} and snaps[-1].gpus[0].has("hw.gpu.utilization")
    assert len([m for m in caplog.messages if "turned off" in m]) == 1
    assert lib.calls["amdsmi_get_gpu_activity"] == 5  # the utilisation's call is still made


def test_another_profiler_withholds_library_activity(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    _, r, proc = reader(tmp_path, [FakeAmdActivity(), FakeAmdActivity()])
    proc_tree(proc, {555: ("python3", ["/usr/bin/python3", "/opt/rocm/bin/rocprofv3", "--pmc", "SQ_WAVES", "--"])})
    with caplog.at_level(logging.INFO, logger="aaco.sources.smi"):
        during = r.sample()
        assert all(paused(s)["another_profiler"] == 1.0 and activity(s) == {} for s in during.gpus)
        assert all(s.has("hw.gpu.utilization") for s in during.gpus)
        end(proc, 555)
        after = r.sample()
    assert all(paused(s)["another_profiler"] == 0.0 and "aaco.gpu.graphics.active" in activity(s) for s in after.gpus)
    assert [m for m in caplog.messages if "activity" in m] == [
        "activity counters paused: another profiler runs (rocprofv3, pid 555)",
        "activity counters resumed: rocprofv3 (pid 555) is gone",
    ]


def test_amd_smi_usage_of_the_real_capture(samples: Path):
    """MI300X: gfx and umc at 0 %, mm_activity 0 while VCN 0 is 19 % busy."""
    path = samples / "amd-smi" / "amd-smi-metric.json"
    snap = parse_amd_smi(json.loads(path.read_text()), str(path))
    assert activity(snap.gpus[0]) == pytest.approx(
        {"aaco.gpu.graphics.active": 0.0, "aaco.gpu.dram.active": 0.0, "aaco.gpu.media.active": 0.19}
    )
    assert snap.problems == []


def test_amd_smi_per_partition_vcn_busy(samples: Path):
    doc = json.loads((samples / "amd-smi" / "amd-smi-metric.json").read_text())
    usage = doc[0]["usage"]
    usage["vcn_activity"] = ["N/A"] * 4
    usage["vcn_busy"] = {"xcp_0": [{"value": 12, "unit": "%"}, "N/A"], "xcp_1": [{"value": 55, "unit": "%"}, "N/A"]}
    snap = parse_amd_smi(doc, "x")
    assert activity(snap.gpus[0])["aaco.gpu.media.active"] == pytest.approx(0.55)
    usage["vcn_busy"] = {"xcp_0": [[[1]]]}
    snap = parse_amd_smi(doc, "cap.json")
    assert [p.field for p in snap.problems] == ["gpu[0].usage.vcn_busy.xcp_0[0]"]


def amd_smi_tool(samples: Path, tmp_path: Path) -> Path:
    tool = tmp_path / "amd-smi"
    tool.write_text(
        f'#!/bin/sh\ncase "$1" in metric) cat {samples / "amd-smi" / "amd-smi-metric.json"};; *) echo "[]";; esac\n'
    )
    tool.chmod(0o755)
    return tool


def test_amd_smi_backend_pauses_or_drops_the_activity_readings(samples: Path, tmp_path: Path):
    tool = amd_smi_tool(samples, tmp_path)
    off: Snapshot = open_backend("amd-smi", BackendOptions(amd_smi=str(tool))).sample()
    assert activity(off.gpus[0]) == {} and paused(off.gpus[0]) == {}  # activity off: none
    proc = proc_tree(tmp_path / "proc", {})
    backend = open_backend("amd-smi", BackendOptions(amd_smi=str(tool), activity=True, proc_root=proc))
    s = backend.sample().gpus[0]
    assert activity(s)["aaco.gpu.media.active"] == pytest.approx(0.19) and paused(s)["another_profiler"] == 0.0
    proc_tree(proc, {8: ("omniperf", ["omniperf", "profile", "-n", "run"])})
    backend = open_backend("amd-smi", BackendOptions(amd_smi=str(tool), activity=True, proc_root=proc))
    s = backend.sample().gpus[0]
    assert activity(s) == {} and paused(s)["another_profiler"] == 1.0
    assert s.has("hw.gpu.utilization")


def test_amdsmi_backend_with_activity_on(tmp_path: Path):
    lib = fake_amdsmi_activity([FakeAmdGpu()], [FakeAmdActivity()])
    opts = BackendOptions(modules={"amdsmi": lib}, activity=True, proc_root=proc_tree(tmp_path / "proc", {}))
    s = open_backend("amdsmi", opts).sample().gpus[0]
    assert activity(s)["aaco.gpu.dram.active"] == pytest.approx(0.35)
