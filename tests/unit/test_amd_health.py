"""AMD health readings (docs/health.md): ECC per RAS block, retired and pending pages, PCIe replays.

Every real AMD capture the project carries still reads without a problem and with no uncorrected
ECC error; copies of the real sysfs capture (``tests/support/health_captures``) and of the real
amd-smi and rocm-smi captures with health values set read exactly those values, and values of the
wrong shape are problems naming the file and field while the rest is kept. The amdsmi library
backend is checked against the library double with its health calls.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

from aaco.agent.sources.smi import sysfs_health, ttar
from aaco.agent.sources.smi.amd_smi import parse_amd_smi
from aaco.agent.sources.smi.backends import ROCM_SMI_ARGS, BackendOptions, open_backend
from aaco.agent.sources.smi.capture import read_capture
from aaco.agent.sources.smi.rocm_smi import parse_rocm_smi
from aaco.agent.sources.smi.sysfs import SysfsReader, read_sysfs
from aaco.agent.sources.smi.sysfs_tree import DirTree
from aaco.contract.telemetry import (
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    ERRORS,
    PCIE_REPLAYS,
    RETIRED_PAGES,
    RETIRED_PAGES_PENDING,
    Snapshot,
)
from tests.conftest import ROOT, SAMPLES
from tests.support.health_captures import AMD_SYSFS, DEVICE, amd_sysfs_with, amd_sysfs_with_ecc, bad_pages

from .amdsmi_health_fakes import NOT_SUPPORTED, PENDING, RESERVED, UNRESERVABLE, FakeAmdHealth, fake_amdsmi_health
from .smi_fakes import AmdSmiLibraryException, FakeAmdGpu

AMD_CAPTURES = sorted(
    [
        *(SAMPLES / "amd-smi").glob("*"),
        *(SAMPLES / "rocm-smi").glob("*"),
        *(SAMPLES / "sysfs").glob("*"),
        *(ROOT / "tests" / "data" / "rocm-smi").glob("*.json"),
    ],
    key=lambda p: p.name,
)
HEALTH = (ECC_CORRECTED, ECC_UNCORRECTED, RETIRED_PAGES, RETIRED_PAGES_PENDING, PCIE_REPLAYS)
UMC = f"{DEVICE.removeprefix('fixtures/sys/')}/ras/umc_err_count"
BAD_PAGES = f"{DEVICE.removeprefix('fixtures/sys/')}/ras/gpu_vram_bad_pages"
REPLAYS = f"{DEVICE.removeprefix('fixtures/sys/')}/pcie_replay_count"


def health(snap: Snapshot, gpu: str = "0") -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(metric, attributes) -> value of the health readings (and the ECC totals) of GPU ``gpu``."""
    sample = next(s for s in snap.gpus if s.gpu.index == gpu)
    return {(r.metric, r.attrs): r.value for r in sample.readings if r.metric in (*HEALTH, ERRORS)}


def unpacked(capture: Path, dest: Path) -> Path:
    """A ttar capture unpacked below ``dest``; the directory that holds ``class/drm``."""
    ttar.unpack(ttar.read(capture.read_text()), dest)
    return dest / "fixtures" / "sys"


# -- the real captures -----------------------------------------------------------------------------


def test_every_amd_capture_is_here():
    assert [p.name for p in AMD_CAPTURES] == [
        "amd-smi-metric.json",
        "amdgpu_card0.ttar",
        "mi100_rocm571.json",
        "mi100_rocm602.json",
        "rx6700xt_rocm430.json",
        "rx6700xt_rocm571.json",
        "rx6700xt_rocm602.json",
        "rx6700xt_rocm612.json",
        "vega-10-XT.json",
        "vega-20-WKS-GL-XE.json",
    ]


@pytest.mark.parametrize("path", AMD_CAPTURES, ids=lambda p: p.name)
def test_real_captures_read_without_problems_and_without_uncorrected_ecc(path: Path):
    snap = read_capture(path)
    assert snap.gpus and snap.problems == []
    for s in snap.gpus:
        uncorrected = [r.value for r in s.readings if r.metric == ECC_UNCORRECTED]
        totals = [r.value for r in s.readings if r.metric == ERRORS and r.attrs == (("error.type", "uncorrected"),)]
        assert set(uncorrected + totals) <= {0.0}, (path.name, s.gpu.index)


