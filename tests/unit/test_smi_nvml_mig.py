"""MIG devices through NVML (a double of nvidia-ml-py's MIG calls): devices of their own; the GPU's readings stay."""

from __future__ import annotations

from aaco.agent.sources.smi.nvml import NvmlReader
from aaco.contract import telemetry as m

from .smi_fakes import FakeGpu, fake_nvml
from .smi_fakes_mig import FakeMig, with_mig

GIB = 2**30


def mig(uuid: str, gi: int, ci: int, used: int, total: int) -> FakeMig:
    return FakeMig(gi, ci, FakeGpu(uuid=uuid, mem=(used * GIB, total * GIB)))


def test_each_mig_device_is_a_device_with_its_memory_and_the_gpu_keeps_its_own():
    gpus = [FakeGpu(name="NVIDIA A100-SXM4-40GB"), FakeGpu(uuid="GPU-2222", bus_id="00000000:19:00.0")]
    migs = {0: {0: mig("MIG-aaaa", 1, 0, 3, 20), 2: mig("MIG-bbbb", 2, 0, 0, 9), 3: mig("MIG-cccc", 2, 1, 1, 9)}}
    reader = NvmlReader(with_mig(fake_nvml(gpus), gpus, migs))
    snap = reader.sample()
    assert not snap.problems
    assert [g.gpu.index for g in snap.gpus] == ["0", "0/1/0", "0/2/0", "0/2/1", "1"]
    by = {g.gpu.index: g for g in snap.gpus}
    a = by["0/1/0"]
    assert (a.gpu.uuid, a.gpu.parent, a.gpu.parent_uuid, a.gpu.gpu_instance, a.gpu.compute_instance) == (
        "MIG-aaaa",
        "0",
        gpus[0].uuid,
        "1",
        "0",
    )
    assert a.gpu.model == "NVIDIA A100-SXM4-40GB" and a.gpu.pci_bus == ""
    assert {(r.metric, r.value) for r in a.readings} == {(m.MEMORY_USAGE, 3 * GIB), (m.MEMORY_LIMIT, 20 * GIB)}
    assert {(r.metric, r.value) for r in by["0/2/1"].readings} == {(m.MEMORY_USAGE, GIB), (m.MEMORY_LIMIT, 9 * GIB)}
    # the GPU keeps power, clocks, utilisation ...; the MIG devices carry none of them
    assert {m.POWER, m.CLOCK, m.UTILIZATION} <= {r.metric for r in by["0"].readings}
    assert all({r.metric for r in by[i].readings} == {m.MEMORY_USAGE, m.MEMORY_LIMIT} for i in ("0/1/0", "0/2/0"))
    assert not by["1"].gpu.parent  # a GPU not in MIG mode has no MIG devices


def test_nvml_without_mig_calls_and_mig_errors():
    gpus = [FakeGpu()]
    assert [g.gpu.index for g in NvmlReader(fake_nvml(gpus)).sample().gpus] == ["0"]  # an NVML without MIG calls
    # a MIG device whose memory cannot be read is still a device; an odd handle error is a problem
    broken = mig("MIG-dddd", 5, 0, 1, 10)
    broken.device.unsupported = {"nvmlDeviceGetMemoryInfo"}
    nvml = with_mig(fake_nvml(gpus), gpus, {0: {1: broken}})
    real = nvml.nvmlDeviceGetMigDeviceHandleByIndex

    def flaky(h, index):
        if index == 4:
            raise nvml.NVMLError(999)
        return real(h, index)

    nvml.nvmlDeviceGetMigDeviceHandleByIndex = flaky
    snap = NvmlReader(nvml).sample()
    assert [(g.gpu.index, g.readings) for g in snap.gpus[1:]] == [("0/5/0", [])]
    assert [p.field for p in snap.problems] == ["gpu[0]/mig[4]"]


def test_a_lost_gpu_takes_its_mig_devices_with_it():
    gpus = [FakeGpu()]
    nvml = with_mig(fake_nvml(gpus), gpus, {0: {0: mig("MIG-aaaa", 1, 0, 1, 10)}})
    reader = NvmlReader(nvml)
    assert len(reader.sample().gpus) == 2
    gpus[0].lost = True
    snap = reader.sample()
    assert snap.gpus == [] and "GPU is lost" in snap.problems[0].message
