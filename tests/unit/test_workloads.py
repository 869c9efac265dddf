"""Per-workload use and energy: the workloads analyzer on process rows and a GPU's energy, and pid -> pod."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from aaco.agent.sources.gpu_procs.workloads import KubeletLogs, WorkloadResolver, cgroup_ids
from aaco.analyzers.workloads import WorkloadsAnalyzer, WorkloadsSettings
from aaco.contract.gpu_processes import GpuProcess, Workload, to_rows
from aaco.contract.schemas import EventBatch
from aaco.contract.telemetry import ENERGY, POWER, GpuIdentity, GpuSample, to_table
from tests.support.gpu_process_fakes import pmon_samples

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu-processes"
S = 1_000_000_000
UUID = "GPU-c5533cd4-5a60-059e-348d-b6d7466932e4"
GPU = GpuIdentity("0", uuid=UUID, vendor="nvidia", model="NVIDIA L4")
POD_A = Workload("encode-a", "media", "ffmpeg", job="")
POD_B = Workload("encode-b", "media", "ffmpeg")
UID_A = "1f0e9b8a-7c6d-4e5f-8a9b-0c1d2e3f4a5b"
CID_A = "a" * 64


def batch(rows: pa.RecordBatch, source: str) -> EventBatch:
    return EventBatch("telemetry", source=source, batch=rows)


def device_rows(ts: int, energy_j: float | None, power_w: float, gpu: GpuIdentity = GPU) -> pa.RecordBatch:
    s = GpuSample(gpu)
    s.add(POWER, power_w)
    s.add(ENERGY, energy_j)
    return to_table([s], ts_ns=ts, node="n1", source="smi")


def process_rows(ts: int, shares: dict[int, float], device: GpuIdentity = GPU) -> pa.RecordBatch:
    procs = [GpuProcess(device, pid, "ffmpeg", utilization=u, memory_bytes=100.0 * pid) for pid, u in shares.items()]
    return to_rows(procs, {1: POD_A, 2: POD_B}, ts_ns=ts, node="n1", source="gpu_processes")


def test_two_pods_sharing_a_gpu_split_its_energy_above_idle_by_their_sm_share():
    """The recorded shares of two processes (pmon, ten samples) drive the split; sums within 1 % (exactly here)."""
    recorded = pmon_samples(DATA / "pmon-datarhei-process_1.txt")
    a = WorkloadsAnalyzer(WorkloadsSettings(idle_power_w=16.0))
    energy, start = 5000.0, 5000.0
    a.update(batch(device_rows(0, energy, 16.0), "smi"))
    for k, sample in enumerate(recorded, start=1):
        by_pid = {r["pid"]: r["sm"] / 100 for r in sample}
        a.update(batch(process_rows(k * S, {1: by_pid[12176], 2: by_pid[20035]}), "gpu_processes"))
        energy += 16.0 + 50.0 * (by_pid[12176] + by_pid[20035])  # one second at idle plus the work
        a.update(batch(device_rows(k * S, energy, 30.0), "smi"))
    result = a.snapshot()
    by = {(e[1], e[2]): e[3] for e in result.energy}
    above_idle = (energy - start) - 16.0 * len(recorded)
    pods = (
        by[(("media", "encode-a", "ffmpeg", "", ""), "apportioned")]
        + by[(("media", "encode-b", "ffmpeg", "", ""), "apportioned")]
    )
    assert pods == pytest.approx(above_idle, rel=0.01)
    assert pods + by[(("", "", "", "", ""), "idle")] == pytest.approx(energy - start)
    assert by[(("media", "encode-a", "ffmpeg", "", ""), "apportioned")] > 0


def test_a_pod_alone_on_a_whole_gpu_has_its_energy_measured():
    a = WorkloadsAnalyzer()
    a.update(batch(device_rows(0, 100.0, 20.0), "smi"))
    a.update(batch(process_rows(S, {1: 0.5}), "gpu_processes"))
    a.update(batch(device_rows(2 * S, 400.0, 150.0), "smi"))
    energy = {(e[1][1], e[2]): e[3] for e in a.snapshot().energy}
    assert energy == {("encode-a", "measured"): 300.0, ("", "idle"): 0.0}


def test_a_gpu_without_an_energy_counter_has_its_power_integrated():
    a = WorkloadsAnalyzer(WorkloadsSettings(idle_power_w=10.0))
    a.update(batch(process_rows(0, {1: 0.2, 2: 0.6}), "gpu_processes"))
    for k, watts in enumerate((10.0, 50.0, 50.0)):
        a.update(batch(device_rows(k * S, None, watts), "smi"))
    energy = {(e[1][1], e[2]): e[3] for e in a.snapshot().energy}
    total = (10 + 50) / 2 + 50  # trapezoids: 80 J over 2 s, 20 J of them idle
    assert energy[("encode-a", "apportioned")] == pytest.approx(60 * 0.25)
    assert energy[("encode-b", "apportioned")] == pytest.approx(60 * 0.75)
    assert sum(energy.values()) == pytest.approx(total)


def test_pods_series_carry_only_what_was_measured_per_process():
    a = WorkloadsAnalyzer()
    a.update(batch(process_rows(S, {1: 0.3, 2: 0.1}), "gpu_processes"))
    a.update(batch(device_rows(S, 10.0, 70.0), "smi"))
    points = a.snapshot().points()
    pod_points = {p.metric.prom_name for p in points if p.labels["pod"]}
    assert pod_points == {
        "aaco_gpu_workload_utilization_ratio",
        "aaco_gpu_workload_memory_used_bytes",
        "aaco_gpu_workload_processes",
    }
    util = {p.labels["pod"]: p.value for p in points if p.metric.prom_name == "aaco_gpu_workload_utilization_ratio"}
    assert util == {"encode-a": 0.3, "encode-b": 0.1}


def test_a_mig_device_s_processes_are_its_own_and_its_energy_stays_the_gpu_s():
    mig = GpuIdentity("0/3/0", uuid="MIG-x", parent="0", parent_uuid=UUID, gpu_instance="3", compute_instance="0")
    a = WorkloadsAnalyzer()
    a.update(batch(device_rows(0, 0.0, 60.0), "smi"))
    a.update(batch(to_rows([GpuProcess(mig, 1, memory_bytes=5.0)], {1: POD_A}, ts_ns=S, node="n1", source="p"), "p"))
    a.update(batch(device_rows(2 * S, 200.0, 90.0), "smi"))
    result = a.snapshot()
    assert [(d[1], w[1], u.memory_bytes) for d, w, u in result.uses] == [("0/3/0", "encode-a", 5.0)]
    energy = {(e[0][1], e[1][1], e[2]): e[3] for e in result.energy}
    # no per-process activity on a MIG device (NVML does not measure it there): nothing to apportion by
    assert energy == {("0", "", "idle"): 200.0}


def test_a_newer_sample_replaces_the_workloads_of_its_source():
    a = WorkloadsAnalyzer()
    a.update(batch(process_rows(S, {1: 0.3, 2: 0.1}), "gpu_processes"))
    a.update(batch(process_rows(2 * S, {2: 0.4}), "gpu_processes"))
    assert [(w[1], u.utilization) for _d, w, u in a.snapshot().uses] == [("encode-b", 0.4)]


def test_cgroup_paths_of_both_cgroup_drivers_and_the_runtimes():
    cgroupfs = "12:pids:/kubepods/burstable/pod" + UID_A + "/" + CID_A + "\n0::/\n"
    assert cgroup_ids(cgroupfs) == (UID_A, CID_A)
    systemd = (
        "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
        + UID_A.replace("-", "_")
        + ".slice/cri-containerd-"
        + CID_A
        + ".scope\n"
    )
    assert cgroup_ids(systemd) == (UID_A, CID_A)
    assert cgroup_ids("0::/system.slice/sshd.service\n") == ("", "")
    assert (
        cgroup_ids("0::/kubepods.slice/kubepods-pod" + UID_A.replace("-", "_") + ".slice/crio-" + CID_A + ".scope")[1]
        == CID_A
    )


def test_the_kubelet_log_directories_name_pods_and_containers(tmp_path: Path):
    (tmp_path / "containers").mkdir()
    (tmp_path / "containers" / f"encode-a_media_ffmpeg-{CID_A}.log").symlink_to("/nonexistent")
    (tmp_path / "pods" / f"media_encode-a_{UID_A}" / "ffmpeg").mkdir(parents=True)
    (tmp_path / "pods" / f"media_encode-a_{UID_A}" / "sidecar").mkdir()
    (tmp_path / "pods" / "not-a-pod").mkdir()
    logs = KubeletLogs(tmp_path)
    logs.refresh()
    assert logs.containers == {CID_A: ("encode-a", "media", "ffmpeg")}
    assert logs.pods == {UID_A: ("encode-a", "media", ("ffmpeg", "sidecar"))}


def test_a_process_outside_any_pod_is_its_own_and_its_slurm_job_named(tmp_path: Path):
    proc = tmp_path / "proc"
    (proc / "42").mkdir(parents=True)
    (proc / "42" / "cgroup").write_text("0::/user.slice/user-1000.slice/session-3.scope\n")
    (proc / "42" / "environ").write_bytes(b"SLURM_JOB_ID=8812\0SLURM_JOB_USER=ana\0SLURM_JOB_PARTITION=gpu\0")
    w = WorkloadResolver(proc, None).resolve(42, GPU)
    assert (w.pod, w.job, w.job_user, w.job_partition) == ("", "8812", "ana", "gpu")
    assert WorkloadResolver(proc, None).resolve(43, GPU) == Workload()  # gone: no workload


def test_processes_named_by_index_meet_a_gpu_named_by_uuid():
    """amd-smi's process listing names GPUs by index only; the telemetry names them by UUID."""
    a = WorkloadsAnalyzer()
    a.update(batch(device_rows(0, 0.0, 100.0), "smi"))
    a.update(batch(process_rows(S, {1: 0.5}, device=GpuIdentity("0", vendor="amd")), "gpu_processes"))
    a.update(batch(device_rows(2 * S, 50.0, 100.0), "smi"))
    energy = {(e[1][1], e[2]): e[3] for e in a.snapshot().energy}
    assert energy[("encode-a", "measured")] == 50.0