def test_what_the_real_captures_hold():
    """amd-smi: UMC's ECC (0, 0), no replay count (N/A); rocm-smi: PCIe Replay Count 0; sysfs: pcie_replay_count 0."""
    amd = read_capture(SAMPLES / "amd-smi" / "amd-smi-metric.json")
    assert health(amd) == {
        (ECC_CORRECTED, (("block", "umc"),)): 0.0,
        (ECC_UNCORRECTED, (("block", "umc"),)): 0.0,
        (ERRORS, (("error.type", "corrected"),)): 0.0,
        (ERRORS, (("error.type", "uncorrected"),)): 0.0,
    }
    rocm = read_capture(SAMPLES / "rocm-smi" / "mi100_rocm602.json")
    assert [health(rocm, s.gpu.index) for s in rocm.gpus] == [{(PCIE_REPLAYS, ()): 0.0}] * 4
    sysfs = read_capture(SAMPLES / "sysfs" / "amdgpu_card0.ttar")  # a Vega 10 without RAS files
    assert health(sysfs) == {(PCIE_REPLAYS, ()): 0.0}


def test_the_rocm_smi_command_asks_for_the_replay_count():
    assert "--showreplaycount" in ROCM_SMI_ARGS


# -- sysfs -----------------------------------------------------------------------------------------

ECC_FILES = {
    "ras/umc_err_count": "ue: 3\nce: 7\n",
    "ras/gpu_vram_bad_pages": bad_pages(2, 1),
    "pcie_replay_count": "5\n",
}
ECC_COPY = {
    (ECC_UNCORRECTED, (("block", "umc"),)): 3.0,
    (ECC_CORRECTED, (("block", "umc"),)): 7.0,
    (ERRORS, (("error.type", "uncorrected"),)): 3.0,
    (ERRORS, (("error.type", "corrected"),)): 7.0,
    (RETIRED_PAGES, (("cause", "ecc"),)): 2.0,
    (RETIRED_PAGES_PENDING, ()): 1.0,
    (PCIE_REPLAYS, ()): 5.0,
}


def test_the_copies_differ_from_the_real_capture_only_in_the_files_set(tmp_path: Path):
    original = AMD_SYSFS.read_text()
    assert amd_sysfs_with(tmp_path, {}, "same.ttar").read_text() == original
    changed = amd_sysfs_with(tmp_path, {"pcie_replay_count": "5\n"}, "replays.ttar").read_text().split("\n")
    diff = [(i, a, b) for i, (a, b) in enumerate(zip(original.split("\n"), changed, strict=True)) if a != b]
    assert [(a, b) for _, a, b in diff] == [("0", "5")]
    archive = ttar.read(amd_sysfs_with_ecc(tmp_path).read_text())
    assert archive.files[f"{DEVICE}/ras/gpu_vram_bad_pages"] == (
        b"0x00000001 : 0x00001000 : R\n0x00000002 : 0x00001000 : R\n0x00000003 : 0x00001000 : P\n"
    )


def test_sysfs_copy_with_ecc_bad_pages_and_replays(tmp_path: Path):
    capture = amd_sysfs_with_ecc(tmp_path)  # umc ue 3, ce 7; two R pages, one P; 5 replays
    snap = read_capture(capture)
    assert snap.problems == []
    assert health(snap) == ECC_COPY
    tree = DirTree(unpacked(capture, tmp_path / "tree"), max_open=64)
    assert health(read_sysfs(tree)) == ECC_COPY
    reader = SysfsReader(tree)
    assert reader.sample() == read_sysfs(tree)
    reader.close()


def test_sysfs_blocks_and_their_totals_each_file_counted_once(tmp_path: Path):
    capture = amd_sysfs_with(
        tmp_path,
        {
            "ras/umc_err_count": "ue: 3\nce: 7\nde: 2\n",  # newer kernels' deferred errors: not read
            "ras/gfx_err_count": "ue: 1\nce: 0\n",
            "ras/xgmi_wafl_err_count": "ue: 0\nce: 4\n",
            "ras/features": "feature mask: 0x3fbf\n",
        },
    )
    snap = read_capture(capture)
    assert snap.problems == []
    assert health(snap) == {
        (ECC_UNCORRECTED, (("block", "umc"),)): 3.0,
        (ECC_CORRECTED, (("block", "umc"),)): 7.0,
        (ECC_UNCORRECTED, (("block", "gfx"),)): 1.0,
        (ECC_CORRECTED, (("block", "gfx"),)): 0.0,
        (ECC_UNCORRECTED, (("block", "xgmi_wafl"),)): 0.0,
        (ECC_CORRECTED, (("block", "xgmi_wafl"),)): 4.0,
        (ERRORS, (("error.type", "uncorrected"),)): 4.0,
        (ERRORS, (("error.type", "corrected"),)): 11.0,
        (PCIE_REPLAYS, ()): 0.0,
    }


