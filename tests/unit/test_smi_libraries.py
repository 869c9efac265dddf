"""The NVML and AMD SMI library backends against doubles with the libraries' API shapes."""

from __future__ import annotations

import types

import pytest

from aaco.agent.sources.smi.backends import BackendOptions, open_backend
from aaco.agent.sources.smi.calls import BackendError
from aaco.contract.telemetry import Snapshot

from .smi_fakes import FakeAmdGpu, FakeGpu, fake_amdsmi, fake_nvml


def value(snap: Snapshot, gpu: str, metric: str, **attrs: str) -> float:
    named = {("error.type" if k == "error_type" else k): v for k, v in attrs.items()}
    hits = [
        r.value
        for s in snap.gpus
        if s.gpu.index == gpu
        for r in s.readings
        if r.metric == metric and dict(r.attrs) == named
    ]
    assert len(hits) == 1, (metric, attrs, hits)
    return hits[0]


def test_the_nvml_double_has_nvidia_ml_py_names():
    import pynvml  # nvidia-ml-py, a dev dependency: the real module, imported without a driver

    fake = fake_nvml([FakeGpu()])
    used = [n for n in vars(fake) if n.startswith(("nvml", "NVML"))] + ["NVMLError"]
    missing = [n for n in used if not hasattr(pynvml, n)]
    assert missing == []
    for name in ("NVML_TEMPERATURE_GPU", "NVML_CLOCK_SM", "NVML_AGGREGATE_ECC", "nvmlClocksEventReasonSwPowerCap"):
        assert getattr(fake, name) == getattr(pynvml, name)


def test_nvml_readings_in_base_units():
    nvml = fake_nvml([FakeGpu(), FakeGpu(uuid="GPU-2", bus_id="00000000:2A:00.0", temp=70)])
    backend = open_backend("nvml", BackendOptions(modules={"pynvml": nvml}))
    snap = backend.sample()
    assert [g.gpu.index for g in snap.gpus] == ["0", "1"]
    assert value(snap, "0", "hw.gpu.utilization") == 0.87
    assert value(snap, "0", "aaco.gpu.memory.utilization") == 0.40
    assert value(snap, "0", "hw.gpu.memory.usage") == 30 * 2**30
    assert value(snap, "0", "hw.power") == 350.0
    assert value(snap, "0", "aaco.gpu.power.limit") == 700.0
    assert value(snap, "0", "hw.energy") == 123456.789
    assert value(snap, "0", "hw.temperature", sensor="edge") == 61
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="sm") == 1755e6
    assert value(snap, "0", "aaco.gpu.clock.max", clock="graphics") == 1980e6
    assert value(snap, "0", "hw.errors", error_type="corrected") == 3
    assert snap.gpus[1].gpu.pci_bus == "0000:2a:00.0"
    assert snap.problems == []
    backend.close()
    assert nvml.state == {"init": 1, "shutdown": 1}


def test_nvml_max_clocks_are_read_once_per_gpu():
    """On a real H100 each nvmlDeviceGetMaxClockInfo costs ~1.5 ms of CPU; maxima are fixed, so read once."""
    gpus = [FakeGpu(), FakeGpu(uuid="GPU-2", bus_id="00000000:2A:00.0")]
    nvml = fake_nvml(gpus)
    backend = open_backend("nvml", BackendOptions(modules={"pynvml": nvml}))
    snaps = [backend.sample() for _ in range(3)]
    assert nvml.calls.count("nvmlDeviceGetMaxClockInfo") == 2 * 4
    assert nvml.calls.count("nvmlDeviceGetClockInfo") == 3 * 2 * 4  # current clocks every sample
    for snap in snaps:
        assert value(snap, "1", "aaco.gpu.clock.max", clock="memory") == 2619e6
    gpus[1].uuid = "GPU-3"  # another board under the same index: its maxima are read
    backend.sample()
    assert nvml.calls.count("nvmlDeviceGetMaxClockInfo") == 3 * 4
    backend.close()


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        (0x0, {"power": 0.0, "thermal": 0.0, "other": 0.0}),
        (0x1, {"power": 0.0, "thermal": 0.0, "other": 0.0}),  # idle is not throttling
        (0x4, {"power": 1.0, "thermal": 0.0, "other": 0.0}),
        (0x80 | 0x40, {"power": 1.0, "thermal": 1.0, "other": 0.0}),
        (0x20, {"power": 0.0, "thermal": 1.0, "other": 0.0}),
        (0x8, {"power": 0.0, "thermal": 0.0, "other": 1.0}),
    ],
)
def test_nvml_clock_event_reasons(mask: int, expected: dict[str, float]):
    backend = open_backend("nvml", BackendOptions(modules={"pynvml": fake_nvml([FakeGpu(reasons=mask)])}))
    snap = backend.sample()
    assert {r: value(snap, "0", "aaco.gpu.throttle.active", reason=r) for r in expected} == expected


