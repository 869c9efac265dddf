"""AMD GPU model names: never a PCI id, else the marketing name libdrm's ``amdgpu.ids`` gives the device.

Tools print a PCI id where they have no name: rocm-smi 4.3 reads ``"Card series": "0x1002"`` (AMD's
vendor id), rocm-smi 5.x ``"Card model": "0xc1e"`` (the subsystem id), amdsmi pads an unknown market
name to the device id (``0x74a1``). ``model_name`` takes the first candidate that is a name (not
missing, not ``0x`` and hex digits), else the marketing name of the device id and revision in
``amdgpu.ids`` (libdrm's table, carried beside this module; provenance and licence in
``amdgpu_ids.md``), else the first fallback (rocm-smi's ``Card SKU``). Without a revision the
table names a device only when all its revisions share one name (0x6861: Radeon Pro WX 9100; not
0x73df, which is an RX 6700 XT, 6750 XT, 6800M, ... by revision).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from aaco.agent.sources.smi.values import missing

IDS_FILE: Final = Path(__file__).with_name("amdgpu.ids")
_PCI_ID = re.compile(r"^0x[0-9a-f]+$", re.IGNORECASE)


def is_pci_id(text: str) -> bool:
    """True for a PCI id as the tools print one (``0x1002``, ``0xc1e``)."""
    return _PCI_ID.match(text.strip()) is not None


@functools.lru_cache(maxsize=1)
def _table() -> dict[int, list[tuple[int, str]]]:
    """Device id -> [(revision, name)] in the file's order (libdrm takes the first match)."""
    out: dict[int, list[tuple[int, str]]] = {}
    for line in IDS_FILE.read_text(encoding="utf-8").splitlines():
        parts = [p.strip() for p in line.split(",", 2)]
        if line.startswith("#") or len(parts) != 3:
            continue  # comments, blank lines and the format version ("1.0.0")
        try:
            device, revision = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            continue
        out.setdefault(device, []).append((revision, parts[2]))
    return out


def _hex(value: object) -> int | None:
    """``"0x73df"``, ``"73DF"`` or 0x73DF as an integer; None when it is none of those."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and not missing(value):
        try:
            return int(value.strip(), 16)
        except ValueError:
            return None
    return None


def marketing_name(device_id: object, revision: object = None) -> str:
    """The name ``amdgpu.ids`` gives a device id (and revision); "" when it gives none."""
    device = _hex(device_id)
    entries = _table().get(device, []) if device is not None else []
    rev = _hex(revision)
    exact = next((name for r, name in entries if r == rev), None)
    if exact is not None:
        return exact
    names = {name for _, name in entries}
    return names.pop() if len(names) == 1 else ""


def model_name(
    candidates: Iterable[object], device_id: object = None, revision: object = None, fallbacks: Iterable[object] = ()
) -> str:
    """The first candidate that is a name, else the device's marketing name, else the first fallback that is a name."""
    return _first_name(candidates) or marketing_name(device_id, revision) or _first_name(fallbacks)


def _first_name(texts: Iterable[object]) -> str:
    return next((t.strip() for t in texts if isinstance(t, str) and not missing(t) and not is_pci_id(t)), "")
