"""NVIDIA GPUs through NVML (the ``nvidia-ml-py`` package, imported as ``pynvml``).

Per GPU: utilisation (GPU and memory), memory used/total, power and its enforced limit (mW), total
energy (mJ), core
temperature (reported as sensor ``edge``, see ``nvidia_smi``), graphics/SM/memory/video clocks and
their maxima (MHz), clock event ("throttle") reasons, and aggregate ECC counts. A query the GPU
does not support (``NVML_ERROR_NOT_SUPPORTED``) just leaves its reading out; ``GPU_IS_LOST`` (a
GPU that fell off the bus) drops the GPU from the sample, so the source reports it down. The
module is passed in (tests use a fake with nvidia-ml-py's API shape); NVML is initialised once
and shut down on ``close``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, TypeVar

from aaco.agent.sources.smi.values import Fields
from aaco.contract.telemetry import (
    CLOCK,
    CLOCK_MAX,
    ENERGY,
    ERRORS,
    MEMORY_LIMIT,
    MEMORY_USAGE,
    MEMORY_UTILIZATION,
    POWER,
    POWER_LIMIT,
    TEMPERATURE,
    THROTTLE,
    UTILIZATION,
    GpuIdentity,
    GpuSample,
    Snapshot,
    normalize_pci,
)

FORMAT: Final = "nvml"
MAX_CACHED_CLOCKS: Final = 4 * 1024  # four clocks of up to 1024 GPUs seen over the reader's life
T = TypeVar("T")

NVML_ERROR_NOT_SUPPORTED: Final = 3
NVML_ERROR_GPU_IS_LOST: Final = 15

# nvmlClocksEventReason* constant -> reason (the same masks as the older nvmlClocksThrottleReason*)
EVENT_REASONS: Final = (
    ("nvmlClocksEventReasonSwPowerCap", 0x4, "power"),
    ("nvmlClocksEventReasonHwPowerBrakeSlowdown", 0x80, "power"),
    ("nvmlClocksEventReasonSwThermalSlowdown", 0x20, "thermal"),
    ("nvmlClocksEventReasonHwThermalSlowdown", 0x40, "thermal"),
    ("nvmlClocksEventReasonHwSlowdown", 0x8, "other"),
    ("nvmlClocksEventReasonSyncBoost", 0x10, "other"),
)


class GpuLostError(Exception):
    """NVML says the GPU is lost."""


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvmlReader:
    """Samples every GPU NVML sees."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.subject = "nvml"
        nvml.nvmlInit()
        self._open = True
        # Maximum clocks are fixed per board, and each nvmlDeviceGetMaxClockInfo costs ~1.5 ms of CPU (an
        # H100, driver 580: 6 ms of a 11.4 ms sample for the four clocks), so they are read once per GPU.
        self._max_clocks: dict[tuple[str, str], float | None] = {}

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._open:
            self._open = False
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
        for i in range(count):
            where = f"gpu[{i}]"
            try:
                snap.gpus.append(self._gpu(f, where, i))
            except GpuLostError as exc:
                f.problem(where, f"GPU is lost: {exc}")
        snap.problems = f.problems
        return snap

    def _max_clock(self, f: Fields, where: str, h: Any, uuid: str, kind: int, clock: str) -> float | None:
        """A clock's maximum in Hz, read once per GPU (by UUID) and clock; read each time for a GPU without a UUID."""
        key = (uuid, clock)
        if not uuid or key not in self._max_clocks:
            top = self._q(f, where, self.nvml.nvmlDeviceGetMaxClockInfo, h, kind)
            if not uuid:
                return None if top is None else top * 1e6
            if len(self._max_clocks) >= MAX_CACHED_CLOCKS:
                self._max_clocks.clear()
            self._max_clocks[key] = None if top is None else top * 1e6
        return self._max_clocks[key]

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
            s.add(CLOCK_MAX, self._max_clock(f, where, h, s.gpu.uuid, kind, clock), clock=clock)
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
        return s
