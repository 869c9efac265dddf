"""AMD compute partitions in sysfs: a CPX-partitioned MI300X, each partition a device, its power once.

The tree is built here (a ttar archive) from the documented layout, not captured: the PCI device's
DRM node (``card0``) with amdgpu's files, ``current_compute_partition`` CPX,
``available_compute_partition``, ``current_memory_partition`` NPS1; seven more DRM nodes
(``card1``..``card7``, ``renderD129``..``renderD135``) whose ``device`` links name the platform
devices ``amdgpu_xcp.0``..``amdgpu_xcp.6`` the driver creates for partitions (amdxcp; the same
numbering as a listing of a real MI300 node's ``/sys/devices/platform/amdgpu_xcp.*/drm``), carrying
none of amdgpu's attributes; and KFD's topology, one node per partition with the device's domain,
``location_id`` (bus 0x0c << 8, the partition's number in the function bits, as GC 9.4.3 reports it)
and the partition's ``drm_render_minor``, plus a CPU node. One partition node carries
``mem_info_vram_*`` (as an NPS4 partition would): only it gets a memory reading.
"""

from __future__ import annotations

from aaco.agent.sources.smi import ttar
from aaco.agent.sources.smi.sysfs import SysfsReader, read_sysfs
from aaco.agent.sources.smi.sysfs_tree import ArchiveTree
from aaco.agent.sources.smi.tracker import GpuTracker
from aaco.contract import telemetry as m

PCI = "0000:0c:00.0"
GIB = 2**30


def record(path: str, value: str) -> str:
    lines = value.split("\n")
    return f"Path: sys/{path}\nLines: {len(lines)}\n{value}\nMode: 444\n# ttar - - -\n"


def link(path: str, target: str) -> str:
    return f"Path: sys/{path}\nSymlinkTo: {target}\n# ttar - - -\n"


def mi300x(mode: str = "CPX", partitions: int = 8) -> str:
    dev = "class/drm/card0/device"
    parts = [
        record(f"{dev}/vendor", "0x1002"),
        record(f"{dev}/device", "0x74a1"),
        record(f"{dev}/uevent", f"DRIVER=amdgpu\nPCI_SLOT_NAME={PCI}"),
        record(f"{dev}/unique_id", "b3ee8bc6c3a1f2e1"),
        record(f"{dev}/product_name", "AMD Instinct MI300X"),
        record(f"{dev}/current_compute_partition", mode),
        record(f"{dev}/available_compute_partition", "SPX, DPX, QPX, CPX"),
        record(f"{dev}/current_memory_partition", "NPS1"),
        record(f"{dev}/available_memory_partition", "NPS1, NPS4"),
        record(f"{dev}/gpu_busy_percent", "37"),
        record(f"{dev}/mem_info_vram_used", str(40 * GIB)),
        record(f"{dev}/mem_info_vram_total", str(192 * GIB)),
        record(f"{dev}/hwmon/hwmon2/name", "amdgpu"),
        record(f"{dev}/hwmon/hwmon2/power1_average", "412000000"),
        record(f"{dev}/hwmon/hwmon2/temp1_input", "51000"),
        record(f"{dev}/hwmon/hwmon2/temp1_label", "edge"),
        record("class/drm/renderD128/device/uevent", f"DRIVER=amdgpu\nPCI_SLOT_NAME={PCI}"),
    ]
    for k in range(1, 8):  # the driver creates the platform nodes in every mode
        parts.append(link(f"class/drm/card{k}/device", f"../../../amdgpu_xcp.{k - 1}"))
        parts.append(link(f"class/drm/renderD{128 + k}/device", f"../../../amdgpu_xcp.{k - 1}"))
    parts.append(record("class/drm/card3/device/mem_info_vram_used", str(2 * GIB)))
    parts.append(record("class/drm/card3/device/mem_info_vram_total", str(48 * GIB)))
    node = "class/kfd/kfd/topology/nodes"
    parts.append(record(f"{node}/0/properties", "cpu_cores_count 96\nsimd_count 0\ndrm_render_minor 0\ndomain 0"))
    for k in range(partitions):
        props = (
            f"simd_count {304 // partitions * 4}\nlocation_id {(0x0C << 8) | k}\ndomain 0\ndrm_render_minor {128 + k}"
        )
        parts.append(record(f"{node}/{k + 1}/properties", props))
    return "".join(parts)


def tree(text: str) -> ArchiveTree:
    return ArchiveTree(ttar.read(text), "mi300x.ttar")


def test_each_partition_of_a_cpx_mi300x_is_a_device_and_its_power_is_reported_once():
    snap = read_sysfs(tree(mi300x()))
    assert not snap.problems
    gpu, *parts = snap.gpus
    assert gpu.gpu.index == "0" and gpu.gpu.pci_bus == PCI and not gpu.gpu.parent
    assert [p.gpu.index for p in parts] == [f"0/{k}" for k in range(8)]
    for k, p in enumerate(parts):
        g = p.gpu
        assert (g.parent, g.parent_uuid, g.gpu_instance, g.compute_instance) == ("0", "b3ee8bc6c3a1f2e1", str(k), "")
        assert g.model == "AMD Instinct MI300X" and g.vendor == "amd" and g.pci_bus == "" and g.uuid == ""
    # device-wide readings once: on the GPU, from its PCI device's files
    power = [(s.gpu.index, r.value) for s in snap.gpus for r in s.readings if r.metric == m.POWER]
    assert power == [("0", 412.0)]
    assert all(r.metric in (m.MEMORY_USAGE, m.MEMORY_LIMIT) for p in parts for r in p.readings)
    # a partition whose node has mem_info_vram_* has its memory; the others have none of their own
    mem = {p.gpu.index: {r.metric: r.value for r in p.readings} for p in parts if p.readings}
    assert mem == {"0/3": {m.MEMORY_USAGE: 2 * GIB, m.MEMORY_LIMIT: 48 * GIB}}
    # partition 0 is the PCI device's own node: the GPU's memory is the GPU's, not partition 0's
    assert not parts[0].readings


def test_spx_reports_no_partition_and_a_mode_change_is_seen_at_the_next_layout():
    assert [s.gpu.index for s in read_sysfs(tree(mi300x("SPX", 1))).gpus] == ["0"]
    now = [0.0]
    reader = SysfsReader(tree(mi300x("CPX")), refresh_s=60.0, clock=lambda: now[0])
    assert len(reader.sample().gpus) == 9
    reader.tree = tree(mi300x("DPX", 2))
    now[0] = 61.0
    tracker = GpuTracker()
    tracker.update(read_sysfs(tree(mi300x("CPX"))))
    out, lost = tracker.update(reader.sample())
    assert [s.gpu.index for s in out] == ["0", "0/0", "0/1"] and not lost.lost  # 0/2..0/7 forgotten, not down


def test_an_unknown_mode_is_a_problem_and_no_partition():
    snap = read_sysfs(tree(mi300x("XPX")))
    assert [s.gpu.index for s in snap.gpus] == ["0"]
    assert [p.field for p in snap.problems] == ["class/drm/card0/device/current_compute_partition"]
