"""AMD partitions through the AMD SMI library (a double of its partition calls): one GPU, its partitions as devices.

The double adds to ``fake_amdsmi`` what the library has for partitions:
``amdsmi_get_gpu_compute_partition`` (the mode as a string) and ``amdsmi_get_gpu_kfd_info``
(``kfd_id``, ``node_id``, ``current_partition_id``); each partition is a handle of its own whose
BDF carries the partition's number in its function bits, answering the whole GPU's power.
"""

from __future__ import annotations

from aaco.agent.sources.smi.amdsmi_lib import AmdSmiReader
from aaco.contract import telemetry as m

from .smi_fakes import FakeAmdGpu, fake_amdsmi

GIB = 2**30


def with_partitions(gpus: list[FakeAmdGpu], mode: str, kfd: bool | None = True):
    """``kfd`` True: the partition id; None: 0xFFFFFFFF (not supported); False: no amdsmi_get_gpu_kfd_info."""
    mod = fake_amdsmi(gpus)
    mod.amdsmi_get_gpu_compute_partition = lambda h: mode
    if kfd is not False:
        mod.amdsmi_get_gpu_kfd_info = lambda h: {
            "kfd_id": 1000 + gpus.index(h),
            "node_id": 2 + gpus.index(h),
            "current_partition_id": int(h.bdf[-1]) if kfd else 0xFFFFFFFF,
        }
    return mod


def cpx(nps4: bool = False) -> list[FakeAmdGpu]:
    vram = (3 * GIB, 48 * GIB) if nps4 else (100 * GIB, 192 * GIB)
    first = FakeAmdGpu(uuid="GPU-0", bdf="0000:0c:00.0", vram=(100 * GIB, 192 * GIB))
    rest = [FakeAmdGpu(uuid=f"GPU-0-{k}", bdf=f"0000:0c:00.{k}", vram=vram) for k in range(1, 8)]
    other = FakeAmdGpu(uuid="GPU-1", bdf="0000:1d:00.0")
    return [rest[2], first, *rest[:2], *rest[3:], other]  # the library's order need not be the partitions'


def test_a_cpx_mi300x_is_one_gpu_with_eight_partitions_and_its_power_once():
    gpus = cpx()
    for kfd in (True, None, False):  # current_partition_id, else the BDF's function number
        snap = AmdSmiReader(with_partitions(gpus, "CPX", kfd)).sample()
        idx = [s.gpu.index for s in snap.gpus]
        assert idx == ["1", *(f"1/{k}" for k in range(8)), "8"]
        power = [s.gpu.index for s in snap.gpus for r in s.readings if r.metric == m.POWER]
        assert power == ["1", "8"]  # once per GPU, not per partition
        parts = [s for s in snap.gpus if s.gpu.parent]
        assert {(p.gpu.parent, p.gpu.parent_uuid) for p in parts} == {("1", "GPU-0")}
        assert [p.gpu.gpu_instance for p in parts] == [str(k) for k in range(8)]
        assert all(not p.readings for p in parts)  # NPS1: every partition reports the GPU's whole memory


def test_nps4_partitions_have_their_own_memory_and_spx_is_unchanged():
    snap = AmdSmiReader(with_partitions(cpx(nps4=True), "CPX")).sample()
    by = {s.gpu.index: s for s in snap.gpus}
    assert {(r.metric, r.value) for r in by["1/3"].readings} == {(m.MEMORY_USAGE, 3 * GIB), (m.MEMORY_LIMIT, 48 * GIB)}
    assert not by["1/0"].readings  # partition 0's handle is the GPU's: its memory is the GPU's
    gpus = [FakeAmdGpu(uuid="a", bdf="0000:0c:00.0"), FakeAmdGpu(uuid="b", bdf="0000:1d:00.0")]
    assert [s.gpu.index for s in AmdSmiReader(with_partitions(gpus, "SPX")).sample().gpus] == ["0", "1"]
    assert [s.gpu.index for s in AmdSmiReader(fake_amdsmi(gpus)).sample().gpus] == ["0", "1"]  # no partition API
