"""nvidia-smi's health sections on the real captures (agent/sources/smi/nvidia_smi_health.py), and copies of them."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from aaco.agent.sources.smi.nvidia_smi import parse_nvidia_smi
from aaco.contract import telemetry as m
from aaco.contract.health import HealthJudge
from tests.conftest import ROOT
from tests.support.nvidia_health_captures import A100, H100, T4, with_field

CAPTURES = sorted((ROOT / "tests" / "data" / "nvidia-smi").glob("*.xml*")) + sorted(
    (ROOT / "examples" / "data" / "nvidia-smi").glob("*.xml*")
)
HEALTH = {
    m.ECC_CORRECTED,
    m.ECC_UNCORRECTED,
    m.RETIRED_PAGES,
    m.RETIRED_PAGES_PENDING,
    m.REMAPPED_ROWS,
    m.ROW_REMAP_PENDING,
    m.ROW_REMAP_FAILURE,
    m.PCIE_REPLAYS,
}


def readings(path: Path) -> dict[tuple[str, tuple], float]:
    data = path.read_bytes()
    snap = parse_nvidia_smi(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data, str(path))
    assert snap.problems == []
    return {(r.metric, r.attrs): r.value for r in snap.gpus[0].readings if r.metric in HEALTH}


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.name)
def test_every_real_capture_reads_without_problems_and_is_healthy(path):
    data = path.read_bytes()
    snap = parse_nvidia_smi(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data, str(path))
    assert snap.problems == []
    judge = HealthJudge()
    for gpu in snap.gpus:
        judge.observe(0, gpu)
    assert {v.status for v in judge.verdicts(0)} <= {"healthy", "unknown"}


def test_schema_11_and_later_by_location():
    got = readings(H100)
    assert got[(m.ECC_UNCORRECTED, (("block", "dram"),))] == 0
    assert got[(m.ECC_CORRECTED, (("block", "sram"),))] == 0
    assert got[(m.REMAPPED_ROWS, (("cause", "uncorrectable"),))] == 0
    assert got[(m.ROW_REMAP_FAILURE, ())] == 0 and got[(m.PCIE_REPLAYS, ())] == 0


def test_parity_and_secded_are_summed(tmp_path):
    """v13 splits SRAM uncorrectable into parity and SEC-DED: both count."""
    one = with_field(H100, tmp_path / "a.xml", "ecc_errors/volatile/sram_uncorrectable_parity", "2")
    two = with_field(one, tmp_path / "b.xml", "ecc_errors/volatile/sram_uncorrectable_secded", "3")
    assert readings(two)[(m.ECC_UNCORRECTED, (("block", "sram"),))] == 5


def test_older_schemas_by_unit(tmp_path):
    """single_bit/double_bit per unit: device memory is the DRAM, the register file and caches SRAM."""
    src = ROOT / "tests" / "data" / "nvidia-smi" / "gt-1030.xml"
    p = with_field(src, tmp_path / "a.xml", "ecc_errors/volatile/double_bit/device_memory", "4")
    p = with_field(p, tmp_path / "b.xml", "ecc_errors/volatile/double_bit/l2_cache", "1")
    p = with_field(p, tmp_path / "c.xml", "ecc_errors/volatile/double_bit/total", "5")
    got = readings(p)
    assert got[(m.ECC_UNCORRECTED, (("block", "dram"),))] == 4
    assert got[(m.ECC_UNCORRECTED, (("block", "sram"),))] == 1  # total is not counted again


def test_retired_pages_and_their_pending_flag(tmp_path):
    got = readings(T4)
    assert got[(m.RETIRED_PAGES, (("cause", "single_bit"),))] == 0 and got[(m.RETIRED_PAGES_PENDING, ())] == 0
    p = with_field(T4, tmp_path / "a.xml", "retired_pages/pending_retirement", "Yes")
    p = with_field(p, tmp_path / "b.xml", "retired_pages/double_bit_retirement/retired_count", "16")
    got = readings(p)
    assert got[(m.RETIRED_PAGES_PENDING, ())] == 1 and got[(m.RETIRED_PAGES, (("cause", "double_bit"),))] == 16


def test_not_applicable_is_left_out():
    """The A100 in MIG mode reads remapped_rows N/A, retired pages N/A: no reading, no problem."""
    got = readings(A100)
    assert not any(metric in (m.REMAPPED_ROWS, m.RETIRED_PAGES, m.ROW_REMAP_FAILURE) for metric, _ in got)


def test_a_bad_flag_or_count_is_a_problem_and_the_rest_stays(tmp_path):
    p = with_field(H100, tmp_path / "a.xml", "remapped_rows/remapped_row_pending", "Maybe")
    p = with_field(p, tmp_path / "b.xml", "pci/replay_counter", "lots")
    snap = parse_nvidia_smi(p.read_bytes(), str(p))
    fields = sorted(pr.field.split("/", 1)[1] for pr in snap.problems)
    assert fields == ["pci/replay_counter", "remapped_rows/remapped_row_pending"]
    kept = {r.metric for r in snap.gpus[0].readings}
    assert m.ROW_REMAP_FAILURE in kept and m.ECC_UNCORRECTED in kept and m.POWER in kept
