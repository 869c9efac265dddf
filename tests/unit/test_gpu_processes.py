"""The ``gpu_processes`` readers on real recorded listings, the NVML reader on a double fed from one."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from aaco.agent.sources.gpu_procs import amd
from aaco.agent.sources.gpu_procs.backends import parse_capture
from aaco.agent.sources.gpu_procs.nvidia_smi import parse_pmon, parse_processes
from aaco.agent.sources.gpu_procs.nvml import NvmlProcessReader
from aaco.agent.sources.smi.values import TelemetryFormatError
from tests.support.gpu_process_fakes import fake_nvml, pmon_samples

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu-processes"
NVSMI = Path(__file__).resolve().parents[1] / "data" / "nvidia-smi"
MIB = 2**20


def test_pmon_of_five_processes_sharing_a_gpu_averages_their_samples():
    snap = parse_pmon((DATA / "pmon-datarhei-process_1.txt").read_bytes(), "process_1")
    assert snap.problems == []
    by_pid = {p.pid: p for p in snap.processes}
    assert sorted(by_pid) == [7372, 12176, 20035, 20141, 29591]
    assert {p.device.index for p in snap.processes} == {"0"}
    # pid 12176's sm column over the file's ten samples
    sm = [
        int(ln.split()[3])
        for ln in (DATA / "pmon-datarhei-process_1.txt").read_text().splitlines()
        if ln.split()[1:2] == ["12176"] and ln.split()[3] != "-"
    ]
    assert len(sm) == 10
    assert by_pid[12176].utilization == pytest.approx(sum(sm) / 10 / 100)
    assert by_pid[12176].memory_bytes == 782 * MIB
    assert by_pid[12176].name == "ffmpeg" and by_pid[12176].type == "compute"
    # pid 20141's sm column, read by hand: 2 - 2 3 - 5 7 4 7 5; a "-" (no utilisation sample) counts as 0
    assert by_pid[20141].utilization == pytest.approx((2 + 0 + 2 + 3 + 0 + 5 + 7 + 4 + 7 + 5) / 10 / 100)


def test_pmon_of_four_blackwell_gpus_with_an_idle_process_on_two():
    snap = parse_pmon((DATA / "pmon-candy-top-skynet2.txt").read_bytes(), "skynet2")
    got = {(p.device.index, p.pid): (p.utilization, p.memory_utilization, p.memory_bytes) for p in snap.processes}
    assert got[("0", 2094147)] == pytest.approx((0.92, 0.52, 90480 * MIB))
    assert got[("2", 377306)] == (0.0, 0.0, 550 * MIB)  # python3 holding memory on GPUs 2 and 3, no SM time
    assert got[("3", 377306)] == (0.0, 0.0, 550 * MIB)
    assert got[("3", 377814)] == pytest.approx((1.0, 0.7, 47560 * MIB))
    assert len(got) == 6


def test_pmon_rows_without_a_process_are_skipped():
    snap = parse_pmon((DATA / "pmon-datarhei-process_2.txt").read_bytes(), "process_2")
    assert [(p.device.index, p.pid) for p in snap.processes] == [("0", 3908637)]
    assert snap.processes[0].utilization == pytest.approx(0.048)


def test_pmon_refuses_what_is_not_pmon():
    with pytest.raises(TelemetryFormatError, match="no '# gpu pid type' header"):
        parse_pmon(b"hello\n", "x")


def test_xml_processes_of_two_l4_with_their_gpus_and_memory():
    snap = parse_processes(gzip.decompress((DATA / "nvidia-smi-datarhei-query2-2xL4.xml.gz").read_bytes()), "q2")
    got = [(p.device.index, p.device.uuid, p.pid, p.name, p.memory_bytes) for p in snap.processes]
    assert got == [
        ("0", "GPU-c5533cd4-5a60-059e-348d-b6d7466932e4", 10131, "ffmpeg", 389 * MIB),
        ("0", "GPU-c5533cd4-5a60-059e-348d-b6d7466932e4", 13597, "ffmpeg", 1054 * MIB),
        ("1", "GPU-128ab6fb-6ec9-fd74-b479-4a5fd14f55bd", 16870, "ffmpeg", 549 * MIB),
    ]
    assert all(p.utilization is None for p in snap.processes)  # the XML measures memory only


def test_xml_process_types_and_windows_processes_without_memory():
    t4 = parse_processes((NVSMI / "tesla-t4.xml").read_bytes(), "t4")
    assert [(p.pid, p.type, p.memory_bytes) for p in t4.processes] == [
        (675, "graphics", 22 * MIB),
        (5762, "compute", 1005 * MIB),
    ]
    p4 = parse_processes((NVSMI / "tesla_p4.xml").read_bytes(), "p4")
    assert len(p4.processes) == 13 and {p.type for p in p4.processes} == {"compute+graphics"}
    assert all(p.memory_bytes is None for p in p4.processes)  # N/A under WDDM


def test_amd_smi_process_json_of_rocm_6_2():
    snap = parse_capture((DATA / "amd-smi-process-rocm-6.2-changelog.json").read_bytes(), "changelog")
    assert [(p.device.index, p.pid, p.name, p.memory_bytes) for p in snap.processes] == [
        ("0", 420157, "TransferBench", 0.0),
        ("0", 420315, "rvs", 0.0),
    ]


def _pr6396() -> list:
    text = (DATA / "amd-smi-process-by-pid-pr6396.txt").read_text()
    lines = text.splitlines()
    cut = next(i for i, ln in enumerate(lines) if ln.strip() == '"..."')  # the author's elision (README)
    lines[cut - 1] = lines[cut - 1].rstrip().rstrip(",")
    del lines[cut]
    return json.loads("\n".join(lines))


def test_amd_smi_process_json_keyed_by_pid_with_engine_time():
    doc = _pr6396()
    rates = amd.EngineRates()
    snap = amd.parse_processes(doc, "pr6396", rates)
    assert [(p.device.index, p.pid, p.name, p.memory_bytes) for p in snap.processes] == [
        ("0", 2168274, "/usr/bin/python3.12", 48000.0),
        ("1", 2168274, "/usr/bin/python3.12", 65588000.0),
    ]
    assert all(p.utilization is None for p in snap.processes)  # a first sample has no rate yet


def test_engine_time_becomes_a_share_of_wall_time():
    rates = amd.EngineRates()
    assert rates.share("0", 7, 1_000_000, now_ns=10**9) is None
    assert rates.share("0", 7, 251_000_000, now_ns=2 * 10**9) == pytest.approx(0.25)
    assert rates.share("0", 7, 100, now_ns=3 * 10**9) is None  # the count went back: a new process with that pid
    assert rates.share("0", 7, None) is None


def test_nvml_reader_averages_the_driver_samples_since_its_last_read():
    samples = pmon_samples(DATA / "pmon-datarhei-process_1.txt")
    reader = NvmlProcessReader(fake_nvml(samples, {12176: 501, 20035: 502}))
    first = reader.sample()
    assert {p.pid: p.utilization for p in first.processes} == {501: None, 502: None}  # the driver's old buffer
    second = reader.sample()
    by_pid = {p.pid: p for p in second.processes}
    rec = {r["pid"]: r for r in samples[1]}
    assert by_pid[501].utilization == pytest.approx(rec[12176]["sm"] / 100)
    assert by_pid[502].memory_utilization == pytest.approx(rec[20035]["mem"] / 100)
    assert by_pid[501].memory_bytes == 782 * MIB
    assert by_pid[501].device.uuid == "GPU-c5533cd4-5a60-059e-348d-b6d7466932e4"
    assert second.problems == []
