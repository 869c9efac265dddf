"""Test doubles of the vendor libraries with their API shapes (not a test module).

``FakeNvml`` mimics nvidia-ml-py (``pynvml``): the same function and constant names, the same
return shapes (objects with ``.gpu``/``.memory``, ``.used``/``.total``, ``.busId``), NVML errors
as ``NVMLError`` with ``.value``. ``FakeAmdSmi`` mimics the AMD SMI Python library (``amdsmi``, as
shipped in ROCm 7.0): ``amdsmi_*`` functions returning dicts, IntEnum-like constants,
``AmdSmiLibraryException`` with ``err_code``.
"""

from __future__ import annotations

import enum
import errno
import os
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-11111111-2222-3333-4444-555555555555"
    bus_id: str = "00000000:18:00.0"
    util: tuple[int, int] = (87, 40)
    mem: tuple[int, int] = (30 * 2**30, 80 * 2**30)
    power_mw: int = 350_000
    power_limit_mw: int = 700_000
    energy_mj: int = 123_456_789
    temp: int = 61
    clocks: dict[int, int] = field(default_factory=lambda: {0: 1755, 1: 1755, 2: 2619, 3: 1500})
    max_clocks: dict[int, int] = field(default_factory=lambda: {0: 1980, 1: 1980, 2: 2619, 3: 1755})
    reasons: int = 0
    ecc: tuple[int, int] = (3, 0)
    pstate: int = 0
    pcie: tuple[int, int] = (5, 16)  # current link generation, width
    fans: tuple[int, ...] = ()  # % per fan: an H100 has none
    fan_rpm: int = 0  # fan 0's
    virtualization_mode: int = 0  # NVML_GPU_VIRTUALIZATION_MODE_NONE
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)


