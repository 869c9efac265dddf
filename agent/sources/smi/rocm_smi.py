"""``rocm-smi --json``: one object per ``cardN``, string values, units inside the key names.

Run as ``rocm-smi --showtemp --showpower --showclocks --showuse --showmemuse --showmeminfo vram
--showproductname --showbus --showuniqueid --showmaxpower --json`` (``Max Graphics Package Power``
is the power cap). Key spellings vary between ROCm versions
(``Average Graphics Package Power (W)`` up to 6.0, ``Current Socket Graphics Package Power (W)``
on 6.1+; ``Card series`` / ``Card Series``), so keys are matched case-insensitively by pattern.
The DPM level lists leak into the JSON as stray numeric keys (``"0": "16.0GT/s x16 *"``): they are
ignored, as are the non-card sections (``system``). ``sclk`` is the graphics clock, ``mclk`` memory,
``fclk`` the data fabric; the junction sensor is the hotspot.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from aaco.agent.sources.smi.values import Fields, TelemetryFormatError, number
from aaco.contract.telemetry import (
    CLOCK,
    ENERGY,
    MEMORY_LIMIT,
    MEMORY_USAGE,
    MEMORY_UTILIZATION,
    POWER,
    POWER_LIMIT,
    TEMPERATURE,
    UTILIZATION,
    GpuIdentity,
    GpuSample,
    Snapshot,
    normalize_pci,
)

FORMAT: Final = "rocm-smi"

_CARD = re.compile(r"^card(\d+)$")
_TEMP = re.compile(r"^temperature \(sensor ([^)]+)\) \((c)\)$")
_CLOCK = re.compile(r"^(\w+?)(?:clk)? clock speed:?$")
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
_MODEL_KEYS: Final = ("card series", "card model", "device name")


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

        model = next((str(card[k]) for k in _MODEL_KEYS if card.get(k) not in (None, "N/A")), "")
        s = GpuSample(
            GpuIdentity(
                _CARD.match(name).group(1),
                uuid=str(card.get("unique id") or "") if card.get("unique id") != "N/A" else "",
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
        # metric, key spellings, factor to the base unit (the unit is in the key name)
        for metric, keys, factor in (
            (POWER, _POWER_KEYS, 1.0),
            (POWER_LIMIT, _POWER_LIMIT_KEYS, 1.0),
            (UTILIZATION, _UTIL_KEYS, 0.01),
            (MEMORY_UTILIZATION, _MEM_UTIL_KEYS, 0.01),
            (MEMORY_USAGE, _VRAM_USED_KEYS, 1.0),
            (MEMORY_LIMIT, _VRAM_TOTAL_KEYS, 1.0),
            (ENERGY, _ENERGY_KEYS, 1e-6),
        ):
            hit = _first(card, keys)
            if hit is not None:
                v = f.num(hit[1], path(hit[0]))
                s.add(metric, None if v is None else v * factor)
        snap.gpus.append(s)
    snap.problems = f.problems
    return snap
