"""amdgpu's sysfs files, read directly: no tool, no library, works in any container that mounts /sys.

Per ``class/drm/cardN/device`` (N a number; connectors like ``card0-DP-1`` are skipped) of an AMD
GPU (``vendor`` 0x1002, or the ``driver`` link names amdgpu):

- ``gpu_busy_percent`` / ``mem_busy_percent`` -> utilisation ratios;
- ``mem_info_vram_used`` / ``mem_info_vram_total`` (bytes);
- ``pp_dpm_sclk`` / ``pp_dpm_mclk`` / ``pp_dpm_socclk`` / ``pp_dpm_fclk`` (``0: 852Mhz *``): the level
  marked ``*`` is the current clock, the highest level the maximum; a measured
  ``hwmon/hwmonM/freqK_input`` (Hz, labelled ``sclk`` / ``mclk``) wins over the DPM level when present;
- ``hwmon/hwmonM/power1_average`` or ``power1_input`` (microwatts), ``power1_cap`` (the power cap,
  microwatts), ``tempK_input`` (millidegrees, labelled ``edge`` / ``junction`` / ``mem``);
- ``ras/*_err_count`` (``ue: N`` / ``ce: N``) -> ECC error counts;
- ``gpu_metrics`` -> throttle reasons where its layout is known (``gpu_metrics``).

The files are read through a ``Tree``: ``DirTree`` on a real (or unpacked) directory, where
``--sysfs-root`` points at the directory that holds ``class/drm`` (``/sys``, or ``/host/sys`` in a
container that mounts the host's), or ``ArchiveTree`` on a ttar capture. A read that fails with a
device error (ENODEV, EIO, ...: a GPU that fell off the bus or is resetting) drops that GPU from
the sample, so the source reports it down; "not supported" errors just leave a reading out.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Final, Protocol

from . import gpu_metrics
from .model import (
    CLOCK,
    CLOCK_MAX,
    ERRORS,
    MEMORY_LIMIT,
    MEMORY_USAGE,
    MEMORY_UTILIZATION,
    POWER,
    POWER_LIMIT,
    TEMPERATURE,
    THROTTLE,
    THROTTLE_REASONS,
    UTILIZATION,
    GpuIdentity,
    GpuSample,
    Snapshot,
    normalize_pci,
)
from .ttar import Archive
from .values import Fields

FORMAT: Final = "sysfs"
_CARD = re.compile(r"^card(\d+)$")
_LEVEL = re.compile(r"^\s*(\d+):\s*(\d+(?:\.\d+)?)\s*([MmGgKk]?[Hh]z)\s*(\*)?\s*$")
_DPM: Final = (
    ("pp_dpm_sclk", "graphics"),
    ("pp_dpm_mclk", "memory"),
    ("pp_dpm_socclk", "soc"),
    ("pp_dpm_fclk", "fabric"),
)
_FREQ_LABELS: Final[dict[str, str]] = {"sclk": "graphics", "mclk": "memory"}
_TEMP_LABELS: Final[dict[str, str]] = {"edge": "edge", "junction": "junction", "mem": "memory"}
_UNAVAILABLE: Final = frozenset(
    {errno.EINVAL, errno.EOPNOTSUPP, errno.ENODATA, errno.EPERM, errno.EACCES, errno.ENOENT}
)
_HZ: Final[dict[str, float]] = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}


class DeviceGoneError(Exception):
    """A GPU's files failed with a device error: it fell off the bus or is resetting."""


class Tree(Protocol):
    """Read access to a sysfs tree (real, unpacked, or an archive in memory)."""

    name: str

    def read(self, rel: str) -> bytes | None:
        """The file's content; None when it does not exist or says "not supported"."""

    def listdir(self, rel: str) -> list[str]:
        """Entries of a directory (empty when it does not exist)."""

    def readlink(self, rel: str) -> str | None:
        """A symbolic link's target (None when not a link)."""


