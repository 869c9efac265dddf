"""amdgpu's sysfs files, read directly: no tool, no library, works in any container that mounts /sys.

Per ``class/drm/cardN/device`` (N a number; connectors like ``card0-DP-1`` are skipped) of an AMD
GPU (``vendor`` 0x1002, or the ``driver`` link names amdgpu):

- ``gpu_busy_percent`` / ``mem_busy_percent`` -> utilisation ratios;
- ``mem_info_vram_used`` / ``mem_info_vram_total`` (bytes);
- ``pp_dpm_sclk`` / ``pp_dpm_mclk`` / ``pp_dpm_socclk`` / ``pp_dpm_fclk`` (``0: 852Mhz *``): the level
  marked ``*`` is the current clock (and the domain's DPM level), the highest level the maximum; a
  measured ``hwmon/hwmonM/freqK_input`` wins over the DPM level's clock when present;
- ``hwmon/hwmonM/*``: power, power cap, temperatures, fans, voltages (``sysfs_hwmon``);
- ``current_link_speed`` (``8.0 GT/s PCIe``) / ``current_link_width`` -> the PCIe link's generation
  and width (the GPU's own link: behind the board's internal switch on some dGPUs);
- ``ras/<block>_err_count`` (``ue: N`` / ``ce: N``) -> ECC error counts per RAS block and summed,
  ``ras/gpu_vram_bad_pages`` -> retired and pending pages, ``pcie_replay_count`` -> PCIe replays
  (``sysfs_health``);
- ``gpu_metrics`` -> throttle reasons where its layout is known (``gpu_metrics``);
- ``current_compute_partition`` other than SPX: each compute partition is also a device of its own,
  with its parent named and its own memory where its node has it (``sysfs_partitions``); the GPU's
  readings stay on the GPU.

The model is ``product_name``, else the marketing name of ``device`` / ``revision`` in libdrm's
table (``amdgpu_ids``), else ``amdgpu <device id>``. Zeros that cannot be readings are left out
(``placeholders``).

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

import functools
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from aaco.agent.sources.smi.amdgpu_ids import marketing_name
from aaco.agent.sources.smi.gpu_metrics import decode as decode_gpu_metrics
from aaco.agent.sources.smi.gpu_metrics import throttle_reasons
from aaco.agent.sources.smi.placeholders import drop_placeholders
from aaco.agent.sources.smi.sysfs_health import PCIE_REPLAY_COUNT, ras_files, read_health
from aaco.agent.sources.smi.sysfs_hwmon import HwmonFile, hwmon_layout, read_hwmon
from aaco.agent.sources.smi.sysfs_partitions import Partition, partition_layout, read_partitions
from aaco.agent.sources.smi.sysfs_tree import DeviceGoneError, Tree
from aaco.agent.sources.smi.sysfs_tree import text as _text
from aaco.agent.sources.smi.values import Fields, pcie_generation
from aaco.contract.telemetry import (
    CLOCK,
    CLOCK_MAX,
    DPM_LEVEL,
    MEMORY_LIMIT,
    MEMORY_USAGE,
    MEMORY_UTILIZATION,
    PCIE_LINK_GENERATION,
    PCIE_LINK_WIDTH,
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
_READINGS: Final = (
    "gpu_busy_percent",
    "mem_busy_percent",
    "mem_info_vram_used",
    "mem_info_vram_total",
    "current_link_speed",
    "current_link_width",
)
_HZ: Final[dict[str, float]] = {"hz": 1.0, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}
LAYOUT_REFRESH_S: Final = 60.0


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


def read_sysfs(tree: Tree) -> Snapshot:
    """One sample of every AMD GPU in the tree (a GPU whose files fail with a device error is left out)."""
    f = Fields(tree.name)
    snap = Snapshot(FORMAT)
    for card in amd_cards(tree):
        try:
            snap.gpus.append(read_card(tree, card, f))
        except DeviceGoneError as exc:
            f.problem(f"class/drm/{card}", f"device error: {exc}")
    _add_partitions(tree, snap, partition_layout(tree, [s.gpu for s in snap.gpus], f), f)
    snap.problems = f.problems
    return snap


def _add_partitions(tree: Tree, snap: Snapshot, layout: list[Partition], f: Fields) -> bool:
    """The partitions of the GPUs read in this sample; False when a partition's files failed."""
    present = {s.gpu.index for s in snap.gpus}
    try:
        snap.gpus += read_partitions(tree, [p for p in layout if p.identity.parent in present], f)
    except DeviceGoneError as exc:
        f.problem("partitions", f"device error: {exc}")
        return False
    return True