def test_sysfs_failed_pages_are_retired_pages(tmp_path: Path):
    """F: a bad page recorded in the RAS table that the driver could not reserve: it counts as retired."""
    snap = read_capture(amd_sysfs_with_ecc(tmp_path, 0, 0, retired=1, pending=0, failed=2, replays=0))
    assert health(snap)[(RETIRED_PAGES, (("cause", "ecc"),))] == 3.0
    assert health(snap)[(RETIRED_PAGES_PENDING, ())] == 0.0
    empty = read_capture(amd_sysfs_with(tmp_path, {"ras/gpu_vram_bad_pages": ""}, "empty.ttar"))
    assert {k: v for k, v in health(empty).items() if k[0] != PCIE_REPLAYS} == {
        (RETIRED_PAGES, (("cause", "ecc"),)): 0.0,
        (RETIRED_PAGES_PENDING, ()): 0.0,
    }


UMC_CE = (ECC_CORRECTED, (("block", "umc"),))
UMC_UE = (ECC_UNCORRECTED, (("block", "umc"),))
PAGES = {(RETIRED_PAGES, (("cause", "ecc"),)): 2.0, (RETIRED_PAGES_PENDING, ()): 1.0}


@pytest.mark.parametrize(
    ("files", "problems", "kept", "absent"),
    [
        (
            {"ras/umc_err_count": "ue: x\nce: 7\n"},
            [(UMC, "ue: expected a count, got 'x'")],
            {UMC_CE: 7.0, **PAGES, (PCIE_REPLAYS, ()): 5.0},
            [UMC_UE],
        ),
        (
            {"ras/umc_err_count": "ue: -1\nce: 2.5\n"},
            [(UMC, "ue: expected a count, got '-1'"), (UMC, "ce: expected a count, got '2.5'")],
            {**PAGES, (PCIE_REPLAYS, ()): 5.0},
            [UMC_UE, UMC_CE, (ERRORS, (("error.type", "corrected"),))],
        ),
        (
            {"ras/umc_err_count": "garbage\nce: 7\n"},
            [(UMC, "expected 'ue: N' or 'ce: N', got 'garbage'")],
            {UMC_CE: 7.0, **PAGES, (PCIE_REPLAYS, ()): 5.0},
            [UMC_UE],
        ),
        (
            {"ras/gpu_vram_bad_pages": bad_pages(2, 1) + "0x00000009 : 0x00001000 : X\nnot a page\n"},
            [(BAD_PAGES, "2 line(s) not 'page : size : R|P|F' (not counted); line 4: '0x00000009 : 0x00001000 : X'")],
            {UMC_UE: 3.0, UMC_CE: 7.0, **PAGES, (PCIE_REPLAYS, ()): 5.0},
            [],
        ),
        (
            {"pcie_replay_count": "lots\n"},
            [(REPLAYS, "expected a count, got 'lots'")],
            {UMC_UE: 3.0, UMC_CE: 7.0, **PAGES},
            [(PCIE_REPLAYS, ())],
        ),
    ],
    ids=["ue-not-a-number", "not-counts", "not-a-count-line", "bad-page-lines", "replays-not-a-number"],
)
def test_sysfs_malformed_health_files_are_problems_naming_file_and_field(
    tmp_path: Path,
    files: dict[str, str],
    problems: list[tuple[str, str]],
    kept: dict[tuple[str, tuple[tuple[str, str], ...]], float],
    absent: list[tuple[str, tuple[tuple[str, str], ...]]],
):
    """One file of the ECC copy holds a fault: a problem naming it (and ue / ce); the other values are kept."""
    capture = amd_sysfs_with(tmp_path, {**ECC_FILES, **files})
    snap = read_capture(capture)
    assert [(p.subject, p.field, p.message) for p in snap.problems] == [
        (str(capture), field, message) for field, message in problems
    ]
    got = health(snap)
    assert {k: got.get(k) for k in kept} == kept
    assert [k for k in absent if k in got] == []


