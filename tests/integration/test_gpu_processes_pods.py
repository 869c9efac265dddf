"""Two real processes sharing a GPU, each in its pod: the cgroups are real, so is the kubelet's gRPC API.

The two processes are placed in cgroups named as the kubelet names them (one under the cgroupfs
driver's layout, one under the systemd driver's with containerd's scope), the kubelet's log
directories name their pods, and a fake kubelet serving the real pod-resources API says which
container of the second pod holds the GPU (time-sliced: the device plugin's replicas ``::0`` and
``::1``). NVML is a double serving the recorded ``nvidia-smi pmon`` samples of two processes of a
real shared GPU, their pids replaced by the live ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.gpu_procs import GpuProcessesSource, GpuProcessesSourceConfig
from aaco.agent.sources.gpu_procs.backends import open_backend
from aaco.agent.sources.smi.backends import BackendOptions
from aaco.agent.sources.smi.pods import PodAttribution
from aaco.analyzers.workloads import WorkloadsAnalyzer, WorkloadsSettings
from aaco.contract import telemetry as m
from aaco.contract.gpu_processes import ATTR_CONTAINER_ID, ATTR_PID, ATTR_POD_UID, PROCESS_METRICS
from aaco.contract.schemas import EventBatch
from aaco.contract.stats import Stats
from aaco.contract.telemetry import ENERGY, POWER, GpuIdentity, GpuSample, to_table
from tests.conftest import skip_or_fail
from tests.support.fake_kubelet import FakeKubelet, pod
from tests.support.gpu_process_fakes import fake_nvml, pmon_samples

from .helpers import http_get, metric_value, read_lake, start_aaco, wait_for

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data" / "gpu-processes"
UUID = "GPU-c5533cd4-5a60-059e-348d-b6d7466932e4"
UID_A, CID_A = "3b9f2c1e-5d4a-4e8b-9c7d-1a2b3c4d5e6f", "a1" * 32
UID_B, CID_B = "7e6d5c4b-3a29-4180-8f7e-6d5c4b3a2918", "b2" * 32
CGROUPS = Path("/sys/fs/cgroup")


@contextmanager
def in_cgroup(pid: int, hierarchy: Path, relative: Path) -> Iterator[None]:
    """``pid`` moved into the (new) cgroup ``relative`` of a v1 ``hierarchy``; moved back and removed afterwards."""
    directory = hierarchy / relative
    made = []
    for parent in reversed([directory, *directory.parents]):
        if not parent.exists():
            parent.mkdir()
            made.append(parent)
    (directory / "cgroup.procs").write_text(str(pid))
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):  # it ended: its cgroup is empty
            (hierarchy / "cgroup.procs").write_text(str(pid))
        for d in reversed(made):
            d.rmdir()


def test_two_processes_on_one_gpu_are_attributed_to_their_pods(tmp_path: Path):
    pids_root = CGROUPS / "pids"
    if not (pids_root / "cgroup.procs").exists() or not os.access(pids_root, os.W_OK):
        skip_or_fail("no writable cgroup v1 pids hierarchy at /sys/fs/cgroup/pids (needs root)")
    logs = tmp_path / "log"
    (logs / "containers").mkdir(parents=True)
    (logs / "containers" / f"encode-a_media_ffmpeg-{CID_A}.log").symlink_to(logs / "pods" / "x.log")
    for container in ("server", "metrics"):  # pod B has two containers: the kubelet says which holds the GPU
        (logs / "pods" / f"llm_serve-b_{UID_B}" / container).mkdir(parents=True)
    a = subprocess.Popen(["sleep", "120"])
    b = subprocess.Popen(["sleep", "120"])
    try:
        with (
            in_cgroup(a.pid, pids_root, Path("kubepods") / "besteffort" / f"pod{UID_A}" / CID_A),
            in_cgroup(
                b.pid,
                CGROUPS / "systemd",
                Path("kubepods.slice")
                / "kubepods-burstable.slice"
                / f"kubepods-burstable-pod{UID_B.replace('-', '_')}.slice"
                / f"cri-containerd-{CID_B}.scope",
            ),
            FakeKubelet(tmp_path / "kubelet.sock") as kubelet,
        ):
            kubelet.pods = [
                pod("encode-a", "media", "ffmpeg", "nvidia.com/gpu", f"{UUID}::0"),
                pod("serve-b", "llm", "server", "nvidia.com/gpu", f"{UUID}::1"),
            ]
            recorded = pmon_samples(DATA / "pmon-datarhei-process_1.txt")
            nvml = fake_nvml(recorded, {12176: a.pid, 20035: b.pid}, uuid=UUID)
            cfg = GpuProcessesSourceConfig(backend="nvml", kubelet_logs=logs, kubelet_socket=kubelet.socket)
            src = GpuProcessesSource(cfg, "gpu_processes", BackendOptions(modules={"pynvml": nvml}))
            src.backend = open_backend("nvml", src.options)
            src.pods = PodAttribution(kubelet.socket, refresh_s=60)
            stats = Stats()
            ctx = SourceContext("node-a", stats, Bus(stats), Journal(stats))
            src.sample_once(ctx)
            src.sample_once(ctx)
            src.pods.close()
            src.backend.close()
    finally:
        for p in (a, b):
            p.kill()
            p.wait()
    ctx.bus.get(0)  # the first sample: memory only (the driver's older samples are not this interval's)
    item = ctx.bus.get(0)
    newest = item.batch.to_pylist()
    by_pod = {}
    for r in newest:
        attrs = dict(r["attributes"])
        by_pod.setdefault(attrs[m.ATTR_POD], []).append((r, attrs))
    assert set(by_pod) == {"encode-a", "serve-b"}
    a_attrs = by_pod["encode-a"][0][1]
    assert (a_attrs[m.ATTR_NAMESPACE], a_attrs[m.ATTR_CONTAINER], a_attrs[ATTR_PID]) == ("media", "ffmpeg", str(a.pid))
    assert (a_attrs[ATTR_POD_UID], a_attrs[ATTR_CONTAINER_ID]) == (UID_A, CID_A)
    b_attrs = by_pod["serve-b"][0][1]
    assert (b_attrs[m.ATTR_NAMESPACE], b_attrs[m.ATTR_CONTAINER], b_attrs[ATTR_PID]) == ("llm", "server", str(b.pid))
    assert b_attrs["process.executable.name"] == "sleep"  # NVML names no process: /proc/<pid>/comm does
    for held in by_pod.values():  # only what was measured for the process, never the GPU's readings
        assert {r["metric"] for r, _ in held} == PROCESS_METRICS
        assert all(r["device"] == "0" and r["gpu_uuid"] == UUID for r, _ in held)
    values = {(attrs[m.ATTR_POD], r["metric"]): r["value"] for pod_rows in by_pod.values() for r, attrs in pod_rows}
    second = {r["pid"]: r for r in recorded[1]}  # the driver's samples of the second interval
    assert values[("encode-a", m.PROCESS_UTILIZATION)] == pytest.approx(second[12176]["sm"] / 100)
    assert values[("serve-b", m.PROCESS_UTILIZATION)] == pytest.approx(second[20035]["sm"] / 100)
    assert values[("serve-b", m.PROCESS_MEMORY_USAGE)] == 1145 * 2**20

    # the two pods' energy: the GPU's energy above idle split by those shares
    analyzer = WorkloadsAnalyzer(WorkloadsSettings(idle_power_w=16.0))
    gpu = GpuIdentity("0", uuid=UUID, vendor="nvidia")

    def device(ts: int, joules: float) -> EventBatch:
        s = GpuSample(gpu)
        s.add(POWER, 20.0)
        s.add(ENERGY, joules)
        return EventBatch("telemetry", to_table([s], ts_ns=ts, node="node-a", source="smi"), source="smi")

    t = newest[0]["ts_ns"]
    analyzer.update(device(t - 10**9, 1000.0))
    analyzer.update(item)
    analyzer.update(device(t + 10**9, 1100.0))
    energy = {(w[1], method): j for _d, w, method, j in analyzer.snapshot().energy}
    assert energy[("encode-a", "apportioned")] + energy[("serve-b", "apportioned")] == pytest.approx(
        100.0 - 32.0, rel=0.01
    )
    share_a = second[12176]["sm"] / (second[12176]["sm"] + second[20035]["sm"])
    assert energy[("encode-a", "apportioned")] == pytest.approx(68.0 * share_a)


def test_agent_serves_each_process_s_use_of_four_gpus(tmp_path: Path, aaco_bin: str, free_port: int):
    """``aaco agent`` on a real pmon capture of four Blackwell GPUs: series per process, rows in the lake."""
    lake = tmp_path / "lake"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"""
