"""The health sections of ``nvidia-smi -q -x`` (docs/health.md): volatile ECC, retired pages, remapped rows, replays.

- ``ecc_errors/volatile``: counts since the driver loaded. Schema 11 and later by location,
  ``sram_correctable``, ``sram_uncorrectable`` (or, in later ones, ``_parity`` and ``_secded``,
  summed), ``dram_*``; older schemas ``single_bit`` / ``double_bit`` per unit, where
  ``device_memory`` is the DRAM and the register file and caches are SRAM (``total`` is their sum).
- ``retired_pages``: pages retired for single-bit and double-bit errors (``retired_count``), and
  ``pending_retirement`` Yes/No: NVIDIA says whether pages wait for a reset, not how many (1 or 0).
- ``remapped_rows`` (Ampere and later): rows remapped for correctable and uncorrectable errors,
  ``remapped_row_pending`` and ``remapped_row_failure`` Yes/No.
- ``pci/replay_counter``: PCIe replays.

Every one reads ``N/A`` where the GPU has no such counter (ECC off, no row remapper): left out.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Final

from aaco.agent.sources.smi.values import Fields, missing
from aaco.contract.telemetry import (
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    PCIE_REPLAYS,
    REMAPPED_ROWS,
    RETIRED_PAGES,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    GpuSample,
)

# older schemas' units -> memory location
_UNITS: Final = {
    "device_memory": "dram",
    "register_file": "sram",
    "l1_cache": "sram",
    "l2_cache": "sram",
    "texture_memory": "sram",
    "texture_shm": "sram",
    "cbu": "sram",
}
_RETIRED: Final = (
    ("multiple_single_bit_retirement", "single_bit"),
    ("single_bit_retirement", "single_bit"),
    ("double_bit_retirement", "double_bit"),
)


def read_health(f: Fields, gpu: ET.Element, where: str, s: GpuSample) -> None:
    """Add the GPU's health readings to ``s`` (problems for values of the wrong shape)."""
    _volatile(f, gpu, where, s)
    retired = gpu.find("retired_pages")
    if retired is not None:
        for tag, cause in _RETIRED:
            count = retired.find(f"{tag}/retired_count")
            if count is not None:
                s.add(RETIRED_PAGES, f.num(_text(count), f"{where}/retired_pages/{tag}/retired_count"), cause=cause)
        s.add(RETIRED_PAGES_PENDING, _flag(f, retired.find("pending_retirement"), f"{where}/retired_pages"))
    rows = gpu.find("remapped_rows")
    if rows is not None and len(rows):
        path = f"{where}/remapped_rows"
        for tag, cause in (("remapped_row_corr", "correctable"), ("remapped_row_unc", "uncorrectable")):
            s.add(REMAPPED_ROWS, f.num(_text(rows.find(tag)), f"{path}/{tag}"), cause=cause)
        s.add(ROW_REMAP_PENDING, _flag(f, rows.find("remapped_row_pending"), path))
        s.add(ROW_REMAP_FAILURE, _flag(f, rows.find("remapped_row_failure"), path))
    replays = gpu.find("pci/replay_counter")
    if replays is not None:
        s.add(PCIE_REPLAYS, f.num(_text(replays), f"{where}/pci/replay_counter"))


def _volatile(f: Fields, gpu: ET.Element, where: str, s: GpuSample) -> None:
    vol = gpu.find("ecc_errors/volatile")
    if vol is None:
        return
    counts: dict[tuple[str, str], float] = {}

    def count(kind: str, block: str, el: ET.Element, path: str) -> None:
        v = f.num(_text(el), path)
        if v is not None:
            counts[(kind, block)] = counts.get((kind, block), 0.0) + v

    for child in vol:
        path = f"{where}/ecc_errors/volatile/{child.tag}"
        if child.tag in ("single_bit", "double_bit"):
            kind = "corrected" if child.tag == "single_bit" else "uncorrected"
            for unit in child:
                if unit.tag in _UNITS:
                    count(kind, _UNITS[unit.tag], unit, f"{path}/{unit.tag}")
            continue
        block, _, rest = child.tag.partition("_")
        if block not in ("sram", "dram") or not rest:
            continue
        if rest.startswith("uncorrectable"):
            count("uncorrected", block, child, path)
        elif rest == "correctable":
            count("corrected", block, child, path)
    for (kind, block), v in sorted(counts.items()):
        s.add(ECC_CORRECTED if kind == "corrected" else ECC_UNCORRECTED, v, block=block)


def _flag(f: Fields, el: ET.Element | None, path: str) -> float | None:
    """Yes -> 1, No -> 0, N/A -> None; anything else a problem."""
    if el is None:
        return None
    value = _text(el)
    if missing(value):
        return None
    if value.lower() in ("yes", "no"):
        return 1.0 if value.lower() == "yes" else 0.0
    f.problem(f"{path}/{el.tag}", f"expected Yes or No, got {value!r}")
    return None


def _text(el: ET.Element | None) -> str:
    return "" if el is None else (el.text or "").strip()
