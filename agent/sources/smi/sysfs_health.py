"""amdgpu's health files in sysfs (docs/health.md): ECC errors per RAS block, bad pages, PCIe replays.

Per ``class/drm/cardN/device`` (the formats are the kernel's, ``drivers/gpu/drm/amd/amdgpu``:
``amdgpu_ras.c``'s "RAS sysfs Error Count" and "gpu_vram_bad_pages" interfaces, ``amdgpu_device.c``'s
``pcie_replay_count``):

- ``ras/<block>_err_count``, one per RAS block the driver enabled (``umc``, ``gfx``, ``sdma``,
  ``mmhub``, ``xgmi_wafl``, ``hdp``, ``pcie_bif``, ``mca_mp0`` ...): ``ue: N`` / ``ce: N`` lines
  (newer kernels add ``de: N``, deferred errors, for ``umc``: not read), counts since the driver
  loaded -> ``aaco.gpu.ecc.uncorrected`` / ``.corrected`` with ``block`` the file's name before
  ``_err_count``, and, summed over the blocks, ``hw.errors`` ``uncorrected`` / ``corrected`` (one read
  of each file gives both). ``Query currently inaccessible`` (while the driver recovers from a RAS
  error) is no reading, without a problem;
- ``ras/gpu_vram_bad_pages``, a line per bad VRAM page the driver recorded (``0x00000001 :
  0x00001000 : R``: page frame, page size, flag): ``R`` reserved (retired), ``P`` pending (to be
  reserved at the next reservation window, a reset), ``F`` the driver could not reserve it. ``R`` and
  ``F`` count as ``aaco.gpu.memory.retired_pages{cause=ecc}`` (each is a page retired in the RAS
  table, the EEPROM record the driver's bad-page threshold counts), ``P`` as
  ``aaco.gpu.memory.retired_pages.pending``. The file is a binary attribute that answers a page of
  lines per read, so it is read to its end (``Tree.read_all``, at most ``BAD_PAGES_MAX_BYTES``);
  it is absent when the driver keeps no bad pages (``amdgpu.bad_page_threshold=0``, no RAS);
- ``pcie_replay_count``: PCIe replays (NAKs sent and received) since the driver loaded ->
  ``aaco.gpu.pcie.replays``.

A value of the wrong shape is a ``FieldProblem`` naming the file (and ``ue`` / ``ce`` or the line);
the file's other values and the other files are kept.
"""

from __future__ import annotations

import re
from typing import Final

from aaco.agent.sources.smi.sysfs_tree import Tree
from aaco.agent.sources.smi.sysfs_tree import text as _text
from aaco.agent.sources.smi.values import Fields
from aaco.contract.telemetry import (
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ERRORS,
    PCIE_REPLAYS,
    RETIRED_PAGES,
    RETIRED_PAGES_PENDING,
    GpuSample,
)

ERR_COUNT_SUFFIX: Final = "_err_count"
BAD_PAGES: Final = "gpu_vram_bad_pages"
PCIE_REPLAY_COUNT: Final = "pcie_replay_count"
BAD_PAGES_MAX_BYTES: Final = 1 << 20  # 37 449 lines of 28 bytes: far more pages than any GPU may retire
_KINDS: Final = {"ue": ("uncorrected", ECC_UNCORRECTED), "ce": ("corrected", ECC_CORRECTED)}
_IGNORED_KEYS: Final = frozenset({"de"})  # deferred errors: no reading for them
_INACCESSIBLE: Final = "query currently inaccessible"
_BAD_PAGE = re.compile(r"^\s*0x[0-9a-fA-F]+\s*:\s*0x[0-9a-fA-F]+\s*:\s*([RPF])\s*$")
_COUNT = re.compile(r"^\d+$")


def ras_files(tree: Tree, dev: str) -> tuple[tuple[str, ...], str | None]:
    """The ``ras/*_err_count`` files of a device (by name) and its ``ras/gpu_vram_bad_pages`` (None: absent)."""
    names = tree.listdir(f"{dev}/ras")
    counts = tuple(f"{dev}/ras/{n}" for n in names if n.endswith(ERR_COUNT_SUFFIX) and len(n) > len(ERR_COUNT_SUFFIX))
    return counts, (f"{dev}/ras/{BAD_PAGES}" if BAD_PAGES in names else None)


def read_health(
    tree: Tree, dev: str, err_counts: tuple[str, ...], bad_pages: str | None, f: Fields, s: GpuSample
) -> None:
    """Add a card's ECC counts (per block and summed), bad pages and PCIe replays to ``s``."""
    totals: dict[str, float] = {}
    for path in err_counts:
        block = path.rsplit("/", 1)[-1][: -len(ERR_COUNT_SUFFIX)]
        for kind, value in _err_count(_text(tree, path), path, f).items():
            error_type, metric = _KINDS[kind]
            s.add(metric, value, block=block)
            totals[error_type] = totals.get(error_type, 0.0) + value
    for error_type, total in totals.items():
        s.add(ERRORS, total, error_type=error_type)
    if bad_pages is not None:
        _bad_pages(tree, bad_pages, f, s)
    replays = _text(tree, f"{dev}/{PCIE_REPLAY_COUNT}")
    if replays:
        s.add(PCIE_REPLAYS, _count(replays, f"{dev}/{PCIE_REPLAY_COUNT}", "", f))


def _err_count(content: str, path: str, f: Fields) -> dict[str, float]:
    """``ue`` / ``ce`` -> count of one ``<block>_err_count`` file (problems for lines of another shape)."""
    out: dict[str, float] = {}
    if content.lower() == _INACCESSIBLE:
        return out
    for line in content.splitlines():
        if not line.strip():
            continue
        key, sep, raw = line.partition(":")
        key = key.strip().lower()
        if not sep or (key not in _KINDS and key not in _IGNORED_KEYS):
            f.problem(path, f"expected 'ue: N' or 'ce: N', got {line.strip()[:60]!r}")
            continue
        if key in _IGNORED_KEYS:
            continue
        value = _count(raw.strip(), path, f"{key}: ", f)
        if value is not None:
            out[key] = value
    return out


def _count(raw: str, path: str, label: str, f: Fields) -> float | None:
    """A decimal count as the kernel prints it (``%lu``), or None with a problem."""
    if _COUNT.match(raw) is None:
        f.problem(path, f"{label}expected a count, got {raw[:60]!r}")
        return None
    return float(raw)


def _bad_pages(tree: Tree, path: str, f: Fields, s: GpuSample) -> None:
    data = tree.read_all(path, BAD_PAGES_MAX_BYTES)
    if data is None:
        return
    if len(data) > BAD_PAGES_MAX_BYTES:
        f.problem(path, f"more than {BAD_PAGES_MAX_BYTES} bytes: the pages beyond are not counted")
        data = data[: data.rfind(b"\n", 0, BAD_PAGES_MAX_BYTES) + 1]
    flags = {"R": 0, "P": 0, "F": 0}
    bad: list[tuple[int, str]] = []
    for i, line in enumerate(data.decode(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        m = _BAD_PAGE.match(line)
        if m is None:
            bad.append((i, line.strip()))
            continue
        flags[m.group(1)] += 1
    if bad:
        first, line = bad[0]
        f.problem(
            path,
            f"{len(bad)} line(s) not 'page : size : R|P|F' (not counted); line {first}: {line[:60]!r}",
        )
    s.add(RETIRED_PAGES, float(flags["R"] + flags["F"]), cause="ecc")
    s.add(RETIRED_PAGES_PENDING, float(flags["P"]))
