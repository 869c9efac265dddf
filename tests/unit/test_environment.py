"""The environment of a lake (what it holds, what the machine adds) and reading lakes back."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from aaco.agent.verdict.environment import differences, environment, lake_environment, machine_environment
from aaco.agent.verdict.lake import Lake, read_lake
from aaco.contract import telemetry as tm
from aaco.contract.errors import AacoError
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.stats import Stats
from aaco.exporters.lake import LakeConfig, LakeExporter

from .builders import iterations, kernels


def fake_root(tmp: Path) -> Path:
    files = {
        "proc/driver/nvidia/version": (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 22:20:39 UTC 2023\n"
        ),
        "opt/rocm/.info/version": "6.2.0-66\n",
        "usr/local/cuda/version.json": json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.2.0"}}),
        "proc/cpuinfo": "processor\t: 0\nmodel name\t: AMD EPYC 7763 64-Core Processor\n",
    }
    for rel, text in files.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp / rel).write_text(text)
    return tmp


def test_machine_environment_reads_driver_rocm_cuda_and_cpu(tmp_path):
    env = machine_environment(fake_root(tmp_path), with_ort=False)
    assert env["gpu_driver"] == {"value": "nvidia 535.54.03", "source": "machine"}
    assert "rocm_version" not in env  # ROCm installed where no amdgpu driver runs: not the GPU stack in use
    assert env["cuda_version"]["value"] == "12.2.0"
    assert env["cpu_model"]["value"] == "AMD EPYC 7763 64-Core Processor"
    assert "onnxruntime_version" not in env
    amd = tmp_path / "amd"
    (amd / "sys/module/amdgpu").mkdir(parents=True)
    (amd / "sys/module/amdgpu/version").write_text("6.7.0\n")
    (amd / "usr/local").mkdir(parents=True)
    (amd / "usr/local/cuda-11.8/lib64").mkdir(parents=True)
    (amd / "usr/local/cuda-11.8/lib64/libcudart.so.11.0").write_bytes(b"")
    (amd / "usr/local/cuda").symlink_to(amd / "usr/local/cuda-11.8")
    (amd / "opt/rocm/.info").mkdir(parents=True)
    (amd / "opt/rocm/.info/version").write_text("6.2.0-66\n")
    env = machine_environment(amd)
    assert env["gpu_driver"]["value"] == "amdgpu 6.7.0"
    assert env["rocm_version"]["value"] == "6.2.0-66"
    assert "cuda_version" not in env  # a CUDA toolkit where no NVIDIA driver runs
    assert env["onnxruntime_version"]["value"].startswith("onnxruntime")
    (amd / "proc/driver/nvidia").mkdir(parents=True)  # an NVIDIA driver beside it: the toolkit counts
    (amd / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.1  x\n")
    assert machine_environment(amd)["cuda_version"]["value"] == "11.8"  # the versioned directory it links to


def test_no_toolkit_versions_on_a_cpu_only_host(tmp_path):
    root = fake_root(tmp_path)
    (root / "proc/driver/nvidia/version").unlink()
    env = machine_environment(root, with_ort=False)
    assert "gpu_driver" not in env and "cuda_version" not in env and "rocm_version" not in env


def test_no_cuda_version_from_a_dangling_link_or_an_empty_directory(tmp_path):
    (tmp_path / "proc/driver/nvidia").mkdir(parents=True)
    (tmp_path / "proc/driver/nvidia/version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.1  x\n")
    local = tmp_path / "usr/local"
    local.mkdir(parents=True)
    (local / "cuda").symlink_to(local / "cuda-12.4")  # the toolkit was removed, its link was not
    assert "cuda_version" not in machine_environment(tmp_path, with_ort=False)
    (local / "cuda-12.4").mkdir()  # a leftover directory with no version file and no runtime
    assert "cuda_version" not in machine_environment(tmp_path, with_ort=False)
    (local / "cuda-12.4/version.json").write_text(json.dumps({"cuda": {"version": "12.4.1"}}))
    assert machine_environment(tmp_path, with_ort=False)["cuda_version"]["value"] == "12.4.1"


def gpu_rows(product: str, clocks: list[float]) -> pa.RecordBatch:
    out = []
    for i, hz in enumerate(clocks):
        s = tm.GpuSample(tm.GpuIdentity("0", model=product, vendor="amd"))
        s.add(tm.CLOCK, hz, clock="graphics")
        s.add(tm.CLOCK_MAX, 1.7e9, clock="graphics")
        out.append(conform("telemetry", tm.to_table([s], ts_ns=i + 1, node="n", source="smi")))
    return pa.Table.from_batches(out)


def test_lake_environment_from_sources_telemetry_iterations_and_kernels(tmp_path):
    lake = Lake(tmp_path)
    lake.sources = [
        {
            "format": "rocprofv3_json",
            "devices": {"0": {"type": "GPU", "name": "gfx90a", "product_name": "AMD Instinct MI210"}},
        },
        {"format": "kineto", "devices": {"cpu0": {"type": "CPU", "name": "EPYC"}}},
    ]
    lake.tables["telemetry"] = gpu_rows("AMD Instinct MI210", [1.0e9, 1.7e9, 1.6e9])
    lake.tables["iterations"] = pa.Table.from_batches([iterations([(0, 10)], provider=["ROCMExecutionProvider"])])
    lake.tables["kernels"] = pa.Table.from_batches([kernels([0, 5], device=["0", "1"])])
    env = lake_environment(lake)
    assert env["gpu_model"] == {"value": "AMD Instinct MI210", "source": "lake:sources.json"}
    assert env["gpu_vendor"] == {"value": "amd", "source": "lake:telemetry"}
    assert env["clocks"]["value"] == {"graphics": {"median_hz": 1.6e9, "max_hz": 1.7e9}}
    assert env["trace_formats"]["value"] == "kineto; rocprofv3_json"
    assert env["execution_provider"] == {"value": "ROCMExecutionProvider", "source": "lake:iterations"}
    assert env["devices"] == {"value": ["0", "1"], "source": "lake:kernels"}
    # the machine only fills what the lake lacks
    full = environment(lake)
    assert full["gpu_model"]["source"] == "lake:sources.json" and full["cpu_count"]["source"] == "machine"
    assert full["onnxruntime_version"]["source"] == "machine"  # the lake holds ONNX Runtime iterations


def test_differences_use_a_clock_tolerance():
    a = {"gpu_model": {"value": "MI250X"}, "clocks": {"value": {"graphics": {"median_hz": 1.70e9, "max_hz": 1.7e9}}}}
    b = {"gpu_model": {"value": "MI250X"}, "clocks": {"value": {"graphics": {"median_hz": 1.69e9, "max_hz": 1.7e9}}}}
    assert differences(a, b) == []  # within 2 %
    b["clocks"]["value"]["graphics"]["median_hz"] = 1.5e9
    b["gpu_model"]["value"] = "MI300X"
    b["python"] = {"value": "3.12"}  # only on one side: not compared
    assert differences(a, b) == [
        {"key": "clocks.graphics.median_hz", "baseline": 1.7e9, "session": 1.5e9},
        {"key": "gpu_model", "baseline": "MI250X", "session": "MI300X"},
    ]


def test_read_lake_takes_the_node_from_the_path_and_names_a_damaged_part(tmp_path):
    root = tmp_path / "lake"
    exp = LakeExporter(LakeConfig(path=root), Stats())
    exp.start()
    exp.export(EventBatch("kernels", kernels([20, 10], node=["rack/7", "rack/7"]), "t"))
    exp.export(EventBatch("iterations", iterations([(0, 30)], node="7"), "t"))
    exp.shutdown()
    lake = read_lake(root)
    k = lake.table("kernels")
    assert k["node"].to_pylist() == ["rack/7", "rack/7"] and k["start_ns"].to_pylist() == [10, 20]  # sorted
    assert lake.table("iterations")["node"].to_pylist() == ["7"]  # a string, not an inferred integer
    assert lake.nodes() == ["7", "rack/7"] and lake.table("sched").num_rows == 0
    assert [b.kind for b in lake.batches()] == ["iterations", "kernels"]  # merged in time order
    part = next((root / "kernels").rglob("part-*.parquet"))
    part.write_bytes(b"garbage")
    with pytest.raises(AacoError) as err:
        read_lake(root)
    assert str(part) in str(err.value) and "not a readable Parquet part" in str(err.value)
    with pytest.raises(AacoError, match="no such lake directory"):
        read_lake(tmp_path / "missing")
