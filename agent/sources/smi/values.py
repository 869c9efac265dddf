"""Numbers and units as the SMI tools print them, to base units.

The tools disagree on spelling: ``"55.0"``, ``"(300Mhz)"``, ``"67.03 W"``, ``{"value": 34, "unit": "W"}``,
``"N/A"``. ``number`` reads the leading number of such a value (``None`` for the tools' spellings of
"no value", ``missing``: ``"N/A"`` and friends, and ``"N/A (Secondary die)"``, rocm-smi 6.0's "N/A" with
a reason in brackets), ``scale`` converts a value in a named unit to the base unit of its dimension, and
``Fields`` walks a nested document collecting a ``FieldProblem`` for every value of the wrong shape.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from aaco.contract.errors import AacoError
from aaco.contract.telemetry import FieldProblem

_NUMBER = re.compile(r"^\s*\(?\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]*)")
MISSING: Final = frozenset({"", "n/a", "na", "none", "null", "not supported", "unknown", "[not supported]", "-"})
_MISSING_WITH_REASON = re.compile(r"^n/a\s*\(.*\)$")  # "N/A (Secondary die)"
# PCIe transfer rate per lane (GT/s) -> generation
PCIE_GENERATIONS: Final[dict[float, int]] = {2.5: 1, 5.0: 2, 8.0: 3, 16.0: 4, 32.0: 5, 64.0: 6, 128.0: 7}

# unit (lower case) -> (dimension, factor to the base unit of that dimension)
_UNITS: Final[dict[str, tuple[str, float]]] = {
    "%": ("ratio", 0.01),
    "hz": ("hz", 1.0),
    "khz": ("hz", 1e3),
    "mhz": ("hz", 1e6),
    "ghz": ("hz", 1e9),
    "w": ("w", 1.0),
    "mw": ("w", 1e-3),
    "uw": ("w", 1e-6),
    "j": ("j", 1.0),
    "mj": ("j", 1e-3),
    "uj": ("j", 1e-6),
    "c": ("cel", 1.0),
    "v": ("v", 1.0),
    "mv": ("v", 1e-3),
    "gt/s": ("gt/s", 1.0),
    "mt/s": ("gt/s", 1e-3),
    # Memory: the SMI tools print binary multiples (amd-smi's "MB" is bytes // 2**20, like
    # nvidia-smi's "MiB"), so both spellings are read as powers of two.
    "b": ("by", 1.0),
    "kb": ("by", 1024.0),
    "kib": ("by", 1024.0),
    "mb": ("by", float(1 << 20)),
    "mib": ("by", float(1 << 20)),
    "gb": ("by", float(1 << 30)),
    "gib": ("by", float(1 << 30)),
}


class TelemetryFormatError(AacoError):
    """A capture or tool output that cannot be read at all (not the format it claims to be)."""


def missing(value: Any) -> bool:
    """True for the tools' spellings of "no value": None, ``"N/A"``, ``"N/A (Secondary die)"`` and friends."""
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    v = value.strip().lower()
    return v in MISSING or _MISSING_WITH_REASON.match(v) is not None


def pcie_generation(gt_per_s: float) -> int | None:
    """The PCIe generation that runs at ``gt_per_s`` GT/s per lane (16.0 -> 4); None for a rate of none."""
    return PCIE_GENERATIONS.get(round(gt_per_s, 1))


def number(value: Any) -> float | None:
    """The leading number of ``value`` (``"(300Mhz)"`` -> 300.0); None for "N/A" and friends.

    Raises ``ValueError`` for text that is neither a number nor a spelling of "no value".
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a number, got {type(value).__name__}")
    if missing(value):
        return None
    m = _NUMBER.match(value)
    if m is None:
        raise ValueError(f"not a number: {value!r}")
    return float(m.group(1))


def unit_of(value: str) -> str:
    """The unit written after a number (``"67.03 W"`` -> ``"W"``, ``"(300Mhz)"`` -> ``"Mhz"``)."""
    m = _NUMBER.match(value)
    return m.group(2) if m else ""


def scale(value: float, unit: str, dimension: str) -> float:
    """``value`` in ``unit`` converted to the base unit of ``dimension`` (hz, w, j, cel, by, ratio, v, gt/s).

    Raises ``ValueError`` for a unit of another dimension or one not known.
    """
    known = _UNITS.get(unit.strip().lower())
    if known is None or known[0] != dimension:
        raise ValueError(f"unexpected unit {unit!r} (expected one of {_units_of(dimension)})")
    factor = known[1]
    # dividing by 100, 1000, ... rounds once where multiplying by 0.01 may not (35 % -> 0.35, not 0.35000000000000003)
    return value * factor if factor >= 1 else value / round(1 / factor)


def _units_of(dimension: str) -> str:
    return ", ".join(u for u, (d, _) in _UNITS.items() if d == dimension)


class Fields:
    """Reads values out of one document, keeping a problem for each one it cannot use (bounded)."""

    def __init__(self, subject: str, limit: int = 200) -> None:
        self.subject = subject
        self.problems: list[FieldProblem] = []
        self._limit = limit

    def problem(self, path: str, message: str) -> None:
        """Record a problem with the field at ``path`` (kept up to the limit)."""
        if len(self.problems) < self._limit:
            self.problems.append(FieldProblem(self.subject, path, message))

    def num(self, value: Any, path: str) -> float | None:
        """``number(value)``, or None with a problem recorded."""
        try:
            return number(value)
        except ValueError as exc:
            self.problem(path, str(exc))
            return None

    def with_unit(self, value: Any, path: str, dimension: str, default_unit: str = "") -> float | None:
        """A value with its unit, in base units.

        Accepts ``{"value", "unit"}``, ``"67.03 W"``, or a bare number in ``default_unit``.
        """
        if isinstance(value, Mapping):
            if "value" not in value:
                self.problem(path, f"expected {{value, unit}}, got keys {sorted(value)[:5]}")
                return None
            raw, unit = value.get("value"), str(value.get("unit") or default_unit)
        else:
            raw, unit = value, default_unit
            if isinstance(value, str) and not missing(value):
                unit = unit_of(value) or default_unit
        v = self.num(raw, path + (".value" if isinstance(value, Mapping) else ""))
        if v is None:
            return None
        try:
            return scale(v, unit, dimension)
        except ValueError as exc:
            self.problem(path, str(exc))
            return None

    def section(self, doc: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any]:
        """``doc[key]`` when it is a mapping; empty when absent or "N/A"; a problem when of another shape."""
        value = doc.get(key)
        if isinstance(value, Mapping):
            return value
        if missing(value):
            return {}
        self.problem(f"{path}.{key}" if path else key, f"expected a section, got {type(value).__name__}")
        return {}
