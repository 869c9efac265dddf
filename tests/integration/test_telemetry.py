"""GPU telemetry end to end: per-pod labels from a fake kubelet (real gRPC over a Unix socket), the
agent serving aaco_gpu_* on /metrics and writing the lake, and the ``aaco telemetry`` command."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
from pathlib import Path

import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.smi import SmiSource, SmiSourceConfig
from aaco.agent.sources.smi.backends import open_backend
from aaco.agent.sources.smi.pods import PodAttribution
from aaco.contract.stats import Stats
from aaco.contract.telemetry import GpuIdentity
from tests.conftest import ROOT, sample_bytes
from tests.support.fake_kubelet import FakeKubelet, pod

from .helpers import http_get, metric_value, read_lake, run_aaco, run_aaco_each, start_aaco, wait_for

pytestmark = pytest.mark.integration

NV_UUID = "GPU-513536b6-7d19-9063-b049-1e69664bb298"


@pytest.fixture
def kubelet(tmp_path: Path):
    with FakeKubelet(tmp_path / "kubelet.sock") as k:
        yield k


def context() -> SourceContext:
    stats = Stats()
    return SourceContext("node-a", stats, Bus(stats), Journal(stats))


def test_attribution_by_uuid_pci_address_and_time_sliced_replicas(kubelet: FakeKubelet):
    kubelet.pods = [
        pod("train-0", "ml", "trainer", "nvidia.com/gpu", NV_UUID),
        pod("infer-a", "serving", "server", "amd.com/gpu", "0000:83:00.0"),
        pod("infer-b", "serving", "server", "amd.com/gpu", "0000:83:00.0::1"),
        pod("other", "x", "c", "example.com/fpga", "0000:a3:00.0"),
    ]
    pods = PodAttribution(kubelet.socket, refresh_s=60)
    got = pods.lookup(
        [
            GpuIdentity("0", uuid=NV_UUID),
            GpuIdentity("1", pci_bus="0000:83:00.0"),
            GpuIdentity("2", pci_bus="0000:a3:00.0"),
        ]
    )
    pods.close()
    assert got == {
        "0": {"k8s.pod.name": "train-0", "k8s.namespace.name": "ml", "k8s.container.name": "trainer"},
        "1": {"k8s.pod.name": "infer-a,infer-b", "k8s.namespace.name": "serving", "k8s.container.name": "server"},
    }
    assert pods.connected and kubelet.calls == 1


def test_source_labels_readings_with_pods_and_refreshes(samples: Path, kubelet: FakeKubelet):
    kubelet.pods = [pod("train-0", "ml", "trainer", "amd.com/gpu", "0000:83:00.0")]
    cfg = SmiSourceConfig(
        backend="file",
        file=samples / "rocm-smi" / "mi100_rocm602.json",
        kubelet_socket=kubelet.socket,
        pod_refresh_s=0.001,
    )
    src = SmiSource(cfg, "smi")
    src.backend = open_backend("file", src.options)
    src.pods = PodAttribution(kubelet.socket, refresh_s=cfg.pod_refresh_s)
    ctx = context()
    src.sample_once(ctx)
    rows = ctx.bus.get(0).batch.to_pylist()
    card0 = [dict(r["attributes"]) for r in rows if r["device"] == "0"]
    assert all(a["k8s.pod.name"] == "train-0" and a["k8s.namespace.name"] == "ml" for a in card0)
    assert not any("k8s.pod.name" in dict(r["attributes"]) for r in rows if r["device"] == "1")
    kubelet.pods = [pod("train-1", "ml", "trainer", "amd.com/gpu", "0000:a3:00.0")]
    src.sample_once(ctx)
    rows = ctx.bus.get(0).batch.to_pylist()
    assert {dict(r["attributes"]).get("k8s.pod.name") for r in rows if r["device"] == "1"} == {"train-1"}
    assert {dict(r["attributes"]).get("k8s.pod.name") for r in rows if r["device"] == "0"} == {None}
    src.pods.close()


def test_without_a_kubelet_the_source_runs_unlabelled_and_says_so_once(
    samples: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    cfg = SmiSourceConfig(
        backend="file",
        file=samples / "amd-smi" / "amd-smi-metric.json",
        kubelet_socket=tmp_path / "no-kubelet.sock",
        pod_refresh_s=0.001,
        samples=5,
        interval_s=0.01,
    )
    ctx = context()
    with caplog.at_level(logging.INFO, logger="aaco.sources.smi.pods"):
        SmiSource(cfg, "smi").run(ctx)
    said = [r.getMessage() for r in caplog.records if "pod-resources socket" in r.getMessage()]
    assert said == [
        f"no kubelet pod-resources socket at {tmp_path / 'no-kubelet.sock'}: GPU telemetry is not attributed "
        "to pods (running unlabelled)"
    ]
    batches = [ctx.bus.get(0) for _ in range(5)]
    assert all(b is not None for b in batches)
    assert not any(k.startswith("k8s.") for b in batches for r in b.batch.to_pylist() for k, _ in r["attributes"])
    assert [p for p in ctx.journal.problems if p.reason != "overrun"] == []  # a slow sample may overrun 10 ms


def test_a_failing_kubelet_is_counted_and_the_last_mapping_kept(tmp_path: Path):
    sock = tmp_path / "kubelet.sock"
    errors: list[str] = []
    with FakeKubelet(sock) as k:
        k.pods = [pod("p", "ns", "c", "nvidia.com/gpu", NV_UUID)]
        pods = PodAttribution(
            sock, refresh_s=0.0, timeout_s=1.0, stale_after_s=3600, on_error=lambda r, m: errors.append(r)
        )
        assert pods.lookup([GpuIdentity("0", uuid=NV_UUID)])["0"]["k8s.pod.name"] == "p"
    sock.touch()  # the socket file is there, nobody answers
    assert pods.lookup([GpuIdentity("0", uuid=NV_UUID)])["0"]["k8s.pod.name"] == "p"
    assert errors == ["kubelet"] and not pods.connected
    pods.close()


def test_agent_serves_gpu_metrics_per_pod_with_compat_names(
    samples: Path, tmp_path: Path, aaco_bin: str, free_port: int, kubelet: FakeKubelet
):
    kubelet.pods = [pod("llm-0", "serving", "vllm", "nvidia.com/gpu", NV_UUID)]
    lake = tmp_path / "lake"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(
        f"""