def read_card(tree: Tree, card: str, f: Fields) -> GpuSample:
    """Readings of one ``cardN``."""
    return read_readings(tree, card_layout(tree, card), f)


@dataclass(frozen=True, slots=True)
class CardLayout:
    """What stays the same while a card stays: who it is and which of its files hold readings.

    ``hwmon`` lists, in reading order, ``(kind, path, label)`` (``sysfs_hwmon``); ``ras`` the
    ``ras/*_err_count`` files, ``bad_pages`` the ``ras/gpu_vram_bad_pages`` file (None: absent).
    """

    dev: str
    identity: GpuIdentity
    hwmon: tuple[HwmonFile, ...]
    ras: tuple[str, ...]
    bad_pages: str | None = None

    def files(self) -> list[str]:
        """The files every sample reads and may keep open (the bad pages are read to their end, opened each time)."""
        dev = self.dev
        own = [f"{dev}/{name}" for name in (*_READINGS, PCIE_REPLAY_COUNT)] + [f"{dev}/{name}" for name, _ in _DPM]
        return [*own, *(path for _, path, _ in self.hwmon), *self.ras, f"{dev}/gpu_metrics"]


def card_layout(tree: Tree, card: str) -> CardLayout:
    """Find a card's identity and the files that hold its readings."""
    dev = f"class/drm/{card}/device"
    uevent = dict(line.split("=", 1) for line in _text(tree, f"{dev}/uevent").splitlines() if "=" in line)
    device = _text(tree, f"{dev}/device")
    model = (
        _text(tree, f"{dev}/product_name")
        or marketing_name(device, _text(tree, f"{dev}/revision"))
        or f"amdgpu {device or 'unknown'}"
    )
    identity = GpuIdentity(
        _CARD.match(card).group(1),
        uuid=_text(tree, f"{dev}/unique_id"),
        pci_bus=normalize_pci(uevent.get("PCI_SLOT_NAME", "")),
        model=model,
        vendor="amd",
    )
    ras, bad_pages = ras_files(tree, dev)
    return CardLayout(dev, identity, tuple(hwmon_layout(tree, dev)), ras, bad_pages)


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
    rate = num(_READINGS[4])
    s.add(PCIE_LINK_GENERATION, None if rate is None else pcie_generation(rate))
    s.add(PCIE_LINK_WIDTH, num(_READINGS[5]))
    read_hwmon(tree, layout.hwmon, f, s)
    for fname, clock in _DPM:
        level, current, top = _dpm_levels(_text(tree, f"{dev}/{fname}"), f"{dev}/{fname}", f)
        if current is not None and not s.has(CLOCK, clock=clock):
            s.add(CLOCK, current, clock=clock)
        s.add(CLOCK_MAX, top, clock=clock)
        s.add(DPM_LEVEL, level, clock=clock)
    read_health(tree, dev, layout.ras, layout.bad_pages, f, s)
    _throttle(tree, dev, f, s)
    drop_placeholders(s)
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
        self._partitions: list[Partition] | None = None  # found again with the layouts
        self._found_at = clock()

    def sample(self) -> Snapshot:
        """One sample of every AMD GPU in the tree, as ``read_sysfs`` gives it."""
        tree = self.tree
        if self._clock() - self._found_at >= self.refresh_s:
            self._layouts.clear()
            self._partitions = None
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
                    self._partitions = None
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
        if self._partitions is None:
            self._partitions = partition_layout(tree, [s.gpu for s in snap.gpus], f)
        if not _add_partitions(tree, snap, self._partitions, f):
            self._partitions = None
        snap.problems = f.problems
        return snap

    def _drop(self, card: str) -> None:
        self._partitions = None
        self._layouts.pop(card, None)
        self.tree.forget(f"class/drm/{card}/")

    def close(self) -> None:
        """Close the files kept open."""
        self._layouts.clear()
        self.tree.forget("")


def _dpm_levels(text: str, path: str, f: Fields) -> tuple[float | None, float | None, float | None]:
    """(current level's index, its clock, the highest level's clock) of a ``pp_dpm_*`` table, in Hz."""
    level, current, top, bad = _parse_dpm(text)
    for line in bad:
        f.problem(path, f"not a DPM level line: {line!r}")
    return level, current, top


@functools.lru_cache(maxsize=256)
def _parse_dpm(text: str) -> tuple[float | None, float | None, float | None, tuple[str, ...]]:
    """(current index, current clock, highest clock, lines that are not levels) of a DPM table.

    Cached: the tables repeat sample after sample.
    """
    level = current = top = None
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
            level, current = float(m.group(1)), hz
    return level, current, top, tuple(bad)


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
