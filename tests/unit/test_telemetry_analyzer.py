"""The telemetry analyzer: latest value per series, labels (pods included), bounds, compatibility names."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from aaco.agent.sources.smi.capture import read_capture
from aaco.analyzers.telemetry import TelemetryAnalyzer
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.telemetry import to_table
from tests.conftest import ROOT


def batch(path: Path, ts: int, source: str = "smi", pods: dict | None = None) -> EventBatch:
    snap = read_capture(path)
    table = to_table(snap.gpus, ts_ns=ts, node="n1", source=source, extra=pods)
    return EventBatch("telemetry", conform("telemetry", table), source)


def points(result) -> dict[tuple[str, tuple], float]:
    return {(p.metric.prom_name, tuple(sorted(p.labels.items()))): p.value for p in result.points()}


def find(pts: dict, name: str, **labels: str) -> float:
    hits = [v for (n, lb), v in pts.items() if n == name and all(dict(lb).get(k) == w for k, w in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


def test_latest_value_per_series_with_labels(samples: Path):
    a = TelemetryAnalyzer()
    a.update(batch(samples / "rocm-smi" / "mi100_rocm602.json", 1_000))
    pts = points(a.snapshot())
    assert find(pts, "aaco_gpu_temperature_celsius", gpu="0", sensor="junction") == 55.0
    assert find(pts, "aaco_gpu_power_watts", gpu="0") == 36.0
    assert find(pts, "aaco_gpu_memory_usage_bytes", gpu="0") == 6750208
    assert find(pts, "aaco_gpu_clock_hertz", gpu="0", clock="graphics") == 300e6
    labels = next(dict(lb) for (n, lb) in pts if n == "aaco_gpu_power_watts" and dict(lb)["gpu"] == "0")
    assert labels == {
        "node": "n1",
        "gpu": "0",
        "gpu_uuid": "0x79ccd55167a2124a",
        "model": "Arcturus GL-XL [Instinct MI100]",
        "pod": "",
        "namespace": "",
        "container": "",
        "parent_uuid": "",
        "gpu_instance": "",
        "compute_instance": "",
        "job": "",
        "job_user": "",
        "job_partition": "",
    }
    assert len({dict(lb)["gpu"] for (n, lb) in pts if n == "aaco_gpu_power_watts"}) == 4
    doc = a.snapshot().to_dict()
    assert doc["gpus"][0]["readings"]["hw.temperature{sensor=junction}"] == 55.0


def test_newer_readings_win_and_pod_changes_move_labels(samples: Path):
    path = samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz"
    a = TelemetryAnalyzer()
    a.update(batch(path, 2_000, pods={"0": {"k8s.pod.name": "train-1", "k8s.namespace.name": "ml"}}))
    a.update(batch(path, 1_000, pods={"0": {"k8s.pod.name": "old", "k8s.namespace.name": "ml"}}))  # late, older
    pts = points(a.snapshot())
    assert find(pts, "aaco_gpu_power_watts", pod="train-1", namespace="ml") == 67.03
    a.update(batch(path, 3_000, pods={"0": {"k8s.pod.name": "serve-2", "k8s.namespace.name": "ml"}}))
    pts = points(a.snapshot())
    assert [dict(lb)["pod"] for (n, lb) in pts if n == "aaco_gpu_power_watts"] == ["serve-2"]


def test_bounded_series_and_unknown_metrics_are_counted(samples: Path):
    a = TelemetryAnalyzer(max_series=5)
    a.update(batch(samples / "rocm-smi" / "mi100_rocm602.json", 1))
    odd = conform(
        "telemetry",
        pa.table(
            {"ts_ns": [2], "node": ["n1"], "device": ["0"], "metric": ["hw.fan_speed"], "value": [1.0], "unit": ["rpm"]}
        ),
    )
    a.update(EventBatch("telemetry", odd, "smi"))
    res = a.snapshot()
    assert len(res.series) == 5
    pts = points(res)
    assert find(pts, "aaco_telemetry_series_dropped", reason="max_series") > 0
    assert find(pts, "aaco_telemetry_series_dropped", reason="unknown_metric") == 1
    assert find(pts, "aaco_telemetry_series") == 5


def test_stale_series_are_forgotten(samples: Path):
    a = TelemetryAnalyzer(stale_after_s=10)
    a.update(batch(samples / "rocm-smi" / "mi100_rocm602.json", 1_000_000_000, source="old"))
    a.update(batch(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz", 20_000_000_000, source="new"))
    assert {s.source for s in a.snapshot().series} == {"new"}


def test_dcgm_compatibility_names_and_units(samples: Path):
    a = TelemetryAnalyzer(compat={"smi": "auto"})
    a.update(batch(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz", 1, pods={"0": {"k8s.pod.name": "p"}}))
    pts = points(a.snapshot())
    assert find(pts, "DCGM_FI_DEV_GPU_TEMP") == 27.0
    assert find(pts, "DCGM_FI_DEV_POWER_USAGE") == 67.03
    assert find(pts, "DCGM_FI_DEV_SM_CLOCK") == 1275.0
    assert find(pts, "DCGM_FI_DEV_FB_USED", GPU_I_ID="") == 50.0
    assert find(pts, "DCGM_FI_DEV_FB_FREE", GPU_I_ID="") == 81920.0 - 50.0
    # its MIG devices as dcgm-exporter labels them: the parent GPU's gpu, UUID and device, and GPU_I_ID
    assert find(pts, "DCGM_FI_DEV_FB_USED", GPU_I_ID="4") == 12.0
    assert find(pts, "DCGM_FI_DEV_FB_FREE", GPU_I_ID="4") == 19968.0 - 12.0
    mig = next(dict(lb) for (n, lb) in pts if n == "DCGM_FI_DEV_FB_USED" and dict(lb)["GPU_I_ID"] == "4")
    assert (mig["gpu"], mig["device"], mig["UUID"]) == ("0", "nvidia0", "GPU-513536b6-7d19-9063-b049-1e69664bb298")
    labels = next(dict(lb) for (n, lb) in pts if n == "DCGM_FI_DEV_GPU_TEMP")
    assert labels == {
        "gpu": "0",
        "UUID": "GPU-513536b6-7d19-9063-b049-1e69664bb298",
        "device": "nvidia0",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": "n1",
        "pci_bus_id": "00000000:01:00.0",
        "GPU_I_ID": "",
        "pod": "p",
        "namespace": "",
        "container": "",
        "hpc_job": "",
    }
    assert not any(n.startswith("gpu_") for n, _ in pts)  # auto: NVIDIA GPUs get dcgm names only


def test_amd_compatibility_names_and_units(samples: Path):
    a = TelemetryAnalyzer(compat={"smi": "amd"})
    a.update(batch(samples / "rocm-smi" / "mi100_rocm602.json", 1))
    pts = points(a.snapshot())
    assert find(pts, "gpu_junction_temperature", gpu_id="0") == 55.0
    assert find(pts, "gpu_power_usage", gpu_id="0") == 36.0
    assert find(pts, "gpu_clock", gpu_id="0", clock_type="system") == 300.0
    assert find(pts, "gpu_total_vram", gpu_id="0") == 34342961152 / 2**20
    assert find(pts, "gpu_gfx_activity", gpu_id="0") == 0.0
    assert find(pts, "gpu_free_vram", gpu_id="0") == (34342961152 - 6750208) / 2**20
    off = TelemetryAnalyzer()
    off.update(batch(samples / "rocm-smi" / "mi100_rocm602.json", 1))
    assert not any(n.startswith("gpu_") for n, _ in points(off.snapshot()))


def test_the_agent_builds_it_with_compat_per_smi_source(samples: Path):
    from aaco.agent.config import AgentConfig
    from aaco.agent.service import build_analyzers

    cfg = AgentConfig.model_validate(
        {
            "node": "n",
            "sources": [
                {
                    "type": "smi",
                    "backend": "file",
                    "file": str(samples / "rocm-smi" / "mi100_rocm602.json"),
                    "compat": "amd",
                },
                {"type": "smi", "name": "nv", "interval_s": 60},
            ],
        }
    )
    (a,) = [x for x in build_analyzers(cfg) if isinstance(x, TelemetryAnalyzer)]
    assert a.compat == {"smi": "amd"}
    assert a.stale_after_ns == 600 * 10**9


def with_values(item: EventBatch, ts: int, scale: float) -> EventBatch:
    """The same rows at another time with other values (what a source sends sample after sample)."""
    b = item.batch
    b = b.set_column(b.schema.get_field_index("ts_ns"), "ts_ns", pa.array([ts] * b.num_rows, pa.int64()))
    values = pa.array([v * scale for v in b.column("value").to_pylist()], pa.float64())
    return EventBatch(item.kind, b.set_column(b.schema.get_field_index("value"), "value", values), item.source)


def test_repeated_rows_move_values_and_times_like_new_rows(samples: Path):
    first = batch(samples / "rocm-smi" / "mi100_rocm602.json", 1_000)
    a = TelemetryAnalyzer()
    a.update(first)
    a.update(with_values(first, 2_000, 2.0))
    a.update(with_values(first, 1_500, 3.0))  # late: older than what is kept
    fresh = TelemetryAnalyzer()
    fresh.update(with_values(first, 2_000, 2.0))
    assert a.snapshot() == fresh.snapshot()
    assert find(points(a.snapshot()), "aaco_gpu_power_watts", gpu="0") == 72.0


def test_repeated_rows_count_their_drops_and_bring_back_expired_series(samples: Path):
    odd = conform(
        "telemetry",
        pa.table(
            {
                "ts_ns": [1, 1],
                "node": ["n1", "n1"],
                "device": ["0", "0"],
                "metric": ["hw.fan_speed", "hw.power"],
                "value": [1.0, 50.0],
                "unit": ["rpm", "W"],
            }
        ),
    )
    a = TelemetryAnalyzer(stale_after_s=10)
    a.update(EventBatch("telemetry", odd, "smi"))
    a.update(with_values(EventBatch("telemetry", odd, "smi"), 2, 1.0))
    assert find(points(a.snapshot()), "aaco_telemetry_series_dropped", reason="unknown_metric") == 2
    a.update(batch(samples / "nvidia-smi" / "a100-sxm4-v12.xml.gz", 20_000_000_000, source="other"))
    assert {s.source for s in a.snapshot().series} == {"other"}  # the smi series expired
    a.update(with_values(EventBatch("telemetry", odd, "smi"), 21_000_000_000, 2.0))
    res = a.snapshot()
    assert [s.value for s in res.series if s.source == "smi"] == [100.0]
    assert find(points(res), "aaco_telemetry_series_dropped", reason="unknown_metric") == 3

    capped = TelemetryAnalyzer(max_series=5)
    rows = batch(samples / "rocm-smi" / "mi100_rocm602.json", 1)
    capped.update(rows)
    once = capped.snapshot().dropped["max_series"]
    capped.update(with_values(rows, 2, 1.0))
    assert capped.snapshot().dropped["max_series"] == 2 * once


def test_fans_pstate_pcie_voltage_and_dpm_levels_reach_their_definitions():
    data = ROOT / "tests" / "data"
    a = TelemetryAnalyzer()
    a.update(batch(data / "nvidia-smi" / "dual_a5000-v13.xml.gz", 1_000))
    a.update(batch(data / "nvidia-smi" / "a10g.xml", 1_000, source="a10g"))
    a.update(batch(data / "rocm-smi" / "vega-10-XT.json", 1_000, source="rocm"))
    pts = points(a.snapshot())
    assert find(pts, "aaco_gpu_fan_speed_ratio", gpu="1", fan="0", model="NVIDIA RTX A5000") == 0.3
    assert find(pts, "aaco_gpu_pstate", gpu="1", model="NVIDIA RTX A5000") == 8
    assert find(pts, "aaco_gpu_pcie_link_generation", gpu="0", model="NVIDIA RTX A5000") == 1
    assert find(pts, "aaco_gpu_pcie_link_width", gpu="0", model="NVIDIA A10G") == 8
    assert find(pts, "aaco_gpu_voltage_volts", model="NVIDIA A10G", sensor="graphics") == 0.69375
    assert find(pts, "aaco_gpu_fan_speed_rpm", model="AMD Radeon Pro WX 9100", fan="0") == 682
    assert find(pts, "aaco_gpu_dpm_level", model="AMD Radeon Pro WX 9100", clock="graphics") == 3
    assert "unknown_metric" not in a.snapshot().dropped
    doc = a.snapshot().to_dict()
    assert doc["gpus"][0]["readings"]["hw.fan.speed_ratio{fan=0}"] == 0.3