node: gpu-node-1
sources:
  - type: smi
    backend: file
    file: {samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz"}
    interval_s: 0.2
    compat: dcgm
    kubelet_socket: {kubelet.socket}
  - type: smi
    name: amd
    backend: file
    file: {samples / "sysfs" / "amdgpu_card0.ttar"}
    interval_s: 0.2
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
            # Both sources (the NVIDIA one through the kubelet, the AMD one) must have sampled: on a
            # loaded machine one can be a few intervals behind the other.
            ready = status == 200 and 'pod="llm-0"' in body and "aaco_gpu_clock_hertz{" in body
            return body if ready and 'gpu_uuid="0123456789abcdef"' in body else None

        body = wait_for(scraped, timeout=60, what="GPU metrics on /metrics")
        nv = {"gpu": "0", "gpu_uuid": NV_UUID, "pod": "llm-0", "namespace": "serving", "container": "vllm"}
        assert metric_value(body, "aaco_gpu_power_watts", node="gpu-node-1", **nv) == 67.03
        assert metric_value(body, "aaco_gpu_temperature_celsius", sensor="edge", **nv) == 27.0
        assert metric_value(body, "aaco_gpu_memory_usage_bytes", **nv) == 52428800.0
        assert metric_value(body, "aaco_gpu_clock_hertz", clock="sm", **nv) == 1.275e9
        assert metric_value(body, "aaco_gpu_throttle_active", reason="power", **nv) == 0.0
        assert metric_value(body, "aaco_gpu_up", **nv) == 1.0
        assert metric_value(body, "aaco_gpu_errors_total", error_type="lost", **nv) == 0.0
        assert metric_value(body, "DCGM_FI_DEV_POWER_USAGE", UUID=NV_UUID, pod="llm-0") == 67.03
        assert metric_value(body, "DCGM_FI_DEV_SM_CLOCK", UUID=NV_UUID, modelName="NVIDIA A100-SXM4-80GB") == 1275.0
        amd = {"gpu": "0", "gpu_uuid": "0123456789abcdef", "pod": ""}
        assert metric_value(body, "aaco_gpu_utilization_ratio", **amd) == 0.04
        assert metric_value(body, "aaco_gpu_clock_hertz", clock="graphics", **amd) == 8.52e8
        assert 'pod=""' in body.split("aaco_gpu_utilization_ratio{", 1)[1].split("}", 1)[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0, (tmp_path / "agent.log").read_text()[-3000:]
    table = read_lake(lake, "telemetry")
    rows = table.to_pylist()
    power = [r for r in rows if r["metric"] == "hw.power" and r["source"] == "smi"]
    assert power and power[0]["value"] == 67.03 and power[0]["unit"] == "W"
    assert dict(power[0]["attributes"])["k8s.pod.name"] == "llm-0"
    analysis = json.loads((lake / "analysis.json").read_text())
    assert any(g["pod"] == "llm-0" for g in analysis["telemetry"]["gpus"])


@pytest.mark.parametrize(
    ("rel", "metric", "attrs", "expected"),
    [
        ("rocm-smi/mi100_rocm602.json", "hw.temperature", {"sensor": "junction"}, 55.0),
        ("amd-smi/amd-smi-metric.json", "aaco.gpu.clock.frequency", {"clock": "graphics"}, 60e6),
        ("nvidia-smi/a100-sxm4-v12.xml.gz", "hw.power", {}, 67.03),
        ("sysfs/amdgpu_card0.ttar", "hw.gpu.memory.limit", {}, 8573157376),
    ],
)
def test_cli_prints_a_snapshot_as_json(
    samples: Path, aaco_bin: str, rel: str, metric: str, attrs: dict, expected: float
):
    res = run_aaco(aaco_bin, "telemetry", "--from-file", str(samples / rel), "--json")
    assert res.returncode == 0, res.stderr
    readings = json.loads(res.stdout)
    assert set(readings[0]) == {"device", "metric", "value", "unit", "attributes"}
    hit = [
        r
        for r in readings
        if r["device"] == "0" and r["metric"] == metric and all(r["attributes"].get(k) == v for k, v in attrs.items())
    ]
    assert [r["value"] for r in hit] == [expected]


def test_cli_reads_other_projects_captures(aaco_bin: str):
    """Real captures of tests/data: fans of a dual-GPU v13 log (gzip), a vGPU's placeholder zeros left
    out, rocm-smi 6.0's "N/A (Secondary die)" absent without a warning, a PCI id never a model."""
    data = ROOT / "tests" / "data"
    dual, vgpu, rocm, old = run_aaco_each(
        aaco_bin,
        ("telemetry", "-f", str(data / "nvidia-smi" / "dual_a5000-v13.xml.gz"), "--json"),
        ("telemetry", "-f", str(data / "nvidia-smi" / "tesla_p4.xml"), "--json"),
        ("telemetry", "-f", str(data / "rocm-smi" / "rx6700xt_rocm602.json"), "--json"),
        ("telemetry", "-f", str(data / "rocm-smi" / "rx6700xt_rocm430.json")),
    )
    for res in (dual, vgpu, rocm, old):
        assert res.returncode == 0 and res.stderr == "", res.stderr
    fans = [(r["device"], r["value"]) for r in json.loads(dual.stdout) if r["metric"] == "hw.fan.speed_ratio"]
    assert fans == [("0", 0.3), ("1", 0.3)]
    assert not {"hw.temperature", "aaco.gpu.clock.frequency"} & {r["metric"] for r in json.loads(vgpu.stdout)}
    assert "hw.power" not in {r["metric"] for r in json.loads(rocm.stdout)}
    assert "67XA6S" in old.stdout and "0x1002" not in old.stdout


def test_cli_table_and_bad_input(samples: Path, aaco_bin: str, tmp_path: Path):
    broken = tmp_path / "broken.json"
    broken.write_text('{"card0": {"GPU use (%)": "busy", "Average Graphics Package Power (W)": "12.0"}}')
    truncated = tmp_path / "cut.xml"
    truncated.write_text(sample_bytes(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz").decode()[:3000])
    table, bad_field, cut, nvml, sysfs = run_aaco_each(  # independent commands, run side by side
        aaco_bin,
        ("telemetry", "--from-file", str(samples / "rocm-smi" / "mi100_rocm602.json")),
        ("telemetry", "--from-file", str(broken), "--json"),
        ("telemetry", "--from-file", str(truncated)),
        ("telemetry", "--backend", "nvml", "--from-file", str(truncated)),
        ("telemetry", "--backend", "sysfs", "--sysfs-root", str(tmp_path)),
    )
    assert table.returncode == 0
    assert "Arcturus GL-XL [Instinct MI100]" in table.stdout and "sensor=junction" in table.stdout
    assert bad_field.returncode == 0
    assert f"{broken}: field card0.\"GPU use (%)\": not a number: 'busy'" in bad_field.stderr
    assert [r["value"] for r in json.loads(bad_field.stdout) if r["metric"] == "hw.power"] == [12.0]
    assert cut.returncode == 2 and f"{truncated}: not nvidia-smi XML" in cut.stderr and "Traceback" not in cut.stderr
    assert nvml.returncode == 2 and "--from-file" in nvml.stderr
    assert sysfs.returncode == 2 and "class/drm" in sysfs.stderr


def test_cli_reads_a_sysfs_root(samples: Path, aaco_bin: str, tmp_path: Path):
    from aaco.agent.sources.smi import ttar

    ttar.unpack(ttar.read((samples / "sysfs" / "amdgpu_card0.ttar").read_text()), tmp_path)
    res = run_aaco(
        aaco_bin, "telemetry", "--backend", "sysfs", "--sysfs-root", str(tmp_path / "fixtures" / "sys"), "--json"
    )
    assert res.returncode == 0, res.stderr
    busy = [r["value"] for r in json.loads(res.stdout) if r["metric"] == "hw.gpu.utilization"]
    assert busy == [0.04]


def test_help_mentions_every_option(aaco_bin: str):
    res = subprocess.run([aaco_bin, "telemetry", "--help"], capture_output=True, text=True, check=False)
    assert res.returncode == 0
    for flag in ("--backend", "--from-file", "--sysfs-root", "--json"):
        assert flag in res.stdout