def fake_nvml(gpus: list[FakeGpu]) -> types.ModuleType:
    """A module with nvidia-ml-py's names over ``gpus``."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = NVMLError
    mod.NVML_ERROR_NOT_SUPPORTED = 3
    mod.NVML_ERROR_GPU_IS_LOST = 15
    mod.NVML_TEMPERATURE_GPU = 0
    mod.NVML_CLOCK_GRAPHICS, mod.NVML_CLOCK_SM, mod.NVML_CLOCK_MEM, mod.NVML_CLOCK_VIDEO = 0, 1, 2, 3
    mod.NVML_MEMORY_ERROR_TYPE_CORRECTED, mod.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
    mod.NVML_AGGREGATE_ECC = 1
    mod.NVML_GPU_VIRTUALIZATION_MODE_VGPU = 2
    mod.NVML_PSTATE_UNKNOWN = 32
    mod.nvmlClocksEventReasonGpuIdle = 0x1
    mod.nvmlClocksEventReasonSwPowerCap = 0x4
    mod.nvmlClocksEventReasonHwSlowdown = 0x8
    mod.nvmlClocksEventReasonSyncBoost = 0x10
    mod.nvmlClocksEventReasonSwThermalSlowdown = 0x20
    mod.nvmlClocksEventReasonHwThermalSlowdown = 0x40
    mod.nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x80
    mod.calls = []
    state = {"init": 0, "shutdown": 0}
    mod.state = state

    def handle(fn: str, g: FakeGpu) -> FakeGpu:
        mod.calls.append(fn)
        if g.lost:
            raise NVMLError(15)
        if fn in g.unsupported:
            raise NVMLError(3)
        return g

    def nvmlInit() -> None:
        state["init"] += 1

    def nvmlShutdown() -> None:
        state["shutdown"] += 1

    def nvmlDeviceGetCount() -> int:
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(i: int) -> FakeGpu:
        return gpus[i]

    def nvmlDeviceGetName(h: FakeGpu) -> str:
        return handle("nvmlDeviceGetName", h).name

    def nvmlDeviceGetUUID(h: FakeGpu) -> str:
        return handle("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetPciInfo(h: FakeGpu) -> Any:
        return types.SimpleNamespace(busId=handle("nvmlDeviceGetPciInfo", h).bus_id.encode())

    def nvmlDeviceGetUtilizationRates(h: FakeGpu) -> Any:
        g = handle("nvmlDeviceGetUtilizationRates", h)
        return types.SimpleNamespace(gpu=g.util[0], memory=g.util[1])

    def nvmlDeviceGetMemoryInfo(h: FakeGpu) -> Any:
        g = handle("nvmlDeviceGetMemoryInfo", h)
        return types.SimpleNamespace(used=g.mem[0], total=g.mem[1], free=g.mem[1] - g.mem[0])

    def nvmlDeviceGetPowerUsage(h: FakeGpu) -> int:
        return handle("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(h: FakeGpu) -> int:
        return handle("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(h: FakeGpu) -> int:
        return handle("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetTemperature(h: FakeGpu, sensor: int) -> int:
        assert sensor == 0
        return handle("nvmlDeviceGetTemperature", h).temp

    def nvmlDeviceGetClockInfo(h: FakeGpu, kind: int) -> int:
        return handle("nvmlDeviceGetClockInfo", h).clocks[kind]

    def nvmlDeviceGetMaxClockInfo(h: FakeGpu, kind: int) -> int:
        return handle("nvmlDeviceGetMaxClockInfo", h).max_clocks[kind]

    def nvmlDeviceGetCurrentClocksEventReasons(h: FakeGpu) -> int:
        return handle("nvmlDeviceGetCurrentClocksEventReasons", h).reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(h: FakeGpu) -> int:
        return handle("nvmlDeviceGetCurrentClocksThrottleReasons", h).reasons

    def nvmlDeviceGetTotalEccErrors(h: FakeGpu, kind: int, counter: int) -> int:
        assert counter == 1
        return handle("nvmlDeviceGetTotalEccErrors", h).ecc[kind]

    def nvmlDeviceGetPerformanceState(h: FakeGpu) -> int:
        return handle("nvmlDeviceGetPerformanceState", h).pstate

    def nvmlDeviceGetCurrPcieLinkGeneration(h: FakeGpu) -> int:
        return handle("nvmlDeviceGetCurrPcieLinkGeneration", h).pcie[0]

    def nvmlDeviceGetCurrPcieLinkWidth(h: FakeGpu) -> int:
        return handle("nvmlDeviceGetCurrPcieLinkWidth", h).pcie[1]

    def nvmlDeviceGetNumFans(h: FakeGpu) -> int:
        return len(handle("nvmlDeviceGetNumFans", h).fans)

    def fan(fn: str, h: FakeGpu, i: int) -> int:
        g = handle(fn, h)
        if i >= len(g.fans):
            raise NVMLError(3)  # no such fan: NOT_SUPPORTED, as on a board without fans
        return g.fans[i]

    def nvmlDeviceGetFanSpeed(h: FakeGpu) -> int:
        return fan("nvmlDeviceGetFanSpeed", h, 0)

    def nvmlDeviceGetFanSpeed_v2(h: FakeGpu, i: int) -> int:
        return fan("nvmlDeviceGetFanSpeed_v2", h, i)

    def nvmlDeviceGetFanSpeedRPM(h: FakeGpu) -> int:
        fan("nvmlDeviceGetFanSpeedRPM", h, 0)
        return h.fan_rpm

    def nvmlDeviceGetVirtualizationMode(h: FakeGpu) -> int:
        return handle("nvmlDeviceGetVirtualizationMode", h).virtualization_mode

    for fn in list(locals().values()):
        if callable(fn) and getattr(fn, "__name__", "").startswith("nvml"):
            setattr(mod, fn.__name__, fn)
    return mod


class AmdSmiLibraryException(Exception):  # noqa: N818 - the library's name
    def __init__(self, err_code: int) -> None:
        super().__init__(err_code)
        self.err_code = err_code


@dataclass
class FakeAmdGpu:
    market_name: str = "AMD Instinct MI300X"
    uuid: str = "5fff74a1-0000-1000-80a5-b3d9b9ae3b6c"
    bdf: str = "0000:0c:00.0"
    gfx_activity: int | str = 92
    umc_activity: int | str = 35
    power: dict[str, Any] = field(
        default_factory=lambda: {"socket_power": 610, "current_socket_power": 610, "average_socket_power": "N/A"}
    )
    temps: dict[str, int] = field(default_factory=lambda: {"EDGE": 0, "HOTSPOT": 71, "VRAM": 58})
    clocks: dict[str, dict[str, Any]] = field(
        default_factory=lambda: {
            "GFX": {"clk": 2100, "min_clk": 500, "max_clk": 2100},
            "MEM": {"clk": 1300, "min_clk": 900, "max_clk": 1300},
        }
    )
    vram: tuple[int, int] = (100 * 2**30, 192 * 2**30)
    energy: dict[str, Any] = field(
        default_factory=lambda: {"energy_accumulator": 1_000_000, "counter_resolution": 15.3, "timestamp": 1}
    )
    indep_throttle_status: int | str = 1 << 32  # TEMP_GPU: thermal
    fan: tuple[int, int, int] | None = None  # speed (of max), max, rpm of fan 0; an MI300X has none
    vddgfx_mv: int | None = 750
    pcie: dict[str, Any] = field(default_factory=lambda: {"pcie_width": 16, "pcie_speed": 32000})  # MT/s
    dpm: dict[str, int] = field(default_factory=lambda: {"GFX": 3, "MEM": 1})  # current DPM level per clock
    gone: bool = False


def fake_amdsmi(gpus: list[FakeAmdGpu]) -> types.ModuleType:
    """A module with the AMD SMI library's names over ``gpus``."""
    mod = types.ModuleType("amdsmi")
    mod.AmdSmiLibraryException = AmdSmiLibraryException
    mod.AmdSmiInitFlags = enum.IntEnum("AmdSmiInitFlags", {"INIT_AMD_GPUS": 2})
    mod.AmdSmiTemperatureType = enum.IntEnum(
        "AmdSmiTemperatureType", {"EDGE": 0, "HOTSPOT": 1, "JUNCTION": 1, "VRAM": 2}
    )
    mod.AmdSmiTemperatureMetric = enum.IntEnum("AmdSmiTemperatureMetric", {"CURRENT": 0, "MAX": 1})
    mod.AmdSmiClkType = enum.IntEnum(
        "AmdSmiClkType", {"SYS": 0, "GFX": 0, "DF": 1, "DCEF": 2, "SOC": 3, "MEM": 4, "VCLK0": 6, "DCLK0": 8}
    )
    mod.AmdSmiMemoryType = enum.IntEnum("AmdSmiMemoryType", {"VRAM": 0, "VIS_VRAM": 1, "GTT": 2})
    mod.AmdSmiVoltageType = enum.IntEnum("AmdSmiVoltageType", {"VDDGFX": 0, "INVALID": 1})
    mod.AmdSmiVoltageMetric = enum.IntEnum("AmdSmiVoltageMetric", {"CURRENT": 0, "MAX": 1, "MIN": 3})
    state = {"init": 0, "shutdown": 0}
    mod.state = state

    def g_(h: FakeAmdGpu) -> FakeAmdGpu:
        if h.gone:
            raise AmdSmiLibraryException(31)  # AMDSMI_STATUS_NOT_FOUND
        return h

    def amdsmi_init(flag: int = 2) -> None:
        state["init"] += 1

    def amdsmi_shut_down() -> None:
        state["shutdown"] += 1

    def amdsmi_get_processor_handles() -> list[FakeAmdGpu]:
        return list(gpus)

    def amdsmi_get_gpu_asic_info(h: FakeAmdGpu) -> dict[str, Any]:
        return {"market_name": g_(h).market_name, "vendor_id": 0x1002, "device_id": 0x74A1}

    def amdsmi_get_gpu_device_uuid(h: FakeAmdGpu) -> str:
        return g_(h).uuid

    def amdsmi_get_gpu_device_bdf(h: FakeAmdGpu) -> str:
        return g_(h).bdf

    def amdsmi_get_gpu_activity(h: FakeAmdGpu) -> dict[str, Any]:
        g = g_(h)
        return {"gfx_activity": g.gfx_activity, "umc_activity": g.umc_activity, "mm_activity": "N/A"}

    def amdsmi_get_power_info(h: FakeAmdGpu) -> dict[str, Any]:
        return dict(g_(h).power)

    def amdsmi_get_temp_metric(h: FakeAmdGpu, sensor: Any, metric: Any) -> int:
        g = g_(h)
        name = {0: "EDGE", 1: "HOTSPOT", 2: "VRAM"}[int(sensor)]
        if g.temps.get(name) is None:
            raise AmdSmiLibraryException(2)  # AMDSMI_STATUS_NOT_SUPPORTED
        return g.temps[name]

    def amdsmi_get_clock_info(h: FakeAmdGpu, clk: Any) -> dict[str, Any]:
        g = g_(h)
        name = {0: "GFX", 4: "MEM", 3: "SOC", 6: "VCLK0", 8: "DCLK0"}.get(int(clk), "")
        if name not in g.clocks:
            raise AmdSmiLibraryException(2)
        return {**g.clocks[name], "clk_locked": "N/A", "clk_deep_sleep": "N/A"}

    def amdsmi_get_gpu_memory_usage(h: FakeAmdGpu, kind: Any) -> int:
        return g_(h).vram[0]

    def amdsmi_get_gpu_memory_total(h: FakeAmdGpu, kind: Any) -> int:
        return g_(h).vram[1]

    def amdsmi_get_energy_count(h: FakeAmdGpu) -> dict[str, Any]:
        return dict(g_(h).energy)

    def amdsmi_get_gpu_total_ecc_count(h: FakeAmdGpu) -> dict[str, Any]:
        g_(h)
        return {"correctable_count": 4, "uncorrectable_count": 1, "deferred_count": 0}

    def fan(h: FakeAmdGpu, sensor: int, i: int) -> int:
        g = g_(h)
        if g.fan is None or sensor != 0:
            raise AmdSmiLibraryException(2)  # AMDSMI_STATUS_NOT_SUPPORTED: no fan
        return g.fan[i]

    def amdsmi_get_gpu_fan_speed(h: FakeAmdGpu, sensor: int) -> int:
        return fan(h, sensor, 0)

    def amdsmi_get_gpu_fan_speed_max(h: FakeAmdGpu, sensor: int) -> int:
        return fan(h, sensor, 1)

    def amdsmi_get_gpu_fan_rpms(h: FakeAmdGpu, sensor: int) -> int:
        return fan(h, sensor, 2)

    def amdsmi_get_gpu_volt_metric(h: FakeAmdGpu, sensor: Any, metric: Any) -> int:
        g = g_(h)
        assert (int(sensor), int(metric)) == (0, 0)  # VDDGFX, CURRENT
        if g.vddgfx_mv is None:
            raise AmdSmiLibraryException(2)
        return g.vddgfx_mv

    def amdsmi_get_pcie_info(h: FakeAmdGpu) -> dict[str, Any]:
        static = {"max_pcie_width": 16, "max_pcie_speed": 32000, "pcie_interface_version": 5, "slot_type": "OAM"}
        return {"pcie_static": static, "pcie_metric": {**g_(h).pcie, "pcie_bandwidth": "N/A"}}

    def amdsmi_get_clk_freq(h: FakeAmdGpu, clk: Any) -> dict[str, Any]:
        name = {0: "GFX", 4: "MEM"}.get(int(clk), "")
        if name not in g_(h).dpm:
            raise AmdSmiLibraryException(2)
        return {"num_supported": 4, "current": h.dpm[name], "frequency": [500e6, 900e6, 1500e6, 2100e6]}

    def amdsmi_get_gpu_metrics_info(h: FakeAmdGpu) -> dict[str, Any]:
        return {"common_header.format_revision": 1, "indep_throttle_status": g_(h).indep_throttle_status}

    for fn in list(locals().values()):
        if callable(fn) and getattr(fn, "__name__", "").startswith("amdsmi_"):
            setattr(mod, fn.__name__, fn)
    return mod


def fail_reads_of(suffix: str, monkeypatch: pytest.MonkeyPatch, call: str = "read") -> Callable[..., bytes]:
    """Make ``os.<call>`` (``read`` or ``pread``) fail with ENODEV, as a GPU that fell off the bus does,
    on descriptors open on a path ending in ``suffix``; returns the real function, to put back."""
    real: Callable[..., bytes] = getattr(os, call)

    def failing(fd: int, *args: int) -> bytes:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(suffix):
            raise OSError(errno.ENODEV, "No such device")
        return real(fd, *args)

    monkeypatch.setattr(os, call, failing)
    return real
