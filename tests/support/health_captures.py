"""Copies of the real amdgpu sysfs capture with health files set (tests; nothing checked in).

``amd_sysfs_with(dst_dir, files)`` writes ``examples/data/sysfs/amdgpu_card0.ttar`` (a real Vega 10
``card0``, ttar: ``Path:`` / ``Lines: N`` / content / ``Mode:``) with the given files of
``card0/device`` replaced (a record that exists keeps its place, every other byte of the archive
stays as it was) or added at its end. ``amd_sysfs_with_ecc`` sets the three health files the way
amdgpu writes them: ``ras/<block>_err_count`` (``ue: N`` / ``ce: N``), ``ras/gpu_vram_bad_pages``
(``0x%08x : 0x%08x : R|P|F`` per page) and ``pcie_replay_count``. Read the copy with
``read_capture`` (an ``ArchiveTree``) or unpack it (``ttar.unpack``) for a ``DirTree``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tests.conftest import ROOT

AMD_SYSFS = ROOT / "examples" / "data" / "sysfs" / "amdgpu_card0.ttar"
DEVICE = "fixtures/sys/class/drm/card0/device"  # card0's device directory in the archive
PAGE_SIZE = 0x1000  # the GPU page size amdgpu prints


def bad_pages(retired: int = 0, pending: int = 0, failed: int = 0) -> str:
    """``ras/gpu_vram_bad_pages`` content: ``retired`` R lines, then ``pending`` P, then ``failed`` F."""
    flags = "R" * retired + "P" * pending + "F" * failed
    return "".join(f"0x{pfn:08x} : 0x{PAGE_SIZE:08x} : {flag}\n" for pfn, flag in enumerate(flags, 1))


def amd_sysfs_with(dst_dir: Path, files: Mapping[str, str], name: str = "amdgpu_card0.ttar") -> Path:
    """The real capture with ``files`` (paths under ``card0/device`` -> text) set, written to ``dst_dir/name``."""
    lines = AMD_SYSFS.read_text().split("\n")
    for rel, content in files.items():
        lines = _set_file(lines, f"{DEVICE}/{rel}", content)
    dst = dst_dir / name
    dst.write_text("\n".join(lines))
    return dst


def amd_sysfs_with_ecc(
    tmp_path: Path,
    ue: int = 3,
    ce: int = 7,
    *,
    block: str = "umc",
    retired: int = 2,
    pending: int = 1,
    failed: int = 0,
    replays: int = 5,
    name: str = "amdgpu_card0.ttar",
) -> Path:
    """The real capture with ``ras/<block>_err_count`` ``ue`` / ``ce``, bad pages and ``pcie_replay_count``."""
    return amd_sysfs_with(
        tmp_path,
        {
            f"ras/{block}_err_count": f"ue: {ue}\nce: {ce}\n",
            "ras/gpu_vram_bad_pages": bad_pages(retired, pending, failed),
            "pcie_replay_count": f"{replays}\n",
        },
        name,
    )


def _record(path: str, content: str) -> list[str]:
    """A ttar file record's ``Path:`` / ``Lines:`` / content lines (a last line without newline ends ``EOF``)."""
    if not content:
        body: list[str] = []
    elif content.endswith("\n"):
        body = content[:-1].split("\n")
    else:
        body = content.split("\n")
        body[-1] += "EOF"
    return [f"Path: {path}", f"Lines: {len(body)}", *body]


def _set_file(lines: list[str], path: str, content: str) -> list[str]:
    """The archive's lines with the file at ``path`` replaced by ``content`` (appended when absent)."""
    if f"Path: {path}" in lines:
        at = lines.index(f"Path: {path}")
        count = int(lines[at + 1].removeprefix("Lines: ").split("|")[0])
        return [*lines[:at], *_record(path, content), *lines[at + 2 + count :]]
    while lines and not lines[-1]:
        lines = lines[:-1]
    return [*lines, "# ttar - - -", *_record(path, content), "Mode: 444", ""]
