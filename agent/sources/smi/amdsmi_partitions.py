"""AMD compute partitions through the AMD SMI library: one device per GPU, its partitions named as such.

In a partitioned mode (``amdsmi_get_gpu_compute_partition``: ``DPX``, ``TPX``, ``QPX``, ``CPX``) the
library gives one processor handle per partition, each answering the whole GPU's power,
temperatures and clocks: read as GPUs, a CPX MI300X would count its power eight times. The
partitions of one GPU share its PCI domain, bus and device (the driver puts the partition's number
in the function bits: ``0000:0c:00.3``); ``amdsmi_get_gpu_kfd_info``'s ``current_partition_id``
names the partition where the library has it, else the function number does. The partition 0
handle's sample stays the GPU (every reading); each partition becomes a device
``<gpu>/<partition>`` (``contract.telemetry.GpuIdentity``: its parent's index and UUID,
``gpu_instance`` its number) carrying only its own memory, and that only where its VRAM total is
less than the GPU's (its own memory partition, NPS2/NPS4; in NPS1 every partition reports the whole
memory, the GPU's). A GPU with one handle is not split, whatever its mode says.
``amdsmi_get_gpu_memory_partition`` is not needed for that and not read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from aaco.contract.telemetry import MEMORY_LIMIT, MEMORY_USAGE, GpuIdentity, GpuSample

MODES: Final = ("DPX", "TPX", "QPX", "CPX")
MAX_PARTITIONS: Final = 8


def fold_partitions(lib: Any, q: Callable[..., Any], read: list[tuple[GpuSample, Any]]) -> list[GpuSample]:
    """The samples of ``read`` (sample, handle) with each partitioned GPU's partitions as its logical devices.

    ``q(fn, *args)`` calls the library as the reader does (None for what it cannot answer).
    """
    get_mode = getattr(lib, "amdsmi_get_gpu_compute_partition", None)
    if get_mode is None:
        return [s for s, _ in read]
    groups: dict[str, list[tuple[int, GpuSample]]] = {}
    order: list[str | GpuSample] = []
    for s, h in read:
        mode = str(q(get_mode, h) or "").upper()
        bdf = s.gpu.pci_bus
        if mode not in MODES or not bdf:
            order.append(s)
            continue
        key = bdf.rpartition(".")[0]
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append((_partition_id(lib, q, h, bdf), s))
    out: list[GpuSample] = []
    for item in order:
        if isinstance(item, GpuSample):
            out.append(item)
            continue
        members = sorted(groups[item], key=lambda m: m[0])
        gpu = members[0][1]
        out.append(gpu)
        if len(members) == 1:  # one handle: nothing split, whatever the mode says
            continue
        total = _value(gpu, MEMORY_LIMIT)
        for k, s in members:
            part = GpuSample(
                GpuIdentity(
                    f"{gpu.gpu.index}/{k}",
                    model=gpu.gpu.model,
                    vendor=gpu.gpu.vendor,
                    parent=gpu.gpu.index,
                    parent_uuid=gpu.gpu.uuid,
                    gpu_instance=str(k),
                )
            )
            own = _value(s, MEMORY_LIMIT)
            if s is not gpu and own is not None and total is not None and own < total:
                part.add(MEMORY_USAGE, _value(s, MEMORY_USAGE))
                part.add(MEMORY_LIMIT, own)
            out.append(part)
    return out


def _partition_id(lib: Any, q: Callable[..., Any], h: Any, bdf: str) -> int:
    """``current_partition_id`` of ``amdsmi_get_gpu_kfd_info``, else the BDF's function number."""
    kfd = getattr(lib, "amdsmi_get_gpu_kfd_info", None)
    info = q(kfd, h) if kfd is not None else None
    pid = info.get("current_partition_id") if isinstance(info, dict) else None
    if (isinstance(pid, int) or (isinstance(pid, str) and pid.isdigit())) and int(pid) < MAX_PARTITIONS:
        return int(pid)  # 0xFFFFFFFF (or "N/A"): not supported
    fn = bdf.rpartition(".")[2]
    return int(fn) if fn.isdigit() else 0


def _value(s: GpuSample, metric: str) -> float | None:
    return next((r.value for r in s.readings if r.metric == metric and not r.attrs), None)
