"""AMD GPU partitions in sysfs: each compute partition (XCP) of a partitioned GPU a device of its own.

An Instinct GPU with several XCDs (MI300X: 8, MI300A: 6) can be split into compute partitions: its
PCI device's ``current_compute_partition`` reads ``SPX`` (one), ``DPX``, ``TPX``, ``QPX`` or ``CPX``
(one per XCD), ``current_memory_partition`` ``NPS1``, ``NPS2``, ``NPS4`` (``available_*`` list the
modes it takes; kernel Documentation/gpu/amdgpu, ROCm's "GPU partitioning"). Partition 0 is the PCI
device's own DRM node (``cardN``); the others are DRM nodes of platform devices the driver creates
(``amdgpu_xcp.K``, ``drivers/gpu/drm/amd/amdxcp``): their ``device`` link names ``amdgpu_xcp.K``, and
they carry none of amdgpu's attributes. Which GPU a partition belongs to is what KFD's topology
says: one node per partition (``class/kfd/kfd/topology/nodes/<n>/properties``) with the PCI device's
``domain`` and ``location_id`` (bus << 8 | device << 3 | function; on GC 9.4.3 the driver ORs the
partition's number into the function bits, so partitions read as functions .0 to .7 of the device,
as amd-smi lists them) and the partition's render node (``drm_render_minor``); a GPU's partitions
are its nodes (matched by domain, bus and device) by render minor, the lowest partition 0.

Each partition is a ``GpuSample`` named ``<gpu>/<partition>`` with its parent's index and UUID and
``gpu_instance`` its number, and, where its node has them, its own ``mem_info_vram_used`` /
``mem_info_vram_total`` (partition 0's node is the PCI device's, whose files are the whole GPU's:
they stay the parent's, never copied). Power, temperatures, clocks, utilisation, PCIe and ECC are read once from
the PCI device's files and stay on the parent GPU (docs/shared-gpus.md). In ``SPX`` the driver still
creates the platform nodes, idle: no partition is reported.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Final

from aaco.agent.sources.smi.sysfs_tree import Tree
from aaco.agent.sources.smi.sysfs_tree import text as _text
from aaco.agent.sources.smi.values import Fields
from aaco.contract.telemetry import MEMORY_LIMIT, MEMORY_USAGE, GpuIdentity, GpuSample

KFD_NODES: Final = "class/kfd/kfd/topology/nodes"
MODES: Final = ("SPX", "DPX", "TPX", "QPX", "CPX")
MAX_PARTITIONS: Final = 8


@dataclass(frozen=True, slots=True)
class Partition:
    """One compute partition: who it is and the device directory of its DRM node ("" when not found)."""

    identity: GpuIdentity
    dev: str


def partition_layout(tree: Tree, gpus: list[GpuIdentity], f: Fields) -> list[Partition]:
    """The partitions of the partitioned GPUs among ``gpus`` (AMD PCI devices, by ``pci_bus``)."""
    split: dict[str, GpuIdentity] = {}  # dddd:bb:dd (no function) -> the GPU
    for g in gpus:
        mode = _text(tree, f"class/drm/card{g.index}/device/current_compute_partition").upper()
        if mode and mode not in MODES:
            f.problem(f"class/drm/card{g.index}/device/current_compute_partition", f"unknown mode {mode!r}")
        elif mode and mode != "SPX" and g.pci_bus:
            split[g.pci_bus.rpartition(".")[0]] = g
    if not split:
        return []
    minors: dict[str, list[int]] = {}
    for node in tree.listdir(KFD_NODES):
        props = _properties(tree, f"{KFD_NODES}/{node}/properties")
        minor, loc = props.get("drm_render_minor", 0), props.get("location_id", 0)
        if not minor:  # a CPU node
            continue
        pci = f"{props.get('domain', 0):04x}:{loc >> 8:02x}:{(loc >> 3) & 0x1F:02x}"
        if pci in split:
            minors.setdefault(pci, []).append(minor)
    owner = _devices_by_render_minor(tree)
    out: list[Partition] = []
    for pci, parent in split.items():
        for k, minor in enumerate(sorted(minors.get(pci, []))[:MAX_PARTITIONS]):
            identity = GpuIdentity(
                f"{parent.index}/{k}",
                model=parent.model,
                vendor=parent.vendor,
                parent=parent.index,
                parent_uuid=parent.uuid,
                gpu_instance=str(k),
            )
            dev = owner.get(minor, "")
            own = (
                dev != f"class/drm/card{parent.index}/device"
            )  # partition 0's node is the GPU's: its files are the GPU's
            out.append(Partition(identity, dev if own else ""))
    return out


def read_partitions(tree: Tree, layout: list[Partition], f: Fields) -> list[GpuSample]:
    """Each partition's own readings: its memory where its node has ``mem_info_vram_*``."""
    out = []
    for p in layout:
        s = GpuSample(p.identity)
        if p.dev:
            for name, metric in (("mem_info_vram_used", MEMORY_USAGE), ("mem_info_vram_total", MEMORY_LIMIT)):
                raw = _text(tree, f"{p.dev}/{name}")
                s.add(metric, f.num(raw, f"{p.dev}/{name}") if raw else None)
        out.append(s)
    return out


def _devices_by_render_minor(tree: Tree) -> dict[int, str]:
    """Render minor -> the ``class/drm/cardN/device`` directory of the card on the same device."""
    cards: dict[str, str] = {}
    renders: dict[str, int] = {}
    for name in tree.listdir("class/drm"):
        target = os.path.basename(tree.readlink(f"class/drm/{name}/device") or "") or _pci_slot(tree, name)
        if not target:
            continue
        if name.startswith("card") and name[4:].isdigit():
            cards.setdefault(target, f"class/drm/{name}/device")
        elif name.startswith("renderD") and name[7:].isdigit():
            renders[target] = int(name[7:])
    return {minor: cards[dev] for dev, minor in renders.items() if dev in cards}


def _pci_slot(tree: Tree, name: str) -> str:
    """The PCI address of a DRM node's device from its ``uevent`` (a copy of sysfs without its links)."""
    for line in _text(tree, f"class/drm/{name}/device/uevent").splitlines():
        if line.startswith("PCI_SLOT_NAME="):
            return line.split("=", 1)[1].strip()
    return ""


def _properties(tree: Tree, rel: str) -> dict[str, int]:
    """A KFD ``properties`` file: ``name value`` lines (whole numbers)."""
    out = {}
    for line in _text(tree, rel).splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            out[key] = int(value.strip())
    return out