def test_sysfs_query_inaccessible_is_no_reading_and_no_problem(tmp_path: Path):
    """amdgpu answers this while it recovers from a RAS error."""
    snap = read_capture(amd_sysfs_with(tmp_path, {"ras/umc_err_count": "Query currently inaccessible\n"}))
    assert snap.problems == []
    assert health(snap) == {(PCIE_REPLAYS, ()): 0.0}


def test_sysfs_bad_pages_are_read_to_their_end_a_page_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The kernel answers gpu_vram_bad_pages 146 lines (4088 bytes) per read: every read until the end counts."""
    capture = amd_sysfs_with(tmp_path, {"ras/gpu_vram_bad_pages": bad_pages(3000, 7, 1)})
    tree = DirTree(unpacked(capture, tmp_path / "tree"))
    real_read = os.read
    sizes: list[int] = []

    def page_at_a_time(fd: int, n: int) -> bytes:
        data = real_read(fd, min(n, 4088) if os.readlink(f"/proc/self/fd/{fd}").endswith("bad_pages") else n)
        sizes.append(len(data))
        return data

    monkeypatch.setattr(os, "read", page_at_a_time)
    got = health(read_sysfs(tree))
    monkeypatch.setattr(os, "read", real_read)
    assert got[(RETIRED_PAGES, (("cause", "ecc"),))] == 3001.0
    assert got[(RETIRED_PAGES_PENDING, ())] == 7.0
    assert sizes.count(4088) == 3008 * 28 // 4088


def test_sysfs_bad_pages_beyond_the_limit_are_a_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(sysfs_health, "BAD_PAGES_MAX_BYTES", 28 * 10 + 5)
    snap = read_capture(amd_sysfs_with(tmp_path, {"ras/gpu_vram_bad_pages": bad_pages(8, 4)}))
    assert [(p.field, p.message) for p in snap.problems] == [
        (BAD_PAGES, "more than 285 bytes: the pages beyond are not counted")
    ]
    assert health(snap)[(RETIRED_PAGES, (("cause", "ecc"),))] == 8.0
    assert health(snap)[(RETIRED_PAGES_PENDING, ())] == 2.0  # the ten whole lines within the limit


def test_sysfs_reader_reads_health_files_again_every_sample(tmp_path: Path):
    root = unpacked(amd_sysfs_with_ecc(tmp_path), tmp_path / "tree")
    dev = root / DEVICE.removeprefix("fixtures/sys/")
    reader = SysfsReader(DirTree(root, max_open=64))
    assert health(reader.sample()) == ECC_COPY
    (dev / "ras" / "umc_err_count").write_text("ue: 4\nce: 9\n")
    (dev / "ras" / "gpu_vram_bad_pages").write_text(bad_pages(3, 0))
    (dev / "pcie_replay_count").write_text("6\n")
    got = health(reader.sample())
    assert (got[(ECC_UNCORRECTED, (("block", "umc"),))], got[(ERRORS, (("error.type", "corrected"),))]) == (4.0, 9.0)
    assert (got[(RETIRED_PAGES, (("cause", "ecc"),))], got[(RETIRED_PAGES_PENDING, ())]) == (3.0, 0.0)
    assert got[(PCIE_REPLAYS, ())] == 6.0
    reader.close()


# -- amd-smi and rocm-smi --------------------------------------------------------------------------


def amd_smi_doc() -> list[dict]:
    return json.loads((SAMPLES / "amd-smi" / "amd-smi-metric.json").read_text())


def test_amd_smi_ecc_blocks_and_replays():
    doc = amd_smi_doc()
    doc[0]["ecc_blocks"] = {
        "UMC": {"correctable_count": 7, "uncorrectable_count": 3, "deferred_count": 1},
        "XGMI_WAFL": {"correctable_count": 2, "uncorrectable_count": 0, "deferred_count": 0},
        "SDMA": {"correctable_count": "N/A", "uncorrectable_count": "N/A", "deferred_count": "N/A"},
    }
    doc[0]["ecc"].update(total_correctable_count=9, total_uncorrectable_count=3)
    doc[0]["pcie"]["replay_count"] = 5
    snap = parse_amd_smi(doc, "metric.json")
    assert snap.problems == []
    assert health(snap) == {
        (ECC_CORRECTED, (("block", "umc"),)): 7.0,
        (ECC_UNCORRECTED, (("block", "umc"),)): 3.0,
        (ECC_CORRECTED, (("block", "xgmi_wafl"),)): 2.0,
        (ECC_UNCORRECTED, (("block", "xgmi_wafl"),)): 0.0,
        (ERRORS, (("error.type", "corrected"),)): 9.0,  # amd-smi's own totals, as before
        (ERRORS, (("error.type", "uncorrected"),)): 3.0,
        (PCIE_REPLAYS, ()): 5.0,
    }


def test_amd_smi_rocm_6_0_ecc_block_spelling():
    doc = amd_smi_doc()
    del doc[0]["ecc_blocks"]
    doc[0]["ecc_block"] = {"UMC": {"correctable": 2, "uncorrectable": 1}, "GFX": {"correctable": "N/A"}}
    snap = parse_amd_smi(doc, "metric.json")
    assert snap.problems == []
    got = health(snap)
    assert (got[(ECC_CORRECTED, (("block", "umc"),))], got[(ECC_UNCORRECTED, (("block", "umc"),))]) == (2.0, 1.0)
    assert not any(dict(attrs).get("block") == "gfx" for _, attrs in got)


def test_amd_smi_2023_top_level_replay_count():
    doc = amd_smi_doc()
    del doc[0]["pcie"]["replay_count"]
    doc[0]["replay_count"] = 12
    assert health(parse_amd_smi(doc, "metric.json"))[(PCIE_REPLAYS, ())] == 12.0


def test_amd_smi_malformed_health_values_are_problems():
    doc = amd_smi_doc()
    doc[0]["ecc_blocks"] = {"UMC": {"correctable_count": 7, "uncorrectable_count": "many"}, "GFX": [1, 2]}
    doc[0]["pcie"]["replay_count"] = "lots"
    doc.append(copy.deepcopy(doc[0]) | {"gpu": 1, "ecc_blocks": "N/A"})  # no blocks: nothing, no problem
    doc[1]["pcie"]["replay_count"] = 0
    snap = parse_amd_smi(doc, "metric.json")
    assert [(p.field, p.message) for p in snap.problems] == [
        ("gpu[0].ecc_blocks.UMC.uncorrectable_count", "not a number: 'many'"),
        ("gpu[0].ecc_blocks.GFX", "expected a section, got list"),
        ("gpu[0].pcie.replay_count", "not a number: 'lots'"),
    ]
    assert health(snap)[(ECC_CORRECTED, (("block", "umc"),))] == 7.0
    assert (ECC_UNCORRECTED, (("block", "umc"),)) not in health(snap)
    second = health(snap, "1")
    assert second[(PCIE_REPLAYS, ())] == 0.0
    assert not any(m in (ECC_CORRECTED, ECC_UNCORRECTED) for m, _ in second)


def test_rocm_smi_replay_count():
    doc = json.loads((SAMPLES / "rocm-smi" / "mi100_rocm602.json").read_text())
    doc["card0"]["PCIe Replay Count"] = "5"
    doc["card1"]["PCIe Replay Count"] = "many"
    doc["card2"]["PCIe Replay Count"] = "N/A"
    snap = parse_rocm_smi(doc, "rocm.json")
    assert [(p.field, p.message) for p in snap.problems] == [('card1."PCIe Replay Count"', "not a number: 'many'")]
    assert [health(snap, g).get((PCIE_REPLAYS, ())) for g in "0123"] == [5.0, None, None, 0.0]


# -- the amdsmi library ----------------------------------------------------------------------------


def amdsmi_backend(gpus: list[FakeAmdGpu], answers: list[FakeAmdHealth]):
    lib = fake_amdsmi_health(gpus, answers)
    return lib, open_backend("amdsmi", BackendOptions(modules={"amdsmi": lib}))


def test_amdsmi_ecc_blocks_bad_pages_and_replays():
    gpus = [FakeAmdGpu(), FakeAmdGpu(uuid="b", pcie={"pcie_width": 16, "pcie_speed": 32000, "pcie_replay_count": 9})]
    answers = [
        FakeAmdHealth(pages=[RESERVED, RESERVED, PENDING, UNRESERVABLE]),
        FakeAmdHealth(pages="No bad pages found."),
    ]
    lib, backend = amdsmi_backend(gpus, answers)
    snap = backend.sample()
    assert snap.problems == []
    assert health(snap) == {
        (ECC_CORRECTED, (("block", "umc"),)): 7.0,
        (ECC_UNCORRECTED, (("block", "umc"),)): 3.0,
        (ECC_CORRECTED, (("block", "gfx"),)): 1.0,
        (ECC_UNCORRECTED, (("block", "gfx"),)): 0.0,
        (ERRORS, (("error.type", "corrected"),)): 4.0,  # amdsmi_get_gpu_total_ecc_count, as before
        (ERRORS, (("error.type", "uncorrected"),)): 1.0,
        (RETIRED_PAGES, (("cause", "ecc"),)): 3.0,  # RESERVED and UNRESERVABLE
        (RETIRED_PAGES_PENDING, ()): 1.0,
        (PCIE_REPLAYS, ()): 5.0,  # no pcie_replay_count in pcie_metric: amdsmi_get_gpu_pci_replay_counter
    }
    second = health(snap, "1")
    assert (second[(RETIRED_PAGES, (("cause", "ecc"),))], second[(RETIRED_PAGES_PENDING, ())]) == (0.0, 0.0)
    assert second[(PCIE_REPLAYS, ())] == 9.0  # pcie_metric's (gpu_metrics), no further call
    assert lib.calls["amdsmi_get_gpu_pci_replay_counter"] == 1
    backend.close()


def test_amdsmi_unsupported_health_calls_are_not_made_again():
    """UMC and GFX answer; the other five blocks, the bad pages and the replay counter say NOT_SUPPORTED."""
    unsupported = AmdSmiLibraryException(NOT_SUPPORTED)
    answers = [
        FakeAmdHealth(
            raises={"amdsmi_get_gpu_bad_page_info": unsupported, "amdsmi_get_gpu_pci_replay_counter": unsupported}
        )
    ]
    lib, backend = amdsmi_backend([FakeAmdGpu()], answers)
    snaps = [backend.sample() for _ in range(3)]
    assert [s.problems for s in snaps] == [[], [], []]
    assert lib.calls == {
        "amdsmi_get_gpu_ecc_count": 7 + 2 + 2,  # every block once, then the two it has
        "amdsmi_get_gpu_bad_page_info": 1,
        "amdsmi_get_gpu_pci_replay_counter": 1,
    }
    assert {m for m, _ in health(snaps[-1])} == {ECC_CORRECTED, ECC_UNCORRECTED, ERRORS}
    backend.close()


def test_amdsmi_failing_health_calls_are_problems_not_crashes():
    """A library error is that sample's problem (asked again next time); an API of another shape, once."""
    answers = [
        FakeAmdHealth(
            raises={
                "amdsmi_get_gpu_bad_page_info": AmdSmiLibraryException(8),  # AMDSMI_STATUS_BUSY
                "amdsmi_get_gpu_pci_replay_counter": TypeError("argument 2: wrong type"),
            }
        )
    ]
    lib, backend = amdsmi_backend([FakeAmdGpu()], answers)
    first, second = backend.sample(), backend.sample()
    assert [p.message for p in first.problems] == [
        "amdsmi_get_gpu_bad_page_info: 8",
        "amdsmi_get_gpu_pci_replay_counter: TypeError: argument 2: wrong type; not called again for this GPU",
    ]
    assert [p.message for p in second.problems] == ["amdsmi_get_gpu_bad_page_info: 8"]
    assert lib.calls["amdsmi_get_gpu_bad_page_info"] == 2 and lib.calls["amdsmi_get_gpu_pci_replay_counter"] == 1
    assert health(second)[(ECC_UNCORRECTED, (("block", "umc"),))] == 3.0  # the rest is kept
    backend.close()


def test_amdsmi_malformed_bad_pages_and_a_gone_gpu():
    gpus = [FakeAmdGpu(), FakeAmdGpu(uuid="b")]
    answers = [FakeAmdHealth(pages=[RESERVED, 7, PENDING]), FakeAmdHealth()]
    _, backend = amdsmi_backend(gpus, answers)
    snap = backend.sample()
    assert [(p.field, p.message) for p in snap.problems] == [("gpu[0].bad_page_info[1].status", "not a page status: 7")]
    assert (health(snap)[(RETIRED_PAGES, (("cause", "ecc"),))], health(snap)[(RETIRED_PAGES_PENDING, ())]) == (1.0, 1.0)
    gpus[1].gone = True
    snap = backend.sample()
    assert [g.gpu.index for g in snap.gpus] == ["0"]
    assert [p.field for p in snap.problems if p.field == "gpu[1]"] == ["gpu[1]"]
    backend.close()
