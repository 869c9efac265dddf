"""``aaco health`` as Node Problem Detector runs it (piped) and as a person does (a terminal of 80 columns).

Every real capture the project carries is healthy (exit 0); copies of a real capture with one health
field changed are unhealthy with that reason (exit 1); real kernel logs' XIDs are counted by code with
the catalogue's severity; no GPU to read is unknown (exit 3).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.health_captures import amd_sysfs_with_ecc
from tests.support.nvidia_health_captures import H100, with_field
from tests.support.terminal import run_in_terminal

from .helpers import run_aaco, run_aaco_each

pytestmark = pytest.mark.integration

DATA, EXAMPLES = ROOT / "tests" / "data", ROOT / "examples" / "data"
CAPTURES = sorted(
    [
        *(DATA / "nvidia-smi").glob("*.xml*"),
        *(DATA / "rocm-smi").glob("*.json"),
        *(EXAMPLES / "nvidia-smi").glob("*.xml*"),
        *(EXAMPLES / "amd-smi").glob("*.json"),
        *(EXAMPLES / "rocm-smi").glob("*.json"),
        *(EXAMPLES / "sysfs").glob("*.ttar"),
    ]
)
LOGS = DATA / "kernel-log"


def health(aaco_bin: str, *args: str) -> tuple[int, dict]:
    proc = run_aaco(aaco_bin, "health", *args, "--json")
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_every_real_capture_is_healthy(aaco_bin):
    assert len(CAPTURES) >= 25
    for capture, proc in zip(
        CAPTURES, run_aaco_each(aaco_bin, *(("health", "-f", str(c), "--json") for c in CAPTURES)), strict=True
    ):
        assert proc.returncode == 0, (capture.name, proc.stdout, proc.stderr)
        doc = json.loads(proc.stdout)
        assert doc["status"] == "healthy" and doc["gpus"], (capture.name, doc)
        assert {g["status"] for g in doc["gpus"]} == {"healthy"}, (capture.name, doc)


@pytest.mark.parametrize(
    ("field", "value", "code", "detail"),
    [
        ("ecc_errors/volatile/dram_uncorrectable", "2", "ecc_uncorrected", "2 uncorrected ECC error(s) in dram"),
        ("remapped_rows/remapped_row_failure", "Yes", "row_remap_failure", "could not be remapped"),
    ],
)
def test_a_copy_with_a_health_fault_is_unhealthy_and_exits_1(tmp_path, aaco_bin, field, value, code, detail):
    capture = with_field(H100, tmp_path / "h100.xml", field, value)
    rc, doc = health(aaco_bin, "-f", str(capture))
    assert rc == 1 and doc["status"] == "unhealthy"
    ((gpu,),) = [doc["gpus"]]
    assert gpu["uuid"] == "GPU-dab60736-6049-d541-3661-0407a2d7284c" and gpu["status"] == "unhealthy"
    assert [r["code"] for r in gpu["reasons"]] == [code] and detail in gpu["reasons"][0]["detail"]
    # as Node Problem Detector reads it: the first line is the message, the status the exit code
    proc = run_aaco(aaco_bin, "health", "-f", str(capture))
    assert proc.returncode == 1 and proc.stdout.splitlines()[0] == f"unhealthy: GPU 0 unhealthy ({code})"


def test_an_amd_sysfs_copy_with_uncorrected_umc_errors_is_unhealthy_and_exits_1(tmp_path, aaco_bin):
    """The real Vega sysfs tree with ras/umc_err_count "ue: 3" (and bad pages, replays) as amdgpu writes them."""
    capture = amd_sysfs_with_ecc(tmp_path, ue=3, ce=7, retired=2, pending=1, replays=5)
    rc, doc = health(aaco_bin, "-f", str(capture))
    assert rc == 1 and doc["status"] == "unhealthy"
    ((gpu,),) = [doc["gpus"]]
    assert [(r["code"], r["status"]) for r in gpu["reasons"]] == [
        ("ecc_uncorrected", "unhealthy"),
        ("retired_pages_pending", "warning"),
    ]
    assert "3 uncorrected ECC error(s) in umc" in gpu["reasons"][0]["detail"]
    rc, doc = health(aaco_bin, "-f", str(amd_sysfs_with_ecc(tmp_path, ue=0, ce=7, pending=0, name="clean.ttar")))
    assert rc == 0 and doc["status"] == "healthy"  # corrected errors alone, once: healthy


def test_mig_devices_are_judged_and_counted_apart_from_their_gpu(aaco_bin):
    proc = run_aaco(aaco_bin, "health", "-f", str(EXAMPLES / "nvidia-smi" / "a100-sxm4-v12.xml.gz"))
    lines = proc.stdout.splitlines()
    assert (
        proc.returncode == 0 and lines[0] == "healthy: 1 GPU(s) and 4 MIG device(s) or partition(s), no problem found"
    )
    assert [line.split(":")[0] for line in lines[1:]] == ["GPU 0 GPU-513536b6-7d19-9063-b049-1e69664bb298"] + [
        f"GPU 0/{gi}/0" for gi in (3, 4, 5, 6)
    ]


def test_a_pending_remap_is_a_warning_and_exits_0(tmp_path, aaco_bin):
    capture = with_field(H100, tmp_path / "h100.xml", "remapped_rows/remapped_row_pending", "Yes")
    rc, doc = health(aaco_bin, "-f", str(capture))
    assert rc == 0 and doc["status"] == "warning"
    assert [r["code"] for r in doc["gpus"][0]["reasons"]] == ["row_remap_pending"]


def grep_xids(path: Path) -> dict[tuple[str, int], int]:
    """An independent count: ``Xid (PCI:bus): code`` occurrences, by bus and code."""
    out: dict[tuple[str, int], int] = {}
    for bus, code in re.findall(r"Xid \((?:PCI:)?([0-9a-f:]+)\): (\d+)", path.read_text(errors="replace")):
        key = (f"{bus}.0", int(code))
        out[key] = out.get(key, 0) + 1
    return out


@pytest.mark.parametrize("log", sorted(LOGS.glob("*.log")), ids=lambda p: p.name)
def test_real_kernel_logs_xids_counted_by_code_with_their_severity(tmp_path, aaco_bin, log):
    from aaco.contract.xid import lookup

    config = tmp_path / "agent.yaml"  # these logs are months old: count them all in the verdict
    config.write_text("analyzers:\n  health:\n    xid_max_age_s: 1e10\n")
    capture = ROOT / "tests" / "data" / "nvidia-smi" / "a10g.xml"
    rc, doc = health(aaco_bin, "-f", str(capture), "--kernel-log", str(log), "--config", str(config))
    want = grep_xids(log)
    assert want, f"{log.name}: no XID line"
    assert {(x["pci_bus"], x["xid"]): x["count"] for x in doc["xids"]} == want
    for x in doc["xids"]:
        assert x["severity"] == lookup(x["xid"]).severity and x["in_verdict"]
    critical = {x["gpu"] for x in doc["xids"] if x["severity"] == "critical"}
    bad = {g["gpu"] for g in doc["gpus"] if g["status"] == "unhealthy"}
    assert bad == critical and rc == (1 if critical else 0)


def test_the_xid_79_of_a_real_log_makes_its_gpu_unhealthy(tmp_path, aaco_bin):
    config = tmp_path / "agent.yaml"
    config.write_text("analyzers:\n  health:\n    xid_max_age_s: 1e10\n")
    capture = ROOT / "tests" / "data" / "nvidia-smi" / "a10g.xml"
    log = LOGS / "gpud-sxid-readme-xid79.log"
    rc, doc = health(aaco_bin, "-f", str(capture), "--kernel-log", str(log), "--config", str(config))
    assert rc == 1
    (lost,) = [g for g in doc["gpus"] if g["status"] == "unhealthy"]
    assert lost["gpu"] == "0000:91:00.0" and lost["reasons"][0]["code"] == "xid_79"
    # its times are seconds since boot, no date: it counts however old, as a line with no time must
    rc, doc = health(aaco_bin, "-f", str(capture), "--kernel-log", str(log))
    assert rc == 1 and doc["xids"][0]["last_ns"] is None and doc["xids"][0]["in_verdict"]
    # dmesg -T's XID 119 of February 2025 is older than the default day: counted, not in the verdict
    rc, doc = health(aaco_bin, "-f", str(capture), "--kernel-log", str(LOGS / "dmesg-with-xid-119.log"))
    assert rc == 0 and [(x["xid"], x["count"], x["in_verdict"]) for x in doc["xids"]] == [(119, 5, False)]


def test_no_gpu_to_read_is_unknown_and_exits_3(aaco_bin):
    if shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi is installed here: it would be read")
    proc = run_aaco(aaco_bin, "health", "--backend", "nvidia-smi")
    assert proc.returncode == 3 and proc.stdout.startswith("unknown: ") and "nvidia-smi" in proc.stdout
    rc, doc = health(aaco_bin, "--backend", "nvidia-smi")
    assert rc == 3 and doc["status"] == "unknown" and doc["gpus"] == []


def test_a_file_that_is_no_capture_is_a_usage_error(tmp_path, aaco_bin):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    proc = run_aaco(aaco_bin, "health", "-f", str(bad))
    assert proc.returncode == 2 and "notes.txt" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("columns", [80, 120])
def test_at_a_terminal(tmp_path, aaco_bin, columns):
    capture = with_field(H100, tmp_path / "h100.xml", "ecc_errors/volatile/dram_uncorrectable", "2")
    args = [aaco_bin, "health", "-f", str(capture), "--kernel-log", str(LOGS / "dmesg.decode.iso.log")]
    run = run_in_terminal(args, columns=columns)
    assert run.returncode == 1 and "Traceback" not in run.raw, run.describe()
    assert run.wide_lines() == [], run.describe()
    text = " ".join(run.text.split())
    assert "2 uncorrected ECC error(s) in dram" in text and "XID 13 on GPU 0000:38:00.0" in text
