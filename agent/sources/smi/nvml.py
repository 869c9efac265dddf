"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

Per GPU: utilisation (GPU and memory), memory used/total, power and its enforced limit (mW), total
energy (mJ), core
temperature (reported as sensor ``edge``, see ``nvidia_smi``), graphics/SM/memory/video clocks and
their maxima (MHz), clock event ("throttle") reasons, aggregate ECC counts, the performance state
(P0..P15), the PCIe link's current generation and width, a GPU in MIG mode's MIG devices, each a
device of its own with its memory (``nvml_mig``), the health readings every tenth sample
(``nvml_health``), the activity counters of GPM on Hopper and later (``nvml_gpm``; with a
``counters_guard``), and each fan's speed (% of its full
speed, ``nvmlDeviceGetFanSpeed_v2`` per fan of ``nvmlDeviceGetNumFans``, else the one of
``nvmlDeviceGetFanSpeed``; rpm of fan 0, the one ``nvmlDeviceGetFanSpeedRPM`` reads). Zeros that
cannot be readings are left out (``placeholders``), on a vGPU guest
(``nvmlDeviceGetVirtualizationMode``) its sensors' zeros too. A query the GPU
does not support (``NVML_ERROR_NOT_SUPPORTED``) just leaves its reading out; ``GPU_IS_LOST`` (a
GPU that fell off the bus) drops the GPU from the sample, so the source reports it down. The
module is passed in (tests use a fake with nvidia-ml-py's API shape); NVML is initialised once
and shut down on ``close``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, TypeVar

from aaco.agent.sources.smi.counters_guard import CountersGuard
from aaco.agent.sources.smi.nvml_errors import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_NOT_SUPPORTED, GpuLostError
from aaco.agent.sources.smi.nvml_gpm import GpmReader
from aaco.agent.sources.smi.nvml_health import EVERY as HEALTH_EVERY
from aaco.agent.sources.smi.nvml_health import read_health
from aaco.agent.sources.smi.nvml_mig import read_mig
from aaco.agent.sources.smi.placeholders import drop_placeholders
from aaco.agent.sources.smi.values import Fields
from aaco.contract.telemetry import (
    CLOCK,
    CLOCK_MAX,
    ENERGY,
    ERRORS,
    FAN_SPEED,
    FAN_SPEED_RATIO,
    MEMORY_LIMIT,
    MEMORY_USAGE,
    MEMORY_UTILIZATION,
    PCIE_LINK_GENERATION,
    PCIE_LINK_WIDTH,
    POWER,
    POWER_LIMIT,
    PSTATE,
    TEMPERATURE,
    THROTTLE,
    UTILIZATION,
    GpuIdentity,
    GpuSample,
    Snapshot,
    normalize_pci,
)

FORMAT: Final = "nvml"
MAX_CACHED: Final = (
    8 * 1024
)  # six facts (four maximum clocks, fans, mode) of up to 1024 GPUs seen over the reader's life
T = TypeVar("T")

NVML_GPU_VIRTUALIZATION_MODE_VGPU: Final = 2  # a vGPU guest
NVML_PSTATE_UNKNOWN: Final = 32

# nvmlClocksEventReason* constant -> reason (the same masks as the older nvmlClocksThrottleReason*)
EVENT_REASONS: Final = (
    ("nvmlClocksEventReasonSwPowerCap", 0x4, "power"),
    ("nvmlClocksEventReasonHwPowerBrakeSlowdown", 0x80, "power"),
    ("nvmlClocksEventReasonSwThermalSlowdown", 0x20, "thermal"),
    ("nvmlClocksEventReasonHwThermalSlowdown", 0x40, "thermal"),
    ("nvmlClocksEventReasonHwSlowdown", 0x8, "other"),
    ("nvmlClocksEventReasonSyncBoost", 0x10, "other"),
)


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvmlReader:
    """Samples every GPU NVML sees."""

    def __init__(self, nvml: ModuleType, guard: CountersGuard | None = None) -> None:
        self.nvml = nvml
        self.subject = "nvml"
        nvml.nvmlInit()
        self._open = True
        # Maximum clocks are fixed per board, and each nvmlDeviceGetMaxClockInfo costs ~1.5 ms of CPU (an
        # H100, driver 580: 6 ms of a 11.4 ms sample for the four clocks), so they are read once per GPU,
        # as are the other facts of a board (its number of fans, its virtualization mode).
        self._fixed: dict[tuple[str, str], Any] = {}
        self._samples = 0  # health readings on the first sample and every nvml_health.EVERY-th
        self.gpm = GpmReader(nvml, guard) if guard is not None else None  # activity counters

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._open:
            self._open = False
            if self.gpm is not None:
                self.gpm.close()
            with contextlib.suppress(Exception):  # shutting down after a driver failure: nothing left to do
                self.nvml.nvmlShutdown()

    def _q(self, f: Fields, where: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code == NVML_ERROR_NOT_SUPPORTED:
                return None
            if code == NVML_ERROR_GPU_IS_LOST:
                raise GpuLostError(str(exc)) from exc
            f.problem(where, f"{getattr(fn, '__name__', 'nvml')}: {exc}")
            return None

    def sample(self) -> Snapshot:
        """One sample of every GPU."""
        n = self.nvml
        f = Fields(self.subject)
        snap = Snapshot(FORMAT)
        count = n.nvmlDeviceGetCount()
        self._samples += 1
        if self.gpm is not None:
            self.gpm.start_sample()
        for i in range(count):
            where = f"gpu[{i}]"
            try:
                s = self._gpu(f, where, i)
                h = self._q(f, where, n.nvmlDeviceGetHandleByIndex, i)
                migs = read_mig(n, f, where, functools.partial(self._q, f, where), s.gpu, h) if h else []
                snap.gpus += [s, *migs]
            except GpuLostError as exc:
                f.problem(where, f"GPU is lost: {exc}")
        snap.problems = f.problems
        return snap

    def _once(self, f: Fields, where: str, uuid: str, fact: str, fn: Callable[..., T], *args: Any) -> T | None:
        """A fact fixed per board, read once per GPU (by UUID); read each time for a GPU without a UUID."""
        if not uuid:
            return self._q(f, where, fn, *args)
        key = (uuid, fact)
        if key not in self._fixed:
            if len(self._fixed) >= MAX_CACHED:
                self._fixed.clear()
            self._fixed[key] = self._q(f, where, fn, *args)
        return self._fixed[key]

    def _fans(self, f: Fields, where: str, h: Any, s: GpuSample) -> None:
        """Each fan's speed ratio (and fan 0's rpm); nothing on a board without fans."""
        n = self.nvml
        count_fans = getattr(n, "nvmlDeviceGetNumFans", None)
        fans = self._once(f, where, s.gpu.uuid, "fans", count_fans, h) if count_fans is not None else None
        if fans is None:  # a driver that does not count them: the one fan speed it reports
            pct = self._q(f, where, n.nvmlDeviceGetFanSpeed, h)
            s.add(FAN_SPEED_RATIO, None if pct is None else pct / 100.0, fan="0")
            return
        for i in range(int(fans)):
            pct = self._q(f, where, n.nvmlDeviceGetFanSpeed_v2, h, i)
            s.add(FAN_SPEED_RATIO, None if pct is None else pct / 100.0, fan=str(i))
        if fans and hasattr(n, "nvmlDeviceGetFanSpeedRPM"):
            s.add(FAN_SPEED, self._q(f, where, n.nvmlDeviceGetFanSpeedRPM, h), fan="0")

    def _gpu(self, f: Fields, where: str, i: int) -> GpuSample:
        n = self.nvml
        h = self._q(f, where, n.nvmlDeviceGetHandleByIndex, i)
        if h is None:
            raise GpuLostError("no handle")
        pci = self._q(f, where, n.nvmlDeviceGetPciInfo, h)
        s = GpuSample(
            GpuIdentity(
                str(i),
                uuid=_text(self._q(f, where, n.nvmlDeviceGetUUID, h) or ""),
                pci_bus=normalize_pci(_text(getattr(pci, "busId", "") or "")) if pci is not None else "",
                model=_text(self._q(f, where, n.nvmlDeviceGetName, h) or ""),
                vendor="nvidia",
            )
        )
        util = self._q(f, where, n.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            s.add(UTILIZATION, util.gpu / 100.0)
            s.add(MEMORY_UTILIZATION, util.memory / 100.0)
        mem = self._q(f, where, n.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            s.add(MEMORY_USAGE, float(mem.used))
            s.add(MEMORY_LIMIT, float(mem.total))
        mw = self._q(f, where, n.nvmlDeviceGetPowerUsage, h)
        s.add(POWER, None if mw is None else mw / 1000.0)
        cap_mw = self._q(f, where, n.nvmlDeviceGetEnforcedPowerLimit, h)
        s.add(POWER_LIMIT, None if cap_mw is None else cap_mw / 1000.0)
        mj = self._q(f, where, n.nvmlDeviceGetTotalEnergyConsumption, h)
        s.add(ENERGY, None if mj is None else mj / 1000.0)
        s.add(TEMPERATURE, self._q(f, where, n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU), sensor="edge")
        for const, clock in (
            ("NVML_CLOCK_GRAPHICS", "graphics"),
            ("NVML_CLOCK_SM", "sm"),
            ("NVML_CLOCK_MEM", "memory"),
            ("NVML_CLOCK_VIDEO", "video"),
        ):
            kind = getattr(n, const)
            mhz = self._q(f, where, n.nvmlDeviceGetClockInfo, h, kind)
            s.add(CLOCK, None if mhz is None else mhz * 1e6, clock=clock)
            top = self._once(f, where, s.gpu.uuid, clock, n.nvmlDeviceGetMaxClockInfo, h, kind)
            s.add(CLOCK_MAX, None if top is None else top * 1e6, clock=clock)
        get_reasons = (
            getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) or n.nvmlDeviceGetCurrentClocksThrottleReasons
        )
        mask = self._q(f, where, get_reasons, h)
        if mask is not None:
            active: dict[str, bool] = {"power": False, "thermal": False, "other": False}
            for const, default, reason in EVENT_REASONS:
                bit = getattr(n, const, default)
                active[reason] = active[reason] or bool(int(mask) & bit)
            for reason, on in active.items():
                s.add(THROTTLE, float(on), reason=reason)
        for err_type, kind in (
            ("corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
            ("uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED"),
        ):
            count = self._q(f, where, n.nvmlDeviceGetTotalEccErrors, h, getattr(n, kind), n.NVML_AGGREGATE_ECC)
            s.add(ERRORS, count, error_type=err_type)
        pstate = self._q(f, where, n.nvmlDeviceGetPerformanceState, h)
        s.add(PSTATE, None if pstate is None or pstate == NVML_PSTATE_UNKNOWN else pstate)
        s.add(PCIE_LINK_GENERATION, self._q(f, where, n.nvmlDeviceGetCurrPcieLinkGeneration, h))
        s.add(PCIE_LINK_WIDTH, self._q(f, where, n.nvmlDeviceGetCurrPcieLinkWidth, h))
        self._fans(f, where, h, s)
        if (self._samples - 1) % HEALTH_EVERY == 0:
            read_health(
                n,
                lambda fn, *a: self._q(f, where, fn, *a),
                lambda fact, fn, *a: self._once(f, where, s.gpu.uuid, fact, fn, *a),
                h,
                s,
            )
        if self.gpm is not None:
            self.gpm.read(f, where, s.gpu.uuid or where, h, s)
        get_mode = getattr(n, "nvmlDeviceGetVirtualizationMode", None)
        mode = self._once(f, where, s.gpu.uuid, "mode", get_mode, h) if get_mode is not None else None
        drop_placeholders(s, vgpu=mode == NVML_GPU_VIRTUALIZATION_MODE_VGPU)
        return s
