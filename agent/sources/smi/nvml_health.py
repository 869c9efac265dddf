"""A GPU's health readings through NVML (docs/health.md), read every ``EVERY`` samples.

- volatile ECC counts by location: ``nvmlDeviceGetMemoryErrorCounter`` for the DRAM and, where the
  GPU counts it (Ampere and later), the SRAM;
- retired pages by cause (``nvmlDeviceGetRetiredPages``, the length of its list) and whether one is
  pending (``nvmlDeviceGetRetiredPagesPendingStatus``);
- remapped rows, pending and failure (``nvmlDeviceGetRemappedRows``);
- PCIe replays (``nvmlDeviceGetPcieReplayCounter``);
- NVLink errors by type summed over the active links (``nvmlDeviceGetNvLinkErrorCounter``; which
  links are active is read once per board).

Health counters move slowly and the verdict's rates span a minute, so a reader reads them on its
first sample and then every ``EVERY``-th (10: every 10 s at the default 1 s interval); the series
stay between reads. A query the GPU does not support leaves its reading out, as every NVML query.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from aaco.contract.telemetry import (
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    NVLINK_ERRORS,
    PCIE_REPLAYS,
    REMAPPED_ROWS,
    RETIRED_PAGES,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    GpuSample,
)

EVERY: Final = 10
# nvmlMemoryLocation_t: DRAM (NVML_MEMORY_LOCATION_DEVICE_MEMORY in older bindings) and SRAM
LOCATIONS: Final = (("NVML_MEMORY_LOCATION_DRAM", "NVML_MEMORY_LOCATION_DEVICE_MEMORY", 2, "dram"),)
SRAM: Final = ("NVML_MEMORY_LOCATION_SRAM", 7)
CAUSES: Final = (
    ("NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS", 0, "single_bit"),
    ("NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR", 1, "double_bit"),
)
NVLINK_COUNTERS: Final = (
    ("NVML_NVLINK_ERROR_DL_REPLAY", 0, "replay"),
    ("NVML_NVLINK_ERROR_DL_RECOVERY", 1, "recovery"),
    ("NVML_NVLINK_ERROR_DL_CRC_FLIT", 2, "crc_flit"),
    ("NVML_NVLINK_ERROR_DL_CRC_DATA", 3, "crc_data"),
)
MAX_LINKS: Final = 18  # NVML_NVLINK_MAX_LINKS

Query = Callable[..., Any]  # NvmlReader._q bound to the sample's problems and the GPU: (fn, *args) -> value | None
Once = Callable[..., Any]  # NvmlReader._once for the GPU: (fact, fn, *args) -> value | None


def read_health(n: Any, q: Query, once: Once, h: Any, s: GpuSample) -> None:
    """Add the GPU's health readings to ``s`` (``q`` and ``once`` as NvmlReader's, bound to this GPU)."""
    get = getattr(n, "nvmlDeviceGetMemoryErrorCounter", None)
    if get is not None:
        volatile = getattr(n, "NVML_VOLATILE_ECC", 0)
        dram = getattr(n, LOCATIONS[0][0], getattr(n, LOCATIONS[0][1], LOCATIONS[0][2]))
        for block, location in (("dram", dram), ("sram", getattr(n, SRAM[0], SRAM[1]))):
            for metric, kind in (
                (ECC_CORRECTED, n.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                (ECC_UNCORRECTED, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
            ):
                s.add(metric, q(get, h, kind, volatile, location), block=block)
    pages = getattr(n, "nvmlDeviceGetRetiredPages", None)
    if pages is not None:
        for const, default, cause in CAUSES:
            retired = q(pages, h, getattr(n, const, default))
            s.add(RETIRED_PAGES, None if retired is None else len(retired), cause=cause)
        pending = q(n.nvmlDeviceGetRetiredPagesPendingStatus, h)
        s.add(RETIRED_PAGES_PENDING, None if pending is None else float(bool(pending)))
    rows = q(getattr(n, "nvmlDeviceGetRemappedRows", _absent), h)
    if rows is not None:
        corr, unc, pending, failure = rows
        s.add(REMAPPED_ROWS, corr, cause="correctable")
        s.add(REMAPPED_ROWS, unc, cause="uncorrectable")
        s.add(ROW_REMAP_PENDING, float(bool(pending)))
        s.add(ROW_REMAP_FAILURE, float(bool(failure)))
    s.add(PCIE_REPLAYS, q(getattr(n, "nvmlDeviceGetPcieReplayCounter", _absent), h))
    _nvlink(n, q, once, h, s)


def _nvlink(n: Any, q: Query, once: Once, h: Any, s: GpuSample) -> None:
    state = getattr(n, "nvmlDeviceGetNvLinkState", None)
    counter = getattr(n, "nvmlDeviceGetNvLinkErrorCounter", None)
    if state is None or counter is None:
        return
    links = once("nvlinks", _active_links, n, q, h)
    if not links:
        return
    for const, default, kind in NVLINK_COUNTERS:
        counts = [q(counter, h, link, getattr(n, const, default)) for link in links]
        known = [c for c in counts if c is not None]
        s.add(NVLINK_ERRORS, float(sum(known)) if known else None, error_type=kind)


def _active_links(n: Any, q: Query, h: Any) -> tuple[int, ...]:
    """The links NVML says are up (a board without NVLink: none)."""
    return tuple(link for link in range(MAX_LINKS) if q(n.nvmlDeviceGetNvLinkState, h, link))


def _absent(*_: Any) -> None:
    """An NVML binding without the query: no reading."""
    return None
