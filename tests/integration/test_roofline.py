"""Counters end to end: rocprof-compute's vcopy workloads through the agent into the lake, then ``aaco roofline``."""

from __future__ import annotations

import csv
import json
import shutil
import signal
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest

from aaco.agent.sources.counters.rocprof_compute import is_metadata
from tests.support.terminal import run_in_terminal

from .helpers import read_lake, run_aaco, start_aaco, wait_for

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data"
VCOPY = DATA / "rocprof-compute" / "vcopy"
CUPTI = DATA.parents[1] / "examples" / "data" / "kineto-hta" / "cupti_profiler_trace.json.gz"


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory, aaco_bin: str) -> Path:
    """One agent run over the three vcopy workloads and rocprofv3's documented counter collection."""
    root = tmp_path_factory.mktemp("roofline")
    shutil.copytree(VCOPY, root / "vcopy")
    (root / "vcopy" / "broken").mkdir()
    (root / "vcopy" / "broken" / "pmc_perf.csv").write_text("not,a,workload\n1,2,3\n")  # said, the others read
    cfg = root / "agent.yaml"
    cfg.write_text(
        f"""
node: node-a
sources:
  - type: counters
    paths: [{root / "vcopy"}, {DATA / "rocprofv3-dir" / "counter_collection.csv"}, {CUPTI}]
    arch: gfx90a
exporters:
  lake: {{path: {root / "lake"}, flush_interval_s: 0.5}}
"""
    )
    log = root / "agent.log"
    proc = start_aaco(aaco_bin, "agent", "--config", str(cfg), log=log)
    try:
        wait_for(
            lambda: "counter rows from" in log.read_text() and log.read_text().count("counter rows from") >= 5,
            timeout=120,
            what="the counters source's five captures",
        )
        time.sleep(1.5)  # the lake's next flush (flush_interval_s 0.5)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "broken/pmc_perf.csv" in text and "not a rocprof-compute pmc_perf.csv" in text, text[-3000:]
    return root / "lake"


def test_every_counter_row_lands_with_the_file_s_values(lake: Path):
    table = read_lake(lake, "counters")
    for arch, folder in (("gfx908", "MI100"), ("gfx90a", "MI200"), ("gfx942", "MI300X_A1")):
        landed = {
            (r["dispatch_id"], r["counter"]): r["value"]
            for r in table.filter(pc.equal(table.column("arch"), arch)).to_pylist()
            if r["kernel"].startswith("vecCopy")  # not rocprofv3's documented capture, also called gfx90a here
        }
        with open(VCOPY / folder / "pmc_perf.csv", newline="") as fh:
            dispatches = list(csv.DictReader(fh))
        expected = {
            (int(row["Dispatch_ID"]), column): float(value)
            for row in dispatches
            for column, value in row.items()
            if not is_metadata(column)
        }
        assert expected and all(landed[k] == v for k, v in expected.items()), folder
        extra = set(landed) - set(expected)  # instance groups the file has no _sum column for, summed
        assert all(c.endswith("_sum") for _, c in extra), folder
    sq = sorted(
        (r["dispatch_id"], r["value"]) for r in table.to_pylist() if r["pid"] == 19396 and r["counter"] == "SQ_WAVES"
    )
    assert sq == [(1, 16384.0), (2, 16384.0), (3, 16384.0), (5, 16384.0), (6, 16384.0), (9, 16384.0), (13, 16384.0)]


