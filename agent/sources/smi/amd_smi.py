"""``amd-smi metric --json``: the list form and the newer ``{"gpu_data": [...]}`` wrapper.

Values are ``{"value": V, "unit": U}``, bare numbers (ECC counts), or ``"N/A"``. Clocks come per
instance (``gfx_0``..``gfx_7``, ``mem_0``, ``vclk_0``, ...): the first instance that has a value
stands for its domain (on MI300 the XCD graphics clocks move together). amd-smi's ``hotspot`` is
the junction sensor. Throttling: ``power.throttle_status`` (THROTTLED / UNTHROTTLED) says whether
the GPU is throttled; the ``throttle`` section's ``*_violation_status`` fields, where the GPU has
them, say why. Throttled without a stated reason reads as reason ``other``. ``fan`` gives fan
``0``'s speed (``usage`` %, else ``speed`` of ``max``) and ``rpm``; ``power``'s ``gfx_voltage`` /
``soc_voltage`` / ``mem_voltage`` the voltages; ``pcie``'s ``width`` and ``speed`` (GT/s) the link.
``usage`` also gives the activity readings (``amd_activity``: graphics, DRAM, and the busiest of
``mm_activity`` and the VCN engines); the ``amd-smi`` backend pauses them as ``counters_guard`` says.

Health (docs/health.md): ``ecc``'s ``total_correctable_count`` / ``total_uncorrectable_count`` are
``hw.errors``; ``ecc_blocks`` (amd-smi 24.5, ROCm 6.1, and later: ``{"UMC": {"correctable_count",
"uncorrectable_count", "deferred_count"}, ...}``, the RAS blocks the driver enabled among UMC, SDMA,
GFX, MMHUB, PCIE_BIF, HDP, XGMI_WAFL) or ``ecc_block`` (earlier releases: ``correctable`` /
``uncorrectable``) the ECC counts per block, ``block`` in lower case as amdgpu's sysfs names it
(``umc``, ``xgmi_wafl``); ``pcie.replay_count`` (releases before September 2023: a top-level
``replay_count``), the GPU's PCIe replay counter, the PCIe replays. amd-smi ``metric`` has no bad
pages (they are ``amd-smi bad-pages``): no retired pages from this backend.

``amd-smi list --json`` (``gpu``, ``bdf``, ``uuid``) and ``amd-smi static --asic --json``
(``market_name``, else the marketing name of ``device_id`` and ``rev_id``: ``amdgpu_ids``) give
identities; ``parse_identities`` reads them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from aaco.agent.sources.smi.amd_activity import tool_activity
from aaco.agent.sources.smi.amdgpu_ids import model_name
from aaco.agent.sources.smi.placeholders import drop_placeholders
from aaco.agent.sources.smi.values import Fields, TelemetryFormatError, missing, pcie_generation
from aaco.contract.telemetry import (
    CLOCK,
    CLOCK_MAX,
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

FORMAT: Final = "amd-smi"

_CLOCK_KEY = re.compile(r"^([a-z]+?)(?:clk)?(?:_(\d+))?$")
_CLOCK_DOMAIN: Final[dict[str, str]] = {
    "gfx": "graphics",
    "sys": "graphics",
    "mem": "memory",
    "vclk": "video",
    "v": "video",
    "dclk": "decode",
    "d": "decode",
    "soc": "soc",
    "f": "fabric",
    "df": "fabric",
    "dcef": "dcef",
}
_SENSORS: Final[dict[str, str]] = {
    "edge": "edge",
    "hotspot": "junction",
    "junction": "junction",
    "mem": "memory",
    "vram": "memory",
    "memory": "memory",
}
# throttle section: <prefix>_violation_status -> reason
_VIOLATIONS: Final[dict[str, str]] = {
    "ppt": "power",
    "gfx_clk_below_host_limit_power": "power",
    "prochot": "thermal",
    "socket_thermal": "thermal",
    "vr_thermal": "thermal",
    "hbm_thermal": "thermal",
    "gfx_clk_below_host_limit_thermal": "thermal",
}
_VOLTAGES: Final = (("gfx_voltage", "graphics"), ("soc_voltage", "soc"), ("mem_voltage", "memory"))
# per-block ECC section (newer spelling first) and its keys per metric (newer spelling first)
_ECC_BLOCK_SECTIONS: Final = ("ecc_blocks", "ecc_block")
_ECC_BLOCK_KEYS: Final = (
    (ECC_CORRECTED, ("correctable_count", "correctable")),
    (ECC_UNCORRECTED, ("uncorrectable_count", "uncorrectable")),
)
_ACTIVE: Final = frozenset({"active", "throttled", "true", "yes", "1", "enabled"})
_INACTIVE: Final = frozenset({"not active", "inactive", "unthrottled", "false", "no", "0", "disabled"})


def gpu_list(doc: Any, subject: str) -> list[Any]:
    """The per-GPU entries of an amd-smi JSON document (list form or ``gpu_data`` wrapper)."""
    if isinstance(doc, Mapping) and isinstance(doc.get("gpu_data"), list):
        return doc["gpu_data"]
    if isinstance(doc, list):
        return doc
    raise TelemetryFormatError(
        'not amd-smi JSON: expected a list of GPUs or {"gpu_data": [...]} at the top level', subject=subject
    )


def _flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _ACTIVE:
            return True
        if v in _INACTIVE:
            return False
    return None


def parse_identities(list_doc: Any, static_doc: Any, subject: str) -> dict[str, GpuIdentity]:
    """GPU index -> identity from ``amd-smi list --json`` and (optional) ``amd-smi static --asic --json``."""
    names: dict[str, str] = {}
    if static_doc is not None:
        for e in gpu_list(static_doc, subject):
            if isinstance(e, Mapping) and isinstance(asic := e.get("asic"), Mapping):
                names[str(e.get("gpu"))] = model_name(
                    [asic.get("market_name")], asic.get("device_id"), asic.get("rev_id")
                )
    out = {}
    for e in gpu_list(list_doc, subject):
        if not isinstance(e, Mapping) or "gpu" not in e:
            continue
        idx = str(e["gpu"])
        out[idx] = GpuIdentity(
            idx,
            uuid=str(e.get("uuid") or ""),
            pci_bus=normalize_pci(str(e.get("bdf") or "")),
            model=names.get(idx, ""),
            vendor="amd",
        )
    return out


def parse_amd_smi(doc: Any, subject: str, identities: Mapping[str, GpuIdentity] | None = None) -> Snapshot:
    """Readings of every GPU in an ``amd-smi metric --json`` document."""
    f = Fields(subject)
    snap = Snapshot(FORMAT)
    for i, entry in enumerate(gpu_list(doc, subject)):
        where = f"[{i}]"
        if not isinstance(entry, Mapping):
            f.problem(where, f"expected a GPU object, got {type(entry).__name__}")
            continue
        idx = entry.get("gpu")
        if not isinstance(idx, int) or isinstance(idx, bool):
            f.problem(f"{where}.gpu", f"expected the GPU index, got {idx!r}")
            continue
        where = f"gpu[{idx}]"
        ident = (identities or {}).get(str(idx)) or GpuIdentity(
            str(idx),
            uuid=str(entry.get("uuid") or ""),
            pci_bus=normalize_pci(str(entry.get("bdf") or "")),
            vendor="amd",
        )
        s = GpuSample(ident)
        _usage(f, entry, where, s)
        _power(f, entry, where, s)
        _clocks(f, entry, where, s)
        _temperatures(f, entry, where, s)
        _memory(f, entry, where, s)
        _energy_and_ecc(f, entry, where, s)
        _fan_and_pcie(f, entry, where, s)
        drop_placeholders(s)
        snap.gpus.append(s)
    snap.problems = f.problems
    return snap


def _usage(f: Fields, e: Mapping[str, Any], where: str, s: GpuSample) -> None:
    usage = f.section(e, "usage", where)
    s.add(UTILIZATION, f.with_unit(usage.get("gfx_activity"), f"{where}.usage.gfx_activity", "ratio", "%"))
    s.add(MEMORY_UTILIZATION, f.with_unit(usage.get("umc_activity"), f"{where}.usage.umc_activity", "ratio", "%"))
    tool_activity(f, usage, where, s)


def _power(f: Fields, e: Mapping[str, Any], where: str, s: GpuSample) -> None:
    power = f.section(e, "power", where)
    for key in ("socket_power", "current_socket_power", "average_socket_power"):
        watts = f.with_unit(power.get(key), f"{where}.power.{key}", "w", "W")
        if watts is not None:
            s.add(POWER, watts)
            break
    for key, sensor in _VOLTAGES:
        s.add(VOLTAGE, f.with_unit(power.get(key), f"{where}.power.{key}", "v", "mV"), sensor=sensor)
    reasons: dict[str, bool] = {}
    throttle = f.section(e, "throttle", where)
    for prefix, reason in _VIOLATIONS.items():
        raw = throttle.get(f"{prefix}_violation_status")
        if missing(raw):
            continue
        active = _flag(raw)
        if active is None:
            f.problem(f"{where}.throttle.{prefix}_violation_status", f"not a status: {raw!r}")
            continue
        reasons[reason] = reasons.get(reason, False) or active
    status = power.get("throttle_status")
    throttled = None if missing(status) else _flag(status)
    if not missing(status) and throttled is None:
        f.problem(f"{where}.power.throttle_status", f"not a throttle status: {status!r}")
    if throttled is False:
        reasons = dict.fromkeys(THROTTLE_REASONS, False)
    elif throttled is True:
        reasons["other"] = not any(reasons.values())
    for reason in THROTTLE_REASONS:
        if reason in reasons:
            s.add(THROTTLE, float(reasons[reason]), reason=reason)


def _clocks(f: Fields, e: Mapping[str, Any], where: str, s: GpuSample) -> None:
    clocks = f.section(e, "clock", where)
    for key in sorted(clocks, key=_instance_order):
        m = _CLOCK_KEY.match(key)
        domain = _CLOCK_DOMAIN.get(m.group(1)) if m else None
        if domain is None or s.has(CLOCK, clock=domain):
            continue
        c = clocks[key]
        if not isinstance(c, Mapping):
            if not missing(c):
                f.problem(f"{where}.clock.{key}", f"expected a section, got {type(c).__name__}")
            continue
        s.add(CLOCK, f.with_unit(c.get("clk"), f"{where}.clock.{key}.clk", "hz", "MHz"), clock=domain)
        if s.has(CLOCK, clock=domain):
            s.add(CLOCK_MAX, f.with_unit(c.get("max_clk"), f"{where}.clock.{key}.max_clk", "hz", "MHz"), clock=domain)


def _instance_order(key: str) -> tuple[int, str]:
    m = _CLOCK_KEY.match(key)
    return (int(m.group(2)) if m and m.group(2) else 0, key)


def _temperatures(f: Fields, e: Mapping[str, Any], where: str, s: GpuSample) -> None:
    temps = f.section(e, "temperature", where)
    for key, value in temps.items():
        sensor = _SENSORS.get(key.lower())
        if sensor is None or s.has(TEMPERATURE, sensor=sensor):
            continue
        s.add(TEMPERATURE, f.with_unit(value, f"{where}.temperature.{key}", "cel", "C"), sensor=sensor)


def _memory(f: Fields, e: Mapping[str, Any], where: str, s: GpuSample) -> None:
    mem = f.section(e, "mem_usage", where)
    s.add(MEMORY_USAGE, f.with_unit(mem.get("used_vram"), f"{where}.mem_usage.used_vram", "by", "MB"))
    s.add(MEMORY_LIMIT, f.with_unit(mem.get("total_vram"), f"{where}.mem_usage.total_vram", "by", "MB"))


def _energy_and_ecc(f: Fields, e: Mapping[str, Any], where: str, s: GpuSample) -> None:
    energy = f.section(e, "energy", where)
    s.add(
        ENERGY,
        f.with_unit(energy.get("total_energy_consumption"), f"{where}.energy.total_energy_consumption", "j", "J"),
    )
    ecc = f.section(e, "ecc", where)
    s.add(
        ERRORS,
        f.num(ecc.get("total_correctable_count"), f"{where}.ecc.total_correctable_count"),
        error_type="corrected",
    )
    s.add(
        ERRORS,
        f.num(ecc.get("total_uncorrectable_count"), f"{where}.ecc.total_uncorrectable_count"),
        error_type="uncorrected",
    )
    _ecc_blocks(f, e, where, s)


def _ecc_blocks(f: Fields, e: Mapping[str, Any], where: str, s: GpuSample) -> None:
    """ECC counts per RAS block (``ecc_blocks``, or ROCm 6.0's ``ecc_block``)."""
    section = next((k for k in _ECC_BLOCK_SECTIONS if k in e), None)
    if section is None:
        return
    for name, counts in f.section(e, section, where).items():
        path = f"{where}.{section}.{name}"
        if not isinstance(counts, Mapping):
            if not missing(counts):
                f.problem(path, f"expected a section, got {type(counts).__name__}")
            continue
        for metric, keys in _ECC_BLOCK_KEYS:
            key = next((k for k in keys if k in counts), None)
            if key is not None:
                s.add(metric, f.num(counts[key], f"{path}.{key}"), block=str(name).strip().lower())


def _fan_and_pcie(f: Fields, e: Mapping[str, Any], where: str, s: GpuSample) -> None:
    fan = f.section(e, "fan", where)
    ratio = f.with_unit(fan.get("usage"), f"{where}.fan.usage", "ratio", "%")
    if ratio is None:
        speed, top = f.num(fan.get("speed"), f"{where}.fan.speed"), f.num(fan.get("max"), f"{where}.fan.max")
        ratio = speed / top if speed is not None and top else None
    s.add(FAN_SPEED_RATIO, ratio, fan="0")
    s.add(FAN_SPEED, f.num(fan.get("rpm"), f"{where}.fan.rpm"), fan="0")
    pcie = f.section(e, "pcie", where)
    s.add(PCIE_LINK_WIDTH, f.num(pcie.get("width"), f"{where}.pcie.width"))
    rate = f.with_unit(pcie.get("speed"), f"{where}.pcie.speed", "gt/s", "GT/s")
    s.add(PCIE_LINK_GENERATION, None if rate is None else pcie_generation(rate))
    if "replay_count" in pcie or "replay_count" not in e:
        s.add(PCIE_REPLAYS, f.num(pcie.get("replay_count"), f"{where}.pcie.replay_count"))
    else:  # amd-smi before September 2023
        s.add(PCIE_REPLAYS, f.num(e.get("replay_count"), f"{where}.replay_count"))