class DirTree:
    """A sysfs tree on disk: ``root`` holds ``class/drm``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.name = os.fspath(root)
        self._prefix = self.name.rstrip("/") + "/"  # plain strings: pathlib costs more than the reads

    def read(self, rel: str) -> bytes | None:
        """Read a file (sysfs files are small: 64 KiB at most)."""
        try:
            fd = os.open(self._prefix + rel, os.O_RDONLY)
        except OSError as exc:
            if exc.errno in _UNAVAILABLE or exc.errno == errno.ENOTDIR:
                return None
            raise DeviceGoneError(f"{rel}: {exc.strerror}") from exc
        try:
            return os.read(fd, 65536)
        except OSError as exc:
            if exc.errno in _UNAVAILABLE:
                return None
            raise DeviceGoneError(f"{rel}: {exc.strerror}") from exc
        finally:
            os.close(fd)

    def listdir(self, rel: str) -> list[str]:
        """Directory entries, sorted."""
        try:
            return sorted(os.listdir(self._prefix + rel))
        except OSError:
            return []

    def readlink(self, rel: str) -> str | None:
        """Link target, if a link."""
        try:
            return os.readlink(self._prefix + rel)
        except OSError:
            return None


class ArchiveTree:
    """A sysfs tree captured as a ttar archive; ``prefix`` is the archive path that holds ``class/drm``."""

    def __init__(self, archive: Archive, name: str) -> None:
        self.archive = archive
        self.name = name
        paths = list(archive.files) + list(archive.links) + sorted(archive.dirs)
        hit = next((p for p in paths if "class/drm" in p), None)
        self.prefix = hit[: hit.index("class/drm")] if hit else ""

    def read(self, rel: str) -> bytes | None:
        """The archived file."""
        return self.archive.files.get(self.prefix + rel)

    def listdir(self, rel: str) -> list[str]:
        """Children of an archived directory."""
        base = (self.prefix + rel).rstrip("/") + "/"
        every = [*self.archive.files, *self.archive.links, *self.archive.dirs]
        return sorted({p[len(base) :].split("/", 1)[0] for p in every if p.startswith(base)})

    def readlink(self, rel: str) -> str | None:
        """The archived link target."""
        return self.archive.links.get(self.prefix + rel)


def amd_cards(tree: Tree) -> list[str]:
    """``cardN`` names of AMD GPUs in the tree, by N."""
    out = []
    for name in tree.listdir("class/drm"):
        if not _CARD.match(name):
            continue
        dev = f"class/drm/{name}/device"
        vendor = _text(tree, f"{dev}/vendor")
        driver = tree.readlink(f"{dev}/driver") or ""
        if vendor.lower() == "0x1002" or os.path.basename(driver) == "amdgpu":
            out.append(name)
    return sorted(out, key=lambda n: int(_CARD.match(n).group(1)))


def _text(tree: Tree, rel: str) -> str:
    data = tree.read(rel)
    return data.decode(errors="replace").strip() if data else ""


def read_sysfs(tree: Tree) -> Snapshot:
    """One sample of every AMD GPU in the tree (a GPU whose files fail with a device error is left out)."""
    f = Fields(tree.name)
    snap = Snapshot(FORMAT)
    for card in amd_cards(tree):
        try:
            snap.gpus.append(read_card(tree, card, f))
        except DeviceGoneError as exc:
            f.problem(f"class/drm/{card}", f"device error: {exc}")
    snap.problems = f.problems
    return snap


def read_card(tree: Tree, card: str, f: Fields) -> GpuSample:
    """Readings of one ``cardN``."""
    dev = f"class/drm/{card}/device"

    def num(name: str) -> float | None:
        raw = _text(tree, f"{dev}/{name}")
        return f.num(raw, f"{dev}/{name}") if raw else None

    uevent = dict(line.split("=", 1) for line in _text(tree, f"{dev}/uevent").splitlines() if "=" in line)
    model = _text(tree, f"{dev}/product_name") or f"amdgpu {_text(tree, f'{dev}/device') or 'unknown'}"
    s = GpuSample(
        GpuIdentity(
            _CARD.match(card).group(1),
            uuid=_text(tree, f"{dev}/unique_id"),
            pci_bus=normalize_pci(uevent.get("PCI_SLOT_NAME", "")),
            model=model,
            vendor="amd",
        )
    )
    busy = num("gpu_busy_percent")
    s.add(UTILIZATION, None if busy is None else busy / 100.0)
    mem_busy = num("mem_busy_percent")
    s.add(MEMORY_UTILIZATION, None if mem_busy is None else mem_busy / 100.0)
    s.add(MEMORY_USAGE, num("mem_info_vram_used"))
    s.add(MEMORY_LIMIT, num("mem_info_vram_total"))
    _hwmon(tree, dev, f, s)
    for fname, clock in _DPM:
        current, top = _dpm_levels(_text(tree, f"{dev}/{fname}"), f"{dev}/{fname}", f)
        if current is not None and not s.has(CLOCK, clock=clock):
            s.add(CLOCK, current, clock=clock)
        s.add(CLOCK_MAX, top, clock=clock)
    _ras(tree, dev, f, s)
    _throttle(tree, dev, f, s)
    return s


def _dpm_levels(text: str, path: str, f: Fields) -> tuple[float | None, float | None]:
    """(current level, highest level) of a ``pp_dpm_*`` table, in Hz."""
    current = top = None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LEVEL.match(line)
        if m is None:
            f.problem(path, f"not a DPM level line: {line.strip()!r}")
            continue
        hz = float(m.group(2)) * _HZ[m.group(3).lower()]
        top = hz if top is None else max(top, hz)
        if m.group(4):
            current = hz
    return current, top


def _hwmon(tree: Tree, dev: str, f: Fields, s: GpuSample) -> None:
    for hw in tree.listdir(f"{dev}/hwmon"):
        base = f"{dev}/hwmon/{hw}"
        files = set(tree.listdir(base))
        for name in ("power1_average", "power1_input"):
            if name in files and not s.has(POWER):
                raw = _text(tree, f"{base}/{name}")
                uw = f.num(raw, f"{base}/{name}") if raw else None
                s.add(POWER, None if uw is None else uw / 1e6)
        if "power1_cap" in files and not s.has(POWER_LIMIT):
            raw = _text(tree, f"{base}/power1_cap")
            uw = f.num(raw, f"{base}/power1_cap") if raw else None
            s.add(POWER_LIMIT, None if uw is None else uw / 1e6)
        for name in sorted(files):
            m = re.match(r"^(temp|freq)(\d+)_input$", name)
            if m is None:
                continue
            label = _text(tree, f"{base}/{m.group(1)}{m.group(2)}_label").lower()
            raw = _text(tree, f"{base}/{name}")
            v = f.num(raw, f"{base}/{name}") if raw else None
            if v is None:
                continue
            if m.group(1) == "temp" and (sensor := _TEMP_LABELS.get(label or "edge")):
                s.add(TEMPERATURE, v / 1000.0, sensor=sensor)
            elif m.group(1) == "freq" and (clock := _FREQ_LABELS.get(label)):
                s.add(CLOCK, v, clock=clock)


def _ras(tree: Tree, dev: str, f: Fields, s: GpuSample) -> None:
    totals: dict[str, float] = {}
    for name in tree.listdir(f"{dev}/ras"):
        if not name.endswith("_err_count"):
            continue
        for line in _text(tree, f"{dev}/ras/{name}").splitlines():
            key, _, value = line.partition(":")
            kind = {"ue": "uncorrected", "ce": "corrected"}.get(key.strip())
            v = f.num(value.strip(), f"{dev}/ras/{name}") if kind else None
            if kind and v is not None:
                totals[kind] = totals.get(kind, 0.0) + v
    for kind, total in totals.items():
        s.add(ERRORS, total, error_type=kind)


def _throttle(tree: Tree, dev: str, f: Fields, s: GpuSample) -> None:
    data = tree.read(f"{dev}/gpu_metrics")
    if not data:
        return
    try:
        table = gpu_metrics.decode(data)
    except ValueError as exc:
        f.problem(f"{dev}/gpu_metrics", str(exc))
        return
    if table.indep_throttle_status is None:
        return  # a layout not decoded here: the other readings go on
    reasons = gpu_metrics.throttle_reasons(table.indep_throttle_status)
    for reason in THROTTLE_REASONS:
        s.add(THROTTLE, float(reasons[reason]), reason=reason)
