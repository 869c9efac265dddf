"""NVML's health readings (agent/sources/smi/nvml_health.py) on the nvidia-ml-py double: what, how often."""

from __future__ import annotations

from aaco.agent.sources.smi.nvml import NvmlReader
from aaco.agent.sources.smi.nvml_health import EVERY
from aaco.contract import telemetry as m
from aaco.contract.health import HealthJudge

from .smi_fakes import FakeGpu, fake_nvml
from .smi_fakes_health import FakeHealth, with_health

HEALTH = {m.ECC_CORRECTED, m.ECC_UNCORRECTED, m.RETIRED_PAGES, m.RETIRED_PAGES_PENDING, m.REMAPPED_ROWS}
HEALTH |= {m.ROW_REMAP_PENDING, m.ROW_REMAP_FAILURE, m.PCIE_REPLAYS, m.NVLINK_ERRORS}


def health_of(snap, gpu: int = 0) -> dict:
    return {(r.metric, r.attrs): r.value for r in snap.gpus[gpu].readings if r.metric in HEALTH}


def test_every_health_reading_of_an_h100():
    faulty = FakeHealth(
        volatile={(1, 2): 2, (0, 2): 7, (0, 7): 1},
        retired={0: 3, 1: 1},
        retired_pending=1,
        remapped=(5, 1, 1, 0),
        replays=12,
        links={0: {2: 4, 0: 1}, 3: {2: 1}},
    )
    nvml = with_health(fake_nvml([FakeGpu()]), [faulty])
    got = health_of(NvmlReader(nvml).sample())
    assert got[(m.ECC_UNCORRECTED, (("block", "dram"),))] == 2
    assert got[(m.ECC_CORRECTED, (("block", "dram"),))] == 7 and got[(m.ECC_CORRECTED, (("block", "sram"),))] == 1
    assert got[(m.RETIRED_PAGES, (("cause", "single_bit"),))] == 3 and got[(m.RETIRED_PAGES_PENDING, ())] == 1
    assert got[(m.REMAPPED_ROWS, (("cause", "correctable"),))] == 5 and got[(m.ROW_REMAP_PENDING, ())] == 1
    assert got[(m.ROW_REMAP_FAILURE, ())] == 0 and got[(m.PCIE_REPLAYS, ())] == 12
    assert got[(m.NVLINK_ERRORS, (("error.type", "crc_flit"),))] == 5  # links 0 and 3, summed
    assert got[(m.NVLINK_ERRORS, (("error.type", "replay"),))] == 1
    judge = HealthJudge()
    judge.observe(0, NvmlReader(nvml).sample().gpus[0])
    codes = [r.code for r in judge.verdict("0", 0).reasons]
    assert codes == ["ecc_uncorrected", "row_remap_pending", "retired_pages_pending"]


def test_read_on_the_first_sample_and_every_tenth():
    nvml = with_health(fake_nvml([FakeGpu()]), [FakeHealth()])
    reader = NvmlReader(nvml)
    read = [bool(health_of(reader.sample())) for _ in range(2 * EVERY + 1)]
    assert read == [i % EVERY == 0 for i in range(2 * EVERY + 1)]
    # which links are up is read once per board, not every time
    assert nvml.calls.count("nvmlDeviceGetNvLinkState") == 18


def test_unsupported_queries_leave_their_readings_out_without_problems():
    gpu = FakeHealth(remapped=None, unsupported={"nvmlDeviceGetRetiredPages", "nvmlDeviceGetPcieReplayCounter"})
    snap = NvmlReader(with_health(fake_nvml([FakeGpu()]), [gpu])).sample()
    got = {metric for metric, _ in health_of(snap)}
    assert snap.problems == [] and got == {m.ECC_CORRECTED, m.ECC_UNCORRECTED, m.RETIRED_PAGES_PENDING}


def test_a_binding_without_the_health_queries_reads_as_before():
    snap = NvmlReader(fake_nvml([FakeGpu()])).sample()
    assert snap.problems == [] and health_of(snap) == {}