node: gpu-node-1
sources:
  - type: gpu_processes
    backend: file
    file: {DATA / "pmon-candy-top-skynet2.txt"}
    interval_s: 0.2
    kubelet_logs: null
    kubelet_socket: null
exporters:
  prometheus: {{port: {free_port}}}
  lake: {{path: {lake}, flush_interval_s: 0.5}}
pipeline: {{snapshot_interval_s: 0.2}}
"""
    )
    proc = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=tmp_path / "agent.log")
    try:
        url = f"http://127.0.0.1:{free_port}/metrics"

        def scraped() -> str | None:
            status, body = http_get(url)
            return body if status == 200 and "aaco_gpu_workload_utilization_ratio{" in body else None

        body = wait_for(scraped, timeout=60, what="per-workload metrics on /metrics")
        where = {"node": "gpu-node-1", "pod": ""}
        assert (
            metric_value(body, "aaco_gpu_workload_utilization_ratio", gpu="0", process="sglang::schedul", **where)
            == 0.92
        )
        assert (
            metric_value(body, "aaco_gpu_workload_memory_utilization_ratio", gpu="3", process="sgl_diffusion::") == 0.7
        )
        assert metric_value(body, "aaco_gpu_workload_memory_used_bytes", gpu="2", process="python3") == 550 * 2**20
        assert metric_value(body, "aaco_gpu_workload_processes", gpu="2", process="sgl_diffusion::") == 1.0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, (tmp_path / "agent.log").read_text()[-3000:]
    rows = [r for r in read_lake(lake, "telemetry").to_pylist() if r["metric"] == m.PROCESS_UTILIZATION]
    assert {(r["device"], dict(r["attributes"])[ATTR_PID]) for r in rows} == {
        ("0", "2094147"),
        ("1", "2094383"),
        ("2", "377306"),
        ("2", "377813"),
        ("3", "377306"),
        ("3", "377814"),
    }
    analysis = json.loads((lake / "analysis.json").read_text())
    assert {w["process"] for w in analysis["workloads"]["workloads"]} == {
        "sglang::schedul",
        "python3",
        "sgl_diffusion::",
    }