def test_nvml_unsupported_queries_are_skipped_and_lost_gpus_dropped():
    gpus = [FakeGpu(unsupported={"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTotalEccErrors"}), FakeGpu()]
    nvml = fake_nvml(gpus)
    backend = open_backend("nvml", BackendOptions(modules={"pynvml": nvml}))
    snap = backend.sample()
    assert not any(r.metric in ("hw.energy", "hw.errors") for r in snap.gpus[0].readings)
    assert snap.problems == []
    gpus[1].lost = True
    snap = backend.sample()
    assert [g.gpu.index for g in snap.gpus] == ["0"]
    assert [p.field for p in snap.problems] == ["gpu[1]"]


def test_nvml_missing_library_is_a_clear_error():
    broken = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def nvmlInit() -> None:
        raise NVMLError("NVML Shared Library Not Found")

    broken.NVMLError, broken.nvmlInit = NVMLError, nvmlInit
    with pytest.raises(BackendError, match="NVML Shared Library Not Found"):
        open_backend("nvml", BackendOptions(modules={"pynvml": broken}))


def test_amdsmi_readings_and_throttle_bits():
    lib = fake_amdsmi([FakeAmdGpu()])
    backend = open_backend("amdsmi", BackendOptions(modules={"amdsmi": lib}))
    snap = backend.sample()
    g = snap.gpus[0]
    assert (g.gpu.model, g.gpu.uuid, g.gpu.pci_bus, g.gpu.vendor) == (
        "AMD Instinct MI300X",
        "5fff74a1-0000-1000-80a5-b3d9b9ae3b6c",
        "0000:0c:00.0",
        "amd",
    )
    assert value(snap, "0", "hw.gpu.utilization") == 0.92
    assert value(snap, "0", "hw.power") == 610
    assert value(snap, "0", "hw.temperature", sensor="junction") == 71
    assert value(snap, "0", "hw.temperature", sensor="memory") == 58
    assert value(snap, "0", "aaco.gpu.clock.frequency", clock="graphics") == 2100e6
    assert value(snap, "0", "aaco.gpu.clock.max", clock="memory") == 1300e6
    assert value(snap, "0", "hw.gpu.memory.limit") == 192 * 2**30
    assert value(snap, "0", "hw.energy") == pytest.approx(15.3)
    assert value(snap, "0", "hw.errors", error_type="uncorrected") == 1
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="thermal") == 1.0
    assert value(snap, "0", "aaco.gpu.throttle.active", reason="power") == 0.0
    assert not any(r.attrs == (("clock", "soc"),) for r in g.readings)  # NOT_SUPPORTED: left out
    assert snap.problems == []
    backend.close()
    assert lib.state == {"init": 1, "shutdown": 1}


def test_amdsmi_na_values_and_a_gone_device():
    gpus = [FakeAmdGpu(gfx_activity="N/A"), FakeAmdGpu(uuid="b")]
    backend = open_backend("amdsmi", BackendOptions(modules={"amdsmi": fake_amdsmi(gpus)}))
    snap = backend.sample()
    assert not any(r.metric == "hw.gpu.utilization" for r in snap.gpus[0].readings)
    gpus[1].gone = True
    snap = backend.sample()
    assert [g.gpu.index for g in snap.gpus] == ["0"]
    assert [p.field for p in snap.problems] == ["gpu[1]"]


