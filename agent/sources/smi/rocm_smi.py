"""``rocm-smi --json``: one object per ``cardN``, string values, units inside the key names.

Run as ``rocm-smi --showtemp --showpower --showclocks --showuse --showmemuse --showmeminfo vram
--showproductname --showbus --showuniqueid --showid --showfan --showvoltage --showmaxpower
--showreplaycount --json`` (``Max Graphics Package Power`` is the power cap; ``PCIe Replay Count``,
the GPU's PCIe replays since the driver loaded, is ``aaco.gpu.pcie.replays``: docs/health.md).
rocm-smi's RAS counts (``--showrasinfo``) print as a table, not as keys, and its bad pages need
``--showretiredpages``: neither is read (the sysfs and amdsmi library backends read both). Key
spellings vary between ROCm versions (``Average Graphics Package Power (W)`` up to 6.0, ``Current
Socket Graphics Package Power (W)`` on 6.1+; ``Card series`` / ``Card Series``), so keys are matched
case-insensitively by pattern.
The DPM level lists leak into the JSON as stray numeric keys (``"0": "16.0GT/s x16 *"``): they are
ignored, as are the non-card sections (``system``). ``sclk`` is the graphics clock, ``mclk`` memory,
``fclk`` the data fabric; the junction sensor is the hotspot. ``"N/A (Secondary die)"`` (6.0) is "N/A".

Also read: ``Fan speed (%)`` (else ``Fan speed (level)`` of 255) and ``Fan RPM`` as fan ``0``;
``Voltage (mV)``, the graphics voltage; each ``<x>clk clock level:``, the clock domain's current DPM
level; ``pcie clock level`` (``"1 (16.0GT/s x16)"``, the current PCIe DPM level) as the link's
generation and width. Zeros that cannot be readings are left out (``placeholders``).

The model is ``Card series`` (``Device Name``, ``Card model``) unless that is a PCI id (rocm-smi 4.3
prints ``"Card series": "0x1002"``), else the marketing name of ``GPU ID`` / ``Device ID`` (and
``Device Rev``), else ``Card SKU`` (``amdgpu_ids``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from aaco.agent.sources.smi.amdgpu_ids import model_name
from aaco.agent.sources.smi.placeholders import drop_placeholders
from aaco.agent.sources.smi.values import Fields, TelemetryFormatError, missing, number, pcie_generation
from aaco.contract.telemetry import (
    CLOCK,
    DPM_LEVEL,
    ENERGY,
    FAN_SPEED,
    FAN_SPEED_RATIO,
    MEMORY_LIMIT,
    MEMORY_USAGE,
    MEMORY_UTILIZATION,
    PCIE_LINK_GENERATION,
    PCIE_LINK_WIDTH,
    PCIE_REPLAYS,
    POWER,
    POWER_LIMIT,
    TEMPERATURE,
    UTILIZATION,
    VOLTAGE,
    GpuIdentity,
    GpuSample,
    Snapshot,
    normalize_pci,
)

FORMAT: Final = "rocm-smi"

_CARD = re.compile(r"^card(\d+)$")
_TEMP = re.compile(r"^temperature \(sensor ([^)]+)\) \((c)\)$")
_CLOCK = re.compile(r"^(\w+?)(?:clk)? clock speed:?$")
_LEVEL = re.compile(r"^(\w+?)(?:clk)? clock level:$")
_PCIE = re.compile(r"^\s*\d+\s*\(\s*(\d+(?:\.\d+)?)\s*GT/s,?\s*x(\d+)\s*\)\s*\*?\s*$", re.IGNORECASE)
_SENSORS: Final[dict[str, str]] = {
    "edge": "edge",
    "#1": "edge",  # ROCm < 3.9 numbered its sensors: edge, junction, memory
    "junction": "junction",
    "hotspot": "junction",
    "#2": "junction",
    "memory": "memory",
    "mem": "memory",
    "#3": "memory",
}
_CLOCKS: Final[dict[str, str]] = {
    "s": "graphics",
    "m": "memory",
    "f": "fabric",
    "soc": "soc",
    "dcef": "dcef",
    "v": "video",
    "d": "decode",
}
# metric -> key spellings in order of preference (lower case)
_POWER_KEYS: Final = (
    "current socket graphics package power (w)",
    "average graphics package power (w)",
    "socket graphics package power (w)",
)
_POWER_LIMIT_KEYS: Final = ("max graphics package power (w)",)  # the cap (rocm-smi --showmaxpower)
_UTIL_KEYS: Final = ("gpu use (%)",)
_MEM_UTIL_KEYS: Final = ("gpu memory use (%)", "gpu memory read/write activity (%)")
_VRAM_USED_KEYS: Final = ("vram total used memory (b)",)
_VRAM_TOTAL_KEYS: Final = ("vram total memory (b)",)
_ENERGY_KEYS: Final = ("accumulated energy (uj)",)
_MODEL_KEYS: Final = ("card series", "device name", "card model")
_FAN: Final = {"fan": "0"}
# metric, key spellings, divisor to the base unit (the unit is in the key name), series attribute; the
# first of a metric's rows found wins (a fan's % before its level of 255)
_KEYED: Final[tuple[tuple[str, tuple[str, ...], float, dict[str, str]], ...]] = (
    (POWER, _POWER_KEYS, 1, {}),
    (POWER_LIMIT, _POWER_LIMIT_KEYS, 1, {}),
    (UTILIZATION, _UTIL_KEYS, 100, {}),
    (MEMORY_UTILIZATION, _MEM_UTIL_KEYS, 100, {}),
    (MEMORY_USAGE, _VRAM_USED_KEYS, 1, {}),
    (MEMORY_LIMIT, _VRAM_TOTAL_KEYS, 1, {}),
    (ENERGY, _ENERGY_KEYS, 1_000_000, {}),
    (FAN_SPEED_RATIO, ("fan speed (%)",), 100, _FAN),
    (FAN_SPEED_RATIO, ("fan speed (level)",), 255, _FAN),
    (FAN_SPEED, ("fan rpm",), 1, _FAN),
    (VOLTAGE, ("voltage (mv)",), 1000, {"sensor": "graphics"}),
    (PCIE_REPLAYS, ("pcie replay count",), 1, {}),
)


def _first(card: Mapping[str, str], keys: tuple[str, ...]) -> tuple[str, Any] | None:
    for k in keys:
        if k in card:
            v = card[k]
            try:
                if number(v) is None:
                    continue
            except ValueError:
                pass  # reported by the caller, who knows the metric
            return k, v
    return None


def parse_rocm_smi(doc: Any, subject: str) -> Snapshot:
    """Readings of every ``cardN`` in a ``rocm-smi --json`` document."""
    if not isinstance(doc, Mapping) or not any(_CARD.match(str(k)) for k in doc):
        raise TelemetryFormatError(
            'not rocm-smi JSON: expected {"card0": {...}, ...} at the top level', subject=subject
        )
    f = Fields(subject)
    snap = Snapshot(FORMAT)
    for name in sorted((k for k in doc if _CARD.match(str(k))), key=lambda k: int(_CARD.match(k).group(1))):
        raw = doc[name]
        if not isinstance(raw, Mapping):
            f.problem(name, f"expected a card object, got {type(raw).__name__}")
            continue
        card = {str(k).strip().lower(): v for k, v in raw.items()}
        orig = {str(k).strip().lower(): str(k) for k in raw}

        def path(key: str, name: str = name, orig: dict[str, str] = orig) -> str:
            return f'{name}."{orig.get(key, key)}"'

        model = model_name(
            [card.get(k) for k in _MODEL_KEYS],
            card.get("device id") or card.get("gpu id"),
            card.get("device rev"),
            fallbacks=[card.get("card sku")],
        )
        s = GpuSample(
            GpuIdentity(
                _CARD.match(name).group(1),
                uuid="" if missing(card.get("unique id")) else str(card["unique id"]),
                pci_bus=normalize_pci(str(card.get("pci bus") or "")),
                model=model,
                vendor="amd",
            )
        )
        for key, value in card.items():
            m = _TEMP.match(key)
            if m and (sensor := _SENSORS.get(m.group(1).strip())) and not s.has(TEMPERATURE, sensor=sensor):
                s.add(TEMPERATURE, f.num(value, path(key)), sensor=sensor)
                continue
            m = _CLOCK.match(key)
            if m and (clock := _CLOCKS.get(m.group(1))) and not s.has(CLOCK, clock=clock):
                s.add(CLOCK, f.with_unit(value, path(key), "hz", "MHz"), clock=clock)
                continue
            m = _LEVEL.match(key)
            if m and (clock := _CLOCKS.get(m.group(1))) and not s.has(DPM_LEVEL, clock=clock):
                s.add(DPM_LEVEL, f.num(value, path(key)), clock=clock)
        for metric, keys, divisor, attrs in _KEYED:
            hit = _first(card, keys)
            if hit is not None and not s.has(metric, **attrs):
                v = f.num(hit[1], path(hit[0]))
                s.add(metric, None if v is None else v / divisor, **attrs)
        _pcie(f, card.get("pcie clock level"), path("pcie clock level"), s)
        drop_placeholders(s)
        snap.gpus.append(s)
    snap.problems = f.problems
    return snap


def _pcie(f: Fields, level: Any, path: str, s: GpuSample) -> None:
    """The PCIe link's generation and width from its current DPM level (``"1 (16.0GT/s x16)"``)."""
    if missing(level):
        return
    m = _PCIE.match(str(level))
    if m is None:
        f.problem(path, f"expected 'level (rate GT/s xlanes)', got {level!r}")
        return
    s.add(PCIE_LINK_GENERATION, pcie_generation(float(m.group(1))))
    s.add(PCIE_LINK_WIDTH, float(m.group(2)))
