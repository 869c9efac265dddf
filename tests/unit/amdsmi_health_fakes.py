"""The AMD SMI library double (``smi_fakes.fake_amdsmi``) with its health calls (not a test module).

``fake_amdsmi_health(gpus, health)`` adds what the library (ROCm 7.0's ``amdsmi``) has for health:
``AmdSmiGpuBlock`` and ``AmdSmiMemoryPageStatus`` (the wrapper's values), ``amdsmi_get_gpu_ecc_count``
(per block: ``correctable_count``, ``uncorrectable_count``, ``deferred_count``),
``amdsmi_get_gpu_bad_page_info`` (a record per page: ``value``, ``page_address``, ``page_size``,
``status``) and ``amdsmi_get_gpu_pci_replay_counter``. ``health[i]`` says what GPU ``i`` answers;
``mod.calls`` counts the health calls made, by name.
"""

from __future__ import annotations

import enum
import types
from collections import Counter
from dataclasses import dataclass, field

from .smi_fakes import AmdSmiLibraryException, FakeAmdGpu, fake_amdsmi

NOT_SUPPORTED = 2  # AMDSMI_STATUS_NOT_SUPPORTED
BLOCKS = {
    "INVALID": 0,
    "UMC": 1,
    "SDMA": 2,
    "GFX": 4,
    "MMHUB": 8,
    "ATHUB": 16,
    "PCIE_BIF": 32,
    "HDP": 64,
    "XGMI_WAFL": 128,
    "DF": 256,
    "SMN": 512,
    "SEM": 1024,
    "MP0": 2048,
    "MP1": 4096,
    "FUSE": 8192,
}
RESERVED, PENDING, UNRESERVABLE = 0, 1, 2  # amdsmi_memory_page_status_t


@dataclass
class FakeAmdHealth:
    """One GPU's answers: ECC per block (correctable, uncorrectable), page statuses, replays, failures."""

    ecc: dict[str, tuple[int, int]] = field(default_factory=lambda: {"UMC": (7, 3), "GFX": (1, 0)})
    pages: list[int] | str = field(default_factory=lambda: [RESERVED, RESERVED, PENDING])
    replays: int = 5
    raises: dict[str, Exception] = field(default_factory=dict)  # call name -> what it raises


def fake_amdsmi_health(gpus: list[FakeAmdGpu], health: list[FakeAmdHealth]) -> types.ModuleType:
    """``fake_amdsmi(gpus)`` with the health calls answering ``health[i]`` for GPU ``i``."""
    mod = fake_amdsmi(gpus)
    mod.AmdSmiGpuBlock = enum.IntEnum("AmdSmiGpuBlock", BLOCKS)
    mod.AmdSmiMemoryPageStatus = enum.IntEnum(
        "AmdSmiMemoryPageStatus", {"RESERVED": RESERVED, "PENDING": PENDING, "UNRESERVABLE": UNRESERVABLE}
    )
    mod.calls = Counter()

    def of(name: str, h: FakeAmdGpu) -> FakeAmdHealth:
        mod.calls[name] += 1
        if h.gone:
            raise AmdSmiLibraryException(31)  # AMDSMI_STATUS_NOT_FOUND
        answers = health[next(i for i, g in enumerate(gpus) if g is h)]
        if name in answers.raises:
            raise answers.raises[name]
        return answers

    def amdsmi_get_gpu_ecc_count(h: FakeAmdGpu, block: enum.IntEnum) -> dict[str, int]:
        if not isinstance(block, mod.AmdSmiGpuBlock):
            raise TypeError(f"block: expected AmdSmiGpuBlock, got {block!r}")  # AmdSmiParameterException
        counts = of("amdsmi_get_gpu_ecc_count", h).ecc.get(block.name)
        if counts is None:
            raise AmdSmiLibraryException(NOT_SUPPORTED)  # no ras/<block>_err_count: RAS off for the block
        return {"correctable_count": counts[0], "uncorrectable_count": counts[1], "deferred_count": 0}

    def amdsmi_get_gpu_bad_page_info(h: FakeAmdGpu) -> list[dict[str, int]] | str:
        pages = of("amdsmi_get_gpu_bad_page_info", h).pages
        if isinstance(pages, str):
            return pages  # older libraries: "No bad pages found."
        return [
            {"value": i, "page_address": 0x1000 * (i + 1), "page_size": 0x1000, "status": status}
            for i, status in enumerate(pages)
        ]

    def amdsmi_get_gpu_pci_replay_counter(h: FakeAmdGpu) -> int:
        return of("amdsmi_get_gpu_pci_replay_counter", h).replays

    for fn in (amdsmi_get_gpu_ecc_count, amdsmi_get_gpu_bad_page_info, amdsmi_get_gpu_pci_replay_counter):
        setattr(mod, fn.__name__, fn)
    return mod