def test_nvml_fans_pstate_and_pcie_link():
    gpus = [FakeGpu(fans=(30, 32), fan_rpm=1450, pstate=2, pcie=(4, 8)), FakeGpu(uuid="GPU-2")]
    nvml = fake_nvml(gpus)
    backend = open_backend("nvml", BackendOptions(modules={"pynvml": nvml}))
    for _ in range(2):
        snap = backend.sample()
    assert value(snap, "0", "hw.fan.speed_ratio", fan="0") == 0.30
    assert value(snap, "0", "hw.fan.speed_ratio", fan="1") == 0.32
    assert value(snap, "0", "hw.fan.speed", fan="0") == 1450
    assert value(snap, "0", "aaco.gpu.pstate") == 2
    assert value(snap, "0", "aaco.gpu.pcie.link.generation") == 4
    assert value(snap, "0", "aaco.gpu.pcie.link.width") == 8
    # an H100 has no fans: counted once per GPU, no fan reading, no problem
    assert not any(r.metric.startswith("hw.fan") for r in snap.gpus[1].readings)
    assert nvml.calls.count("nvmlDeviceGetNumFans") == 2
    assert nvml.calls.count("nvmlDeviceGetFanSpeed_v2") == 2 * 2
    assert snap.problems == []
    backend.close()


def test_nvml_without_a_fan_count_reads_the_one_fan_speed():
    gpu = FakeGpu(fans=(41,), pstate=32, unsupported={"nvmlDeviceGetNumFans", "nvmlDeviceGetFanSpeedRPM"})
    snap = open_backend("nvml", BackendOptions(modules={"pynvml": fake_nvml([gpu])})).sample()
    assert value(snap, "0", "hw.fan.speed_ratio", fan="0") == 0.41
    assert not any(r.metric in ("hw.fan.speed", "aaco.gpu.pstate") for r in snap.gpus[0].readings)  # P-state unknown


def test_nvml_vgpu_guest_zeros_are_absent():
    vgpu = FakeGpu(
        virtualization_mode=2,  # NVML_GPU_VIRTUALIZATION_MODE_VGPU
        temp=0,
        power_mw=0,
        clocks=dict.fromkeys(range(4), 0),
        max_clocks=dict.fromkeys(range(4), 0),
        util=(0, 0),
        fans=(0,),
    )
    passthrough = FakeGpu(uuid="GPU-2", virtualization_mode=1, clocks={0: 0, 1: 0, 2: 405, 3: 555}, fans=(0,))
    snap = open_backend("nvml", BackendOptions(modules={"pynvml": fake_nvml([vgpu, passthrough])})).sample()
    guest = {r.metric for r in snap.gpus[0].readings}
    assert not guest & {
        "hw.temperature",
        "hw.power",
        "aaco.gpu.clock.frequency",
        "aaco.gpu.clock.max",
        "hw.fan.speed_ratio",
    }
    assert value(snap, "0", "hw.gpu.utilization") == 0.0  # the guest's own
    assert value(snap, "1", "aaco.gpu.clock.frequency", clock="graphics") == 0.0  # a gated clock of a whole GPU
    assert value(snap, "1", "hw.fan.speed_ratio", fan="0") == 0.0


def test_amdsmi_fan_voltage_pcie_dpm_levels_and_names():
    gpus = [
        FakeAmdGpu(fan=(51, 255, 981), market_name="0x74a1"),  # a device id padded into market_name
        FakeAmdGpu(uuid="b", vddgfx_mv=None, pcie={"pcie_width": "N/A", "pcie_speed": 16000}, dpm={}),
    ]
    snap = open_backend("amdsmi", BackendOptions(modules={"amdsmi": fake_amdsmi(gpus)})).sample()
    assert snap.gpus[0].gpu.model == "AMD Instinct MI300X"  # device 0x74A1 in amdgpu.ids
    assert value(snap, "0", "hw.fan.speed_ratio", fan="0") == 51 / 255
    assert value(snap, "0", "hw.fan.speed", fan="0") == 981
    assert value(snap, "0", "hw.voltage", sensor="graphics") == 0.75
    assert value(snap, "0", "aaco.gpu.pcie.link.generation") == 5  # 32000 MT/s
    assert value(snap, "0", "aaco.gpu.pcie.link.width") == 16
    assert value(snap, "0", "aaco.gpu.dpm.level", clock="graphics") == 3
    assert value(snap, "0", "aaco.gpu.dpm.level", clock="memory") == 1
    assert not any(r.attrs == (("sensor", "edge"),) for r in snap.gpus[0].readings)  # MI300X's edge reads 0
    second = {r.metric for r in snap.gpus[1].readings}
    assert not second & {"hw.fan.speed_ratio", "hw.voltage", "aaco.gpu.pcie.link.width", "aaco.gpu.dpm.level"}
    assert value(snap, "1", "aaco.gpu.pcie.link.generation") == 4
    assert snap.problems == []