def test_roofline_places_the_copy_kernel_under_the_hbm_roof(lake: Path, aaco_bin: str):
    res = run_aaco(
        aaco_bin, "roofline", "--lake", str(lake), "--peaks", str(VCOPY / "MI200" / "roofline.csv"), "--json"
    )
    assert res.returncode == 0, res.stderr
    kernels = json.loads(res.stdout)["kernels"]
    (mi200,) = [
        k
        for k in kernels
        if k["kernel"] == "vecCopy(double*, double*, double*, int, int) [clone .kd]"
        and k["hbm_bytes"]
        and k["mean_ns"] > 17000
    ]
    # by hand: 16 MiB through L2 per call, 15.07 MB from and to HBM in a 17,440 ns mean call: 864 GB/s of the
    # 1,388.93 GB/s measured on device 0; no floating-point work, so bound by memory
    assert mi200["l2_bytes"] == 16777216 and mi200["flops"] == 0 and mi200["ai_hbm"] == 0
    assert mi200["bound"] == "memory"
    assert mi200["roof_fraction"] == pytest.approx(15072341.333333334 / 17440 / 1388.9302)
    assert set(kernels[0]) >= {
        "kernel",
        "calls",
        "flops",
        "hbm_bytes",
        "l2_bytes",
        "l1_bytes",
        "ai_hbm",
        "ai_l2",
        "ai_l1",
        "gflops_per_s",
        "bound",
        "roof_fraction",
    }


@pytest.mark.parametrize("columns", [80, 120])
def test_roofline_at_a_terminal(lake: Path, aaco_bin: str, columns: int):
    run = run_in_terminal(
        [aaco_bin, "roofline", "--lake", str(lake), "--peaks", str(VCOPY / "MI200" / "roofline.csv")], columns=columns
    )
    assert run.returncode == 0, run.describe()
    assert run.wide_lines() == [], run.describe()
    assert "vecCopy" in run.text and "memory" in run.text and "62%" in run.text, run.describe()


def test_roofline_refuses_a_device_the_peaks_do_not_have(lake: Path, aaco_bin: str):
    res = run_aaco(
        aaco_bin, "roofline", "--lake", str(lake), "--peaks", str(VCOPY / "MI200" / "roofline.csv"), "--device", "9"
    )
    assert res.returncode == 2
    assert "roofline.csv: no device '9' (it has 0, 1, 2, 3)" in res.stderr


def test_a_kineto_cupti_capture_through_the_agent_and_aaco_roofline(lake: Path, aaco_bin: str):
    """HTA's CUPTI sample (A100): its counters land with the operators, and aaco roofline counts SASS FLOPs."""
    table = read_lake(lake, "counters")
    rows = [r for r in table.to_pylist() if r["arch"] == "sm_80"]
    assert len(rows) == 77 * 9
    sixth = [r for r in rows if r["dispatch_id"] == 5]
    assert {(r["top_op"], r["op_name"]) for r in sixth} == {("aten::conv2d", "aten::cudnn_convolution")}
    res = run_aaco(aaco_bin, "roofline", "--lake", str(lake), "--json")
    assert res.returncode == 0, res.stderr
    fft = [k for k in json.loads(res.stdout)["kernels"] if "fft2d_r2c_32x32" in k["kernel"]]
    assert fft and all(k["flops"] > 0 and k["bound"] is None for k in fft)  # no byte counters, no peaks: not placed


def test_roofline_under_a_gpu_model_s_published_peaks(lake: Path, aaco_bin: str):
    """The MI200 vcopy capture is an MI210 (its sysinfo: 104 CUs, 1638.4 GB/s): under the MI210's published peaks."""
    res = run_aaco(aaco_bin, "roofline", "--lake", str(lake), "--gpu", "mi210", "--json")
    assert res.returncode == 0, res.stderr
    (mi200,) = [k for k in json.loads(res.stdout)["kernels"] if k["hbm_bytes"] and k["mean_ns"] > 17000]
    assert mi200["bound"] == "memory" and mi200["ceiling"] == "FP32Flops"
    assert mi200["roof_fraction"] == pytest.approx(15072341.333333334 / 17440 / 1638.4)
    bad = run_aaco(aaco_bin, "roofline", "--lake", str(lake), "--gpu", "MI999")
    assert bad.returncode == 2 and "no GPU model 'MI999' in the peaks table (known: MI100, MI210" in bad.stderr
