"""AMD GPUs through the AMD SMI Python library (``import amdsmi``; ships with ROCm, needs libamd_smi).

Per processor handle: ``amdsmi_get_gpu_activity`` (gfx/umc activity, %), ``amdsmi_get_power_info``
(socket power, W), ``amdsmi_get_temp_metric`` (edge, hotspot = junction, VRAM = memory; Celsius),
``amdsmi_get_clock_info`` (GFX, MEM, SOC, VCLK0, DCLK0: current and max, MHz),
``amdsmi_get_gpu_memory_usage`` / ``_total`` (VRAM, bytes), ``amdsmi_get_energy_count``
(accumulator x resolution, microjoules), ``amdsmi_get_gpu_total_ecc_count`` and
``amdsmi_get_gpu_metrics_info`` (``indep_throttle_status`` for throttle reasons, see
``gpu_metrics``), fan 0 (``amdsmi_get_gpu_fan_speed`` of ``_fan_speed_max``, ``_fan_rpms``), the
graphics voltage (``amdsmi_get_gpu_volt_metric`` VDDGFX, mV), the PCIe link
(``amdsmi_get_pcie_info``'s ``pcie_metric``: width, speed in MT/s) and the graphics and memory DPM
levels (``amdsmi_get_clk_freq``'s ``current``). The model is ``market_name`` unless the library
padded a device id there (``0x74a1``), else the marketing name of ``device_id`` / ``rev_id``
(``amdgpu_ids``). Values the library reports as ``"N/A"`` are left out, as are zeros that cannot
be readings (``placeholders``); a call that raises
``AmdSmiLibraryException`` for an unsupported query is skipped, one that says the device is gone
drops the GPU from the sample. The module is passed in (tests use a fake with the library's API
shape). In a partitioned compute mode (DPX .. CPX) the library's one handle per partition is folded
into one GPU and its partitions (``amdsmi_partitions``).

Activity (docs/health.md, "Activity"; with a ``counters_guard``): ``amdsmi_get_gpu_activity``'s
``gfx_activity`` as ``aaco.gpu.graphics.active``, ``umc_activity`` as ``aaco.gpu.dram.active`` and
the busiest of ``mm_activity`` and the VCN engines (``amdsmi_get_gpu_metrics_info``'s
``vcn_activity``, ``xcp_stats.vcn_busy``) as ``aaco.gpu.media.active``, percentages as ratios
(``amd_activity``). The activity call also gives the utilisation, so it is made while paused; only
its activity readings are withheld. A call answering ``AMDSMI_STATUS_BUSY`` or ``RETRY`` pauses
the sample as busy (no problem reported); other failures count towards turning them off.

Health (docs/health.md): ``amdsmi_get_gpu_ecc_count`` per RAS block (UMC, SDMA, GFX, MMHUB,
PCIE_BIF, HDP, XGMI_WAFL, the blocks amd-smi itself shows; ``block`` in lower case as amdgpu's sysfs
names it), ``amdsmi_get_gpu_bad_page_info`` (a record per bad page, ``status`` RESERVED and
UNRESERVABLE counted as retired pages ``cause=ecc``, PENDING as pending: as the sysfs backend counts
``gpu_vram_bad_pages``' R, F and P; older libraries say ``"No bad pages found."``), and the PCIe
replays: ``amdsmi_get_pcie_info``'s ``pcie_replay_count`` (gpu_metrics), else
``amdsmi_get_gpu_pci_replay_counter`` (sysfs ``pcie_replay_count``). These calls are optional: one
the library lacks is not made, one a GPU does not support (a board without RAS) is not made again
for that GPU (by UUID, else position), and one that fails otherwise is a problem of that sample, the other
readings kept; one that raises anything else (an API of another shape) is a problem once and not
made again for that GPU.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final, TypeVar

from aaco.agent.sources.smi.amd_activity import library_activity
from aaco.agent.sources.smi.amdgpu_ids import model_name
from aaco.agent.sources.smi.amdsmi_partitions import fold_partitions
from aaco.agent.sources.smi.counters_guard import CountersGuard
from aaco.agent.sources.smi.gpu_metrics import throttle_reasons
from aaco.agent.sources.smi.placeholders import drop_placeholders
from aaco.agent.sources.smi.values import Fields, pcie_generation
from aaco.contract.telemetry import (
    CLOCK,
    CLOCK_MAX,
    DPM_LEVEL,
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ENERGY,
    ERRORS,
    FAN_SPEED,
    FAN_SPEED_RATIO,
    MEMORY_LIMIT,
    MEMORY_USAGE,
    MEMORY_UTILIZATION,
    PCIE_LINK_GENERATION,
    PCIE_LINK_WIDTH,
    PCIE_REPLAYS,
    POWER,
    RETIRED_PAGES,
    RETIRED_PAGES_PENDING,
    TEMPERATURE,
    THROTTLE,
    THROTTLE_REASONS,
    UTILIZATION,
    VOLTAGE,
    GpuIdentity,
    GpuSample,
    Snapshot,
    normalize_pci,
)

FORMAT: Final = "amdsmi"
T = TypeVar("T")

# amdsmi_status_t values (amdsmi_wrapper.AMDSMI_STATUS_*) that mean "not available on this GPU"
# (NOT_SUPPORTED, NOT_YET_IMPLEMENTED, NO_DATA, SETTING_UNAVAILABLE) and "the device is gone"
# (DRM_ERROR, IO, NOT_FOUND, DRIVER_NOT_LOADED, AMDGPU_RESTART_ERR).
_NOT_SUPPORTED: Final = frozenset({2, 3, 40, 55})
_DEVICE_GONE: Final = frozenset({6, 12, 31, 34, 54})
_BUSY: Final = frozenset({9, 30})  # AMDSMI_STATUS_RETRY, AMDSMI_STATUS_BUSY
# RAS blocks read per GPU (amd-smi metric's own list; amdsmi_get_gpu_ecc_count reads ras/<block>_err_count)
ECC_BLOCKS: Final = ("UMC", "SDMA", "GFX", "MMHUB", "PCIE_BIF", "HDP", "XGMI_WAFL")
# amdsmi_memory_page_status_t: RESERVED, PENDING, UNRESERVABLE
_PAGE_RESERVED, _PAGE_PENDING, _PAGE_UNRESERVABLE = 0, 1, 2
_NO_BAD_PAGES: Final = "no bad pages found."
MAX_SKIPPED: Final = 8 * 1024  # calls of up to 1024 GPUs seen over the reader's life


class DeviceGoneError(Exception):
    """The library says the device is gone."""


class AmdSmiReader:
    """Samples every GPU the AMD SMI library sees."""

    def __init__(self, amdsmi: ModuleType, guard: CountersGuard | None = None) -> None:
        self.lib = amdsmi
        self.guard = guard  # activity counters: None, not read
        amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
        self._open = True
        self._skip: set[tuple[str, str]] = set()  # (GPU, call) not made again: unsupported there

    def close(self) -> None:
        """Shut the library down (once)."""
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):  # shutting down after a driver failure: nothing left to do
                self.lib.amdsmi_shut_down()

    def _q(self, f: Fields, where: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except self.lib.AmdSmiLibraryException as exc:
            code = getattr(exc, "err_code", None)
            if code in _DEVICE_GONE:
                raise DeviceGoneError(str(exc)) from exc
            if code not in _NOT_SUPPORTED:
                f.problem(where, f"{getattr(fn, '__name__', 'amdsmi')}: {exc}")
            return None

    def sample(self) -> Snapshot:
        """One sample of every GPU."""
        f = Fields("amdsmi")
        snap = Snapshot(FORMAT)
        if self.guard is not None:
            self.guard.start_sample()
        read: list[tuple[GpuSample, Any]] = []
        for i, h in enumerate(self.lib.amdsmi_get_processor_handles()):
            where = f"gpu[{i}]"
            try:
                read.append((self._gpu(f, where, i, h), h))
            except DeviceGoneError as exc:
                f.problem(where, f"device is gone: {exc}")
        try:
            snap.gpus = fold_partitions(self.lib, functools.partial(self._q, f, "partitions"), read)
        except DeviceGoneError as exc:
            f.problem("partitions", f"device is gone: {exc}")
            snap.gpus = [s for s, _ in read]
        snap.problems = f.problems
        return snap

    def _gpu(self, f: Fields, where: str, i: int, h: Any) -> GpuSample:
        lib = self.lib
        asic = self._q(f, where, lib.amdsmi_get_gpu_asic_info, h) or {}
        s = GpuSample(
            GpuIdentity(
                str(i),
                uuid=str(self._q(f, where, lib.amdsmi_get_gpu_device_uuid, h) or ""),
                pci_bus=normalize_pci(str(self._q(f, where, lib.amdsmi_get_gpu_device_bdf, h) or "")),
                model=model_name([asic.get("market_name")], asic.get("device_id"), asic.get("rev_id")),
                vendor="amd",
            )
        )
        answer = self._activity(f, where, s.gpu.uuid or where, h)
        activity = answer or {}
        s.add(UTILIZATION, _pct(f, activity.get("gfx_activity"), f"{where}.gfx_activity"))
        s.add(MEMORY_UTILIZATION, _pct(f, activity.get("umc_activity"), f"{where}.umc_activity"))
        power = self._q(f, where, lib.amdsmi_get_power_info, h) or {}
        for key in ("current_socket_power", "average_socket_power", "socket_power"):
            watts = f.num(power.get(key), f"{where}.power_info.{key}")
            if watts is not None:
                s.add(POWER, watts)
                break
        for name, sensor in (("EDGE", "edge"), ("HOTSPOT", "junction"), ("VRAM", "memory")):
            t = self._q(
                f,
                where,
                lib.amdsmi_get_temp_metric,
                h,
                lib.AmdSmiTemperatureType[name],
                lib.AmdSmiTemperatureMetric.CURRENT,
            )
            s.add(TEMPERATURE, f.num(t, f"{where}.temp.{name}"), sensor=sensor)
        for name, clock in (
            ("GFX", "graphics"),
            ("MEM", "memory"),
            ("SOC", "soc"),
            ("VCLK0", "video"),
            ("DCLK0", "decode"),
        ):
            info = self._q(f, where, lib.amdsmi_get_clock_info, h, lib.AmdSmiClkType[name]) or {}
            mhz = f.num(info.get("clk"), f"{where}.clock.{name}.clk")
            s.add(CLOCK, None if mhz is None else mhz * 1e6, clock=clock)
            top = f.num(info.get("max_clk"), f"{where}.clock.{name}.max_clk")
            s.add(CLOCK_MAX, None if top is None else top * 1e6, clock=clock)
        vram = lib.AmdSmiMemoryType.VRAM
        s.add(MEMORY_USAGE, f.num(self._q(f, where, lib.amdsmi_get_gpu_memory_usage, h, vram), f"{where}.vram_used"))
        s.add(MEMORY_LIMIT, f.num(self._q(f, where, lib.amdsmi_get_gpu_memory_total, h, vram), f"{where}.vram_total"))
        energy = self._q(f, where, lib.amdsmi_get_energy_count, h) or {}
        acc = f.num(energy.get("energy_accumulator"), f"{where}.energy_accumulator")
        res = f.num(energy.get("counter_resolution"), f"{where}.counter_resolution")
        s.add(ENERGY, None if acc is None or res is None else acc * res * 1e-6)
        ecc = self._q(f, where, lib.amdsmi_get_gpu_total_ecc_count, h) or {}
        s.add(ERRORS, f.num(ecc.get("correctable_count"), f"{where}.correctable_count"), error_type="corrected")
        s.add(ERRORS, f.num(ecc.get("uncorrectable_count"), f"{where}.uncorrectable_count"), error_type="uncorrected")
        metrics = self._q(f, where, lib.amdsmi_get_gpu_metrics_info, h) or {}
        bits = metrics.get("indep_throttle_status")
        if isinstance(bits, int) and not isinstance(bits, bool):
            reasons = throttle_reasons(bits)
            for reason in THROTTLE_REASONS:
                s.add(THROTTLE, float(reasons[reason]), reason=reason)
        link = self._fan_voltage_pcie(f, where, h, s)
        self._health(f, where, h, s, link)
        if self.guard is not None and answer is not None:
            library_activity(f, where, activity, metrics, s)
            self.guard.publish(s.gpu.uuid or where, s)
        drop_placeholders(s)
        return s

    def _activity(self, f: Fields, where: str, gpu: str, h: Any) -> dict[str, Any] | None:
        """``amdsmi_get_gpu_activity``; None where the GPU does not have it, ``{}`` when it failed."""
        try:
            got = self.lib.amdsmi_get_gpu_activity(h)
        except self.lib.AmdSmiLibraryException as exc:
            code = getattr(exc, "err_code", None)
            if code in _DEVICE_GONE:
                raise DeviceGoneError(str(exc)) from exc
            if code in _NOT_SUPPORTED:
                return None
            if self.guard is not None and code in _BUSY:
                self.guard.busy(gpu)
                return {}
            f.problem(where, f"amdsmi_get_gpu_activity: {exc}")
            if self.guard is not None:
                self.guard.failed(gpu, f"amdsmi_get_gpu_activity: {exc}")
            return {}
        if self.guard is not None:
            self.guard.succeeded(gpu)
        return got if isinstance(got, dict) else {}

    def _fan_voltage_pcie(self, f: Fields, where: str, h: Any, s: GpuSample) -> dict[str, Any]:
        """Fan 0, the graphics voltage, the PCIe link and the graphics and memory DPM levels; the link's metrics."""
        lib = self.lib
        speed = f.num(self._q(f, where, lib.amdsmi_get_gpu_fan_speed, h, 0), f"{where}.fan_speed")
        top = f.num(self._q(f, where, lib.amdsmi_get_gpu_fan_speed_max, h, 0), f"{where}.fan_speed_max")
        s.add(FAN_SPEED_RATIO, speed / top if speed is not None and top else None, fan="0")
        s.add(FAN_SPEED, f.num(self._q(f, where, lib.amdsmi_get_gpu_fan_rpms, h, 0), f"{where}.fan_rpms"), fan="0")
        mv = self._q(
            f, where, lib.amdsmi_get_gpu_volt_metric, h, lib.AmdSmiVoltageType.VDDGFX, lib.AmdSmiVoltageMetric.CURRENT
        )
        volts = f.num(mv, f"{where}.volt.VDDGFX")
        s.add(VOLTAGE, None if volts is None else volts / 1000.0, sensor="graphics")
        link = (self._q(f, where, lib.amdsmi_get_pcie_info, h) or {}).get("pcie_metric") or {}
        s.add(PCIE_LINK_WIDTH, f.num(link.get("pcie_width"), f"{where}.pcie_metric.pcie_width"))
        mts = f.num(link.get("pcie_speed"), f"{where}.pcie_metric.pcie_speed")
        s.add(PCIE_LINK_GENERATION, None if mts is None else pcie_generation(mts / 1000.0))
        for name, clock in (("GFX", "graphics"), ("MEM", "memory")):
            freq = self._q(f, where, lib.amdsmi_get_clk_freq, h, lib.AmdSmiClkType[name]) or {}
            s.add(DPM_LEVEL, f.num(freq.get("current"), f"{where}.clk_freq.{name}.current"), clock=clock)
        return link

    def _optional(self, f: Fields, where: str, gpu: str, name: str, *args: Any, part: str = "") -> Any:
        """``lib.<name>(*args)``, or None: not made when the library lacks it or ``gpu`` did not support it."""
        fn = getattr(self.lib, name, None)
        key = (gpu, f"{name}:{part}")
        if fn is None or key in self._skip:
            return None
        try:
            return fn(*args)
        except self.lib.AmdSmiLibraryException as exc:
            code = getattr(exc, "err_code", None)
            if code in _DEVICE_GONE:
                raise DeviceGoneError(str(exc)) from exc
            if code in _NOT_SUPPORTED:
                self._remember(key)
            else:
                f.problem(where, f"{name}: {exc}")
        except Exception as exc:  # a library of another shape: a problem, not a crash
            self._remember(key)
            f.problem(where, f"{name}: {type(exc).__name__}: {exc}; not called again for this GPU")
        return None

    def _remember(self, key: tuple[str, str]) -> None:
        if len(self._skip) >= MAX_SKIPPED:
            self._skip.clear()
        self._skip.add(key)

    def _health(self, f: Fields, where: str, h: Any, s: GpuSample, link: dict[str, Any]) -> None:
        """ECC counts per RAS block, bad pages (retired, pending) and PCIe replays."""
        lib = self.lib
        gpu = s.gpu.uuid or where
        blocks = getattr(lib, "AmdSmiGpuBlock", None)
        for name in ECC_BLOCKS if blocks is not None and hasattr(lib, "amdsmi_get_gpu_ecc_count") else ():
            if name not in blocks.__members__:
                continue
            ecc = self._optional(f, where, gpu, "amdsmi_get_gpu_ecc_count", h, blocks[name], part=name) or {}
            path = f"{where}.ecc_count.{name}"
            if not isinstance(ecc, dict):
                f.problem(path, f"expected a dict of counts, got {type(ecc).__name__}")
                continue
            block = name.lower()
            s.add(ECC_CORRECTED, f.num(ecc.get("correctable_count"), f"{path}.correctable_count"), block=block)
            s.add(ECC_UNCORRECTED, f.num(ecc.get("uncorrectable_count"), f"{path}.uncorrectable_count"), block=block)
        pages = self._optional(f, where, gpu, "amdsmi_get_gpu_bad_page_info", h)
        if pages is not None:
            _bad_pages(f, f"{where}.bad_page_info", pages, s)
        replays = f.num(link.get("pcie_replay_count"), f"{where}.pcie_metric.pcie_replay_count")
        if replays is None:
            counter = self._optional(f, where, gpu, "amdsmi_get_gpu_pci_replay_counter", h)
            replays = f.num(counter, f"{where}.pci_replay_counter")
        s.add(PCIE_REPLAYS, replays)


def _bad_pages(f: Fields, path: str, pages: Any, s: GpuSample) -> None:
    """Retired (reserved or unreservable) and pending pages of ``amdsmi_get_gpu_bad_page_info``'s records."""
    if isinstance(pages, str) and pages.strip().lower() == _NO_BAD_PAGES:
        pages = []
    if not isinstance(pages, list):
        f.problem(path, f"expected a list of page records, got {type(pages).__name__}")
        return
    retired = pending = 0
    for i, page in enumerate(pages):
        status = page.get("status") if isinstance(page, dict) else None
        if isinstance(status, bool) or not isinstance(status, int):
            f.problem(f"{path}[{i}]", f"expected a record with an integer status, got {page!r:.60}")
            continue
        if status == _PAGE_PENDING:
            pending += 1
        elif status in (_PAGE_RESERVED, _PAGE_UNRESERVABLE):
            retired += 1
        else:
            f.problem(f"{path}[{i}].status", f"not a page status: {status}")
    s.add(RETIRED_PAGES, float(retired), cause="ecc")
    s.add(RETIRED_PAGES_PENDING, float(pending))


def _pct(f: Fields, value: Any, path: str) -> float | None:
    v = f.num(value, path)
    return None if v is None else v / 100.0
