"""NVML's health queries on the ``fake_nvml`` double (nvidia-ml-py's names and shapes; not a test module)."""

from __future__ import annotations

import types
from dataclasses import dataclass, field

from .smi_fakes import NVMLError


@dataclass
class FakeHealth:
    """One GPU's health counters as NVML would give them."""

    volatile: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, location) -> count
    retired: dict[int, int] = field(default_factory=dict)  # cause -> pages
    retired_pending: int = 0
    remapped: tuple[int, int, int, int] | None = (0, 0, 0, 0)  # corr, unc, pending, failure
    replays: int = 0
    links: dict[int, dict[int, int]] = field(default_factory=dict)  # active link -> counter -> count
    unsupported: set[str] = field(default_factory=set)


def with_health(mod: types.ModuleType, health: list[FakeHealth]) -> types.ModuleType:
    """``mod`` (a ``fake_nvml``) with the health queries, GPU i answering from ``health[i]``."""
    mod.NVML_VOLATILE_ECC = 0
    mod.NVML_MEMORY_LOCATION_DRAM, mod.NVML_MEMORY_LOCATION_SRAM = 2, 7
    mod.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    mod.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    mod.NVML_NVLINK_ERROR_DL_REPLAY, mod.NVML_NVLINK_ERROR_DL_RECOVERY = 0, 1
    mod.NVML_NVLINK_ERROR_DL_CRC_FLIT, mod.NVML_NVLINK_ERROR_DL_CRC_DATA = 2, 3
    by_handle = {id(mod.nvmlDeviceGetHandleByIndex(i)): h for i, h in enumerate(health)}

    def of(fn: str, handle: object) -> FakeHealth:
        mod.calls.append(fn)
        h = by_handle[id(handle)]
        if fn in h.unsupported:
            raise NVMLError(3)
        return h

    def nvmlDeviceGetMemoryErrorCounter(handle: object, kind: int, counter: int, location: int) -> int:
        assert counter == mod.NVML_VOLATILE_ECC
        return of("nvmlDeviceGetMemoryErrorCounter", handle).volatile.get((kind, location), 0)

    def nvmlDeviceGetRetiredPages(handle: object, cause: int) -> list[int]:
        return [0x1000 * i for i in range(of("nvmlDeviceGetRetiredPages", handle).retired.get(cause, 0))]

    def nvmlDeviceGetRetiredPagesPendingStatus(handle: object) -> int:
        return of("nvmlDeviceGetRetiredPagesPendingStatus", handle).retired_pending

    def nvmlDeviceGetRemappedRows(handle: object) -> tuple[int, int, int, int]:
        rows = of("nvmlDeviceGetRemappedRows", handle).remapped
        if rows is None:
            raise NVMLError(3)
        return rows

    def nvmlDeviceGetPcieReplayCounter(handle: object) -> int:
        return of("nvmlDeviceGetPcieReplayCounter", handle).replays

    def nvmlDeviceGetNvLinkState(handle: object, link: int) -> int:
        return int(link in of("nvmlDeviceGetNvLinkState", handle).links)

    def nvmlDeviceGetNvLinkErrorCounter(handle: object, link: int, counter: int) -> int:
        return of("nvmlDeviceGetNvLinkErrorCounter", handle).links[link].get(counter, 0)

    for fn in (
        nvmlDeviceGetMemoryErrorCounter,
        nvmlDeviceGetRetiredPages,
        nvmlDeviceGetRetiredPagesPendingStatus,
        nvmlDeviceGetRemappedRows,
        nvmlDeviceGetPcieReplayCounter,
        nvmlDeviceGetNvLinkState,
        nvmlDeviceGetNvLinkErrorCounter,
    ):
        setattr(mod, fn.__name__, fn)
    return mod
