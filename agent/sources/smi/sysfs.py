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

What does not change while a card stays (its identity, its hwmon sensors and labels, its RAS
files) is a ``CardLayout``, found once: ``SysfsReader`` (the sysfs backend, sampling every
second) keeps the layouts and reads only the files that hold readings, finding them again when a
card appears, vanishes or fails, and every ``LAYOUT_REFRESH_S``. ``read_sysfs`` finds them afresh.
The sysfs backend's ``DirTree`` also keeps those files open and reads them again from the start
(sysfs regenerates an attribute on every read at offset 0; its files are never replaced while the
device stays, and a device that goes makes the read fail, which closes them).
"""

from __future__ import annotations

import errno
import functools
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

from aaco.agent.sources.smi.gpu_metrics import decode as decode_gpu_metrics
from aaco.agent.sources.smi.gpu_metrics import throttle_reasons
from aaco.agent.sources.smi.ttar import Archive
from aaco.agent.sources.smi.values import Fields
from aaco.contract.telemetry import (
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

FORMAT: Final = "sysfs"
_CARD = re.compile(r"^card(\d+)$")
_LEVEL = re.compile(r"^\s*(\d+):\s*(\d+(?:\.\d+)?)\s*([MmGgKk]?[Hh]z)\s*(\*)?\s*$")
_DPM: Final = (
    ("pp_dpm_sclk", "graphics"),
    ("pp_dpm_mclk", "memory"),
    ("pp_dpm_socclk", "soc"),
    ("pp_dpm_fclk", "fabric"),
)
_READINGS: Final = ("gpu_busy_percent", "mem_busy_percent", "mem_info_vram_used", "mem_info_vram_total")
_FREQ_LABELS: Final[dict[str, str]] = {"sclk": "graphics", "mclk": "memory"}
_TEMP_LABELS: Final[dict[str, str]] = {"edge": "edge", "junction": "junction", "mem": "memory"}
_UNAVAILABLE: Final = frozenset(
    {errno.EINVAL, errno.EOPNOTSUPP, errno.ENODATA, errno.EPERM, errno.EACCES, errno.ENOENT}
)
_HZ: Final[dict[str, float]] = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}
_SENSOR = re.compile(r"^(temp|freq)(\d+)_input$")
LAYOUT_REFRESH_S: Final = 60.0


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

    def keep(self, rels: Iterable[str]) -> None:
        """Files read again and again: the tree may keep them open."""

    def forget(self, prefix: str) -> None:
        """Stop keeping open the files under ``prefix`` ("" for all)."""


class DirTree:
    """A sysfs tree on disk: ``root`` holds ``class/drm``.

    Files named by ``keep`` (at most ``max_open`` of them) stay open once read and are read again
    from their start with ``pread``, which sysfs answers with fresh content: an open and a close
    per reading cost more than the read itself (0.47 ms against 0.09 ms for 8 GPUs' 120 files).
    The tree is not shared between threads (its caller makes one call at a time).
    """

    def __init__(self, root: Path, max_open: int = 0) -> None:
        self.root = root
        self.name = os.fspath(root)
        self.max_open = max_open
        self._prefix = self.name.rstrip("/") + "/"  # plain strings: pathlib costs more than the reads
        self._kept: dict[str, int | None] = {}  # files to keep open -> descriptor (None: not open yet)

    def read(self, rel: str) -> bytes | None:
        """Read a file (sysfs files are small: 64 KiB at most)."""
        kept = rel in self._kept
        fd = self._kept.get(rel)
        if fd is None:
            try:
                fd = os.open(self._prefix + rel, os.O_RDONLY)
            except OSError as exc:
                if exc.errno in _UNAVAILABLE or exc.errno == errno.ENOTDIR:
                    return None
                raise DeviceGoneError(f"{rel}: {exc.strerror}") from exc
            if kept:
                self._kept[rel] = fd
        try:
            return os.pread(fd, 65536, 0) if kept else os.read(fd, 65536)
        except OSError as exc:
            if kept:
                self._kept[rel] = None  # opened again at the next read
                kept = False
            if exc.errno in _UNAVAILABLE:
                return None
            raise DeviceGoneError(f"{rel}: {exc.strerror}") from exc
        finally:
            if not kept:
                os.close(fd)

    def keep(self, rels: Iterable[str]) -> None:
        """Keep these files open once read (as many as ``max_open`` allows)."""
        for rel in rels:
            if len(self._kept) >= self.max_open:
                return
            self._kept.setdefault(rel, None)

    def forget(self, prefix: str) -> None:
        """Close the kept files under ``prefix`` ("" for all) and stop keeping them."""
        for rel in [r for r in self._kept if r.startswith(prefix)]:
            fd = self._kept.pop(rel)
            if fd is not None:
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

    def keep(self, rels: Iterable[str]) -> None:
        """Nothing to keep open: the archive is in memory."""

    def forget(self, prefix: str) -> None:
        """Nothing kept open."""


def amd_cards(tree: Tree) -> list[str]:
    """``cardN`` names of AMD GPUs in the tree, by N."""
    return [name for name in _card_names(tree) if is_amd(tree, name)]


def _card_names(tree: Tree) -> list[str]:
    """``cardN`` entries of ``class/drm``, by N."""
    return sorted((n for n in tree.listdir("class/drm") if _CARD.match(n)), key=lambda n: int(n[4:]))


def is_amd(tree: Tree, card: str) -> bool:
    """True when ``cardN`` is an AMD GPU (vendor 0x1002, or bound to the amdgpu driver)."""
    dev = f"class/drm/{card}/device"
    vendor = _text(tree, f"{dev}/vendor")
    driver = tree.readlink(f"{dev}/driver") or ""
    return vendor.lower() == "0x1002" or os.path.basename(driver) == "amdgpu"


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
    return read_readings(tree, card_layout(tree, card), f)


@dataclass(frozen=True, slots=True)
class CardLayout:
    """What stays the same while a card stays: who it is and which of its files hold readings.

    ``hwmon`` lists, in reading order, ``(kind, path, label)``: kind ``power`` / ``cap`` (candidate
    files, the first with a value wins) or ``temp`` / ``freq`` (a sensor and its label).
    """

    dev: str
    identity: GpuIdentity
    hwmon: tuple[tuple[str, str, str], ...]
    ras: tuple[str, ...]

    def files(self) -> list[str]:
        """The files every sample reads."""
        dev = self.dev
        own = [f"{dev}/{name}" for name in _READINGS] + [f"{dev}/{name}" for name, _ in _DPM]
        return [*own, *(path for _, path, _ in self.hwmon), *self.ras, f"{dev}/gpu_metrics"]


def card_layout(tree: Tree, card: str) -> CardLayout:
    """Find a card's identity and the files that hold its readings."""
    dev = f"class/drm/{card}/device"
    uevent = dict(line.split("=", 1) for line in _text(tree, f"{dev}/uevent").splitlines() if "=" in line)
    model = _text(tree, f"{dev}/product_name") or f"amdgpu {_text(tree, f'{dev}/device') or 'unknown'}"
    identity = GpuIdentity(
        _CARD.match(card).group(1),
        uuid=_text(tree, f"{dev}/unique_id"),
        pci_bus=normalize_pci(uevent.get("PCI_SLOT_NAME", "")),
        model=model,
        vendor="amd",
    )
    hwmon: list[tuple[str, str, str]] = []
    for hw in tree.listdir(f"{dev}/hwmon"):
        base = f"{dev}/hwmon/{hw}"
        files = set(tree.listdir(base))
        hwmon += [("power", f"{base}/{name}", "") for name in ("power1_average", "power1_input") if name in files]
        if "power1_cap" in files:
            hwmon.append(("cap", f"{base}/power1_cap", ""))
        for name in sorted(files):
            m = _SENSOR.match(name)
            if m is not None:
                label = _text(tree, f"{base}/{m.group(1)}{m.group(2)}_label").lower()
                hwmon.append((m.group(1), f"{base}/{name}", label))
    ras = tuple(f"{dev}/ras/{name}" for name in tree.listdir(f"{dev}/ras") if name.endswith("_err_count"))
    return CardLayout(dev, identity, tuple(hwmon), ras)


def read_readings(tree: Tree, layout: CardLayout, f: Fields) -> GpuSample:
    """The readings of a card whose layout is known."""
    dev = layout.dev

    def num(name: str) -> float | None:
        raw = _text(tree, f"{dev}/{name}")
        return f.num(raw, f"{dev}/{name}") if raw else None

    s = GpuSample(layout.identity)
    busy = num(_READINGS[0])
    s.add(UTILIZATION, None if busy is None else busy / 100.0)
    mem_busy = num(_READINGS[1])
    s.add(MEMORY_UTILIZATION, None if mem_busy is None else mem_busy / 100.0)
    s.add(MEMORY_USAGE, num(_READINGS[2]))
    s.add(MEMORY_LIMIT, num(_READINGS[3]))
    _hwmon(tree, layout.hwmon, f, s)
    for fname, clock in _DPM:
        current, top = _dpm_levels(_text(tree, f"{dev}/{fname}"), f"{dev}/{fname}", f)
        if current is not None and not s.has(CLOCK, clock=clock):
            s.add(CLOCK, current, clock=clock)
        s.add(CLOCK_MAX, top, clock=clock)
    _ras(tree, layout.ras, f, s)
    _throttle(tree, dev, f, s)
    return s


class SysfsReader:
    """Samples a tree again and again, keeping each card's layout between samples.

    Every sample lists ``class/drm`` (one call): a card that appears is probed, one that vanished is
    forgotten, and one whose files fail with a device error is probed again when it answers. Every
    ``refresh_s`` all layouts are found again (a driver reload can renumber hwmon directories).
    Found once, a layout saves about a third of the reads and all but one directory listing.
    """

    def __init__(
        self, tree: Tree, refresh_s: float = LAYOUT_REFRESH_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.tree = tree
        self.refresh_s = refresh_s
        self._clock = clock
        self._layouts: dict[str, CardLayout | None] = {}  # None: a card that is not an AMD GPU
        self._found_at = clock()

    def sample(self) -> Snapshot:
        """One sample of every AMD GPU in the tree, as ``read_sysfs`` gives it."""
        tree = self.tree
        if self._clock() - self._found_at >= self.refresh_s:
            self._layouts.clear()
            tree.forget("")
            self._found_at = self._clock()
        f = Fields(tree.name)
        snap = Snapshot(FORMAT)
        names = _card_names(tree)
        for gone in self._layouts.keys() - set(names):
            self._drop(gone)
        for card in names:
            try:
                if card not in self._layouts:
                    layout = card_layout(tree, card) if is_amd(tree, card) else None
                    if layout is not None:
                        tree.keep(layout.files())
                    self._layouts[card] = layout
                layout = self._layouts[card]
                if layout is not None:
                    snap.gpus.append(read_readings(tree, layout, f))
            except DeviceGoneError as exc:
                self._drop(card)
                f.problem(f"class/drm/{card}", f"device error: {exc}")
        snap.problems = f.problems
        return snap

    def _drop(self, card: str) -> None:
        self._layouts.pop(card, None)
        self.tree.forget(f"class/drm/{card}/")

    def close(self) -> None:
        """Close the files kept open."""
        self._layouts.clear()
        self.tree.forget("")


def _dpm_levels(text: str, path: str, f: Fields) -> tuple[float | None, float | None]:
    """(current level, highest level) of a ``pp_dpm_*`` table, in Hz."""
    current, top, bad = _parse_dpm(text)
    for line in bad:
        f.problem(path, f"not a DPM level line: {line!r}")
    return current, top


@functools.lru_cache(maxsize=256)
def _parse_dpm(text: str) -> tuple[float | None, float | None, tuple[str, ...]]:
    """(current, highest, lines that are not levels) of a DPM table; cached: the tables repeat sample after sample."""
    current = top = None
    bad = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LEVEL.match(line)
        if m is None:
            bad.append(line.strip())
            continue
        hz = float(m.group(2)) * _HZ[m.group(3).lower()]
        top = hz if top is None else max(top, hz)
        if m.group(4):
            current = hz
    return current, top, tuple(bad)


def _hwmon(tree: Tree, files: tuple[tuple[str, str, str], ...], f: Fields, s: GpuSample) -> None:
    for kind, path, label in files:
        if kind in ("power", "cap"):
            metric = POWER if kind == "power" else POWER_LIMIT
            if not s.has(metric):
                raw = _text(tree, path)
                uw = f.num(raw, path) if raw else None
                s.add(metric, None if uw is None else uw / 1e6)
            continue
        raw = _text(tree, path)
        v = f.num(raw, path) if raw else None
        if v is None:
            continue
        if kind == "temp" and (sensor := _TEMP_LABELS.get(label or "edge")):
            s.add(TEMPERATURE, v / 1000.0, sensor=sensor)
        elif kind == "freq" and (clock := _FREQ_LABELS.get(label)):
            s.add(CLOCK, v, clock=clock)


def _ras(tree: Tree, files: tuple[str, ...], f: Fields, s: GpuSample) -> None:
    totals: dict[str, float] = {}
    for path in files:
        for line in _text(tree, path).splitlines():
            key, _, value = line.partition(":")
            kind = {"ue": "uncorrected", "ce": "corrected"}.get(key.strip())
            v = f.num(value.strip(), path) if kind else None
            if kind and v is not None:
                totals[kind] = totals.get(kind, 0.0) + v
    for kind, total in totals.items():
        s.add(ERRORS, total, error_type=kind)


def _throttle(tree: Tree, dev: str, f: Fields, s: GpuSample) -> None:
    data = tree.read(f"{dev}/gpu_metrics")
    if not data:
        return
    try:
        table = decode_gpu_metrics(data)
    except ValueError as exc:
        f.problem(f"{dev}/gpu_metrics", str(exc))
        return
    if table.indep_throttle_status is None:
        return  # a layout not decoded here: the other readings go on
    reasons = throttle_reasons(table.indep_throttle_status)
    for reason in THROTTLE_REASONS:
        s.add(THROTTLE, float(reasons[reason]), reason=reason)
