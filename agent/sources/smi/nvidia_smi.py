"""``nvidia-smi -q -x``: the XML log, one ``<gpu>`` per device in index order.

Values carry their unit in the text (``27 C``, ``67.03 W``, ``50 MiB``, ``1275 MHz``) or read
``N/A``. Throttling is ``clocks_event_reasons`` (driver 535+) or ``clocks_throttle_reasons``
(older), each reason ``Active`` / ``Not Active``: power capping and power brake read as reason
``power``, software and hardware thermal slowdown as ``thermal``, a hardware slowdown and sync
boost as ``other`` (idle, application and display clock settings are not throttling). The GPU
core sensor is reported as sensor ``edge`` (NVIDIA has no hotspot sensor in this log; its core
sensor plays the role of AMD's edge sensor, with slowdown thresholds around 90 C), memory as
``memory``. ``hw.errors`` are the aggregate (lifetime) ECC counts; the health sections (volatile ECC
by location, retired pages, remapped rows, PCIe replays) are ``nvidia_smi_health``'s. A GPU in MIG
mode is followed by its MIG devices, each a device of its own with its memory and ECC counts
(``nvidia_smi_mig``); the GPU's readings stay on the GPU.

``fan_speed`` (``30 %``, the first fan's) is fan ``0``'s speed ratio; ``performance_state`` (``P8``) the
P-state; ``pci/pci_gpu_link_info`` the PCIe link's current generation and width (``16x``);
``voltage/graphics_volt`` (``912.500 mV``, older schemas only) the graphics voltage. A vGPU guest
(``gpu_virtualization_mode/virtualization_mode`` VGPU) prints 0 for the sensors it cannot see: those
zeros are left out, as are other zeros that cannot be readings (``placeholders``).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Final

from aaco.agent.sources.smi.nvidia_smi_health import read_health
from aaco.agent.sources.smi.nvidia_smi_mig import read_mig
from aaco.agent.sources.smi.placeholders import drop_placeholders
from aaco.agent.sources.smi.values import Fields, TelemetryFormatError, missing
from aaco.contract.telemetry import (
    CLOCK,
    CLOCK_MAX,
    ENERGY,
    ERRORS,
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
    THROTTLE_REASONS,
    UTILIZATION,
    VOLTAGE,
    GpuIdentity,
    GpuSample,
    Snapshot,
    normalize_pci,
)

FORMAT: Final = "nvidia-smi"
_PSTATE = re.compile(r"^P(\d{1,2})$")
_LINK: Final = "pci/pci_gpu_link_info"

_CLOCKS: Final = (("graphics_clock", "graphics"), ("sm_clock", "sm"), ("mem_clock", "memory"), ("video_clock", "video"))
# reason element suffix -> reason (None: not a throttle)
REASONS: Final[dict[str, str | None]] = {
    "gpu_idle": None,
    "applications_clocks_setting": None,
    "display_clocks_setting": None,
    "sw_power_cap": "power",
    "hw_power_brake_slowdown": "power",
    "sw_thermal_slowdown": "thermal",
    "hw_thermal_slowdown": "thermal",
    "hw_slowdown": "other",
    "sync_boost": "other",
}


def parse_nvidia_smi(text: str | bytes, subject: str) -> Snapshot:
    """Readings of every GPU in an ``nvidia-smi -q -x`` document."""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise TelemetryFormatError(f"not nvidia-smi XML: {exc}", subject=subject) from exc
    if root.tag != "nvidia_smi_log":
        raise TelemetryFormatError(
            f"not nvidia-smi XML: root element <{root.tag}>, expected <nvidia_smi_log>", subject=subject
        )
    f = Fields(subject)
    snap = Snapshot(FORMAT)
    for i, gpu in enumerate(root.findall("gpu")):
        where = f"gpu[{i}]"

        def val(p: str, dim: str, unit: str = "", gpu: ET.Element = gpu, where: str = where) -> float | None:
            el = gpu.find(p)
            if el is None or el.text is None:
                return None
            return f.with_unit(el.text.strip(), f"{where}/{p}", dim, unit)

        def text(p: str, gpu: ET.Element = gpu) -> str:
            el = gpu.find(p)
            return (el.text or "").strip() if el is not None else ""

        s = GpuSample(
            GpuIdentity(
                str(i),
                uuid=text("uuid"),
                pci_bus=normalize_pci(text("pci/pci_bus_id") or gpu.get("id", "")),
                model=text("product_name"),
                vendor="nvidia",
            )
        )
        s.add(UTILIZATION, val("utilization/gpu_util", "ratio", "%"))
        s.add(MEMORY_UTILIZATION, val("utilization/memory_util", "ratio", "%"))
        s.add(MEMORY_USAGE, val("fb_memory_usage/used", "by", "MiB"))
        s.add(MEMORY_LIMIT, val("fb_memory_usage/total", "by", "MiB"))
        for p in (
            "gpu_power_readings/power_draw",
            "gpu_power_readings/instant_power_draw",
            "power_readings/power_draw",
        ):
            watts = val(p, "w", "W")
            if watts is not None:
                s.add(POWER, watts)
                break
        for p in ("gpu_power_readings/current_power_limit", "power_readings/enforced_power_limit"):
            watts = val(p, "w", "W")
            if watts is not None:
                s.add(POWER_LIMIT, watts)
                break
        s.add(ENERGY, val("total_energy_consumption", "j", "J"))
        s.add(TEMPERATURE, val("temperature/gpu_temp", "cel", "C"), sensor="edge")
        s.add(TEMPERATURE, val("temperature/memory_temp", "cel", "C"), sensor="memory")
        for tag, clock in _CLOCKS:
            s.add(CLOCK, val(f"clocks/{tag}", "hz", "MHz"), clock=clock)
            s.add(CLOCK_MAX, val(f"max_clocks/{tag}", "hz", "MHz"), clock=clock)
        s.add(FAN_SPEED_RATIO, val("fan_speed", "ratio", "%"), fan="0")
        s.add(PSTATE, _pstate(f, text("performance_state"), f"{where}/performance_state"))
        s.add(PCIE_LINK_GENERATION, f.num(text(f"{_LINK}/pcie_gen/current_link_gen"), f"{where}/{_LINK}/pcie_gen"))
        s.add(PCIE_LINK_WIDTH, f.num(text(f"{_LINK}/link_widths/current_link_width"), f"{where}/{_LINK}/link_widths"))
        s.add(VOLTAGE, val("voltage/graphics_volt", "v", "mV"), sensor="graphics")
        _throttle(f, gpu, where, s)
        _ecc(f, gpu, where, s)
        read_health(f, gpu, where, s)
        drop_placeholders(s, vgpu=text("gpu_virtualization_mode/virtualization_mode").upper() == "VGPU")
        snap.gpus.append(s)
        snap.gpus += read_mig(f, gpu, where, s.gpu)
    if not snap.gpus and root.find("gpu") is None and root.find("attached_gpus") is None:
        raise TelemetryFormatError("not nvidia-smi XML: no <gpu> and no <attached_gpus>", subject=subject)
    snap.problems = f.problems
    return snap


def _pstate(f: Fields, state: str, path: str) -> float | None:
    """``P0``..``P15`` -> 0..15; None for "N/A" and "Unknown", a problem for anything else."""
    m = _PSTATE.match(state)
    if m is not None:
        return float(m.group(1))
    if not missing(state):
        f.problem(path, f"expected a P-state (P0..P15), got {state!r}")
    return None


def _throttle(f: Fields, gpu: ET.Element, where: str, s: GpuSample) -> None:
    for section, prefix in (
        ("clocks_event_reasons", "clocks_event_reason_"),
        ("clocks_throttle_reasons", "clocks_throttle_reason_"),
    ):
        el = gpu.find(section)
        if el is None:
            continue
        active: dict[str, bool] = {}
        for child in el:
            reason = REASONS.get(child.tag.removeprefix(prefix), "unknown")
            state = (child.text or "").strip().lower()
            if reason is None or state in ("n/a", ""):
                continue
            if state not in ("active", "not active"):
                f.problem(f"{where}/{section}/{child.tag}", f"expected Active or Not Active, got {child.text!r}")
                continue
            if reason == "unknown":
                reason = "other"
            active[reason] = active.get(reason, False) or state == "active"
        if active:
            for reason in THROTTLE_REASONS:
                if reason != "current":  # NVIDIA reports no current-limit reason
                    s.add(THROTTLE, float(active.get(reason, False)), reason=reason)
        return


def _ecc(f: Fields, gpu: ET.Element, where: str, s: GpuSample) -> None:
    """Aggregate ECC counts: ``sram_/dram_(un)correctable`` (v11+) or ``single_bit|double_bit/total`` (older)."""
    agg = gpu.find("ecc_errors/aggregate")
    if agg is None:
        return
    totals: dict[str, float] = {}
    for child in agg:
        if child.tag in ("single_bit", "double_bit"):
            el, kind = child.find("total"), "corrected" if child.tag == "single_bit" else "uncorrected"
        elif "_uncorrectable" in child.tag:
            el, kind = child, "uncorrected"
        elif child.tag.endswith("_correctable"):
            el, kind = child, "corrected"
        else:
            continue
        if el is None:
            continue
        v = f.num((el.text or "").strip(), f"{where}/ecc_errors/aggregate/{child.tag}")
        if v is not None:
            totals[kind] = totals.get(kind, 0.0) + v
    for kind, total in totals.items():
        s.add(ERRORS, total, error_type=kind)
