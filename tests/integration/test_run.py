"""`aaco run`: ONNX Runtime for real, end to end into the lake, analysis.json and the summary."""

from __future__ import annotations

import json

import pyarrow.compute as pc
import pytest

from aaco.contract.schemas import REQUIRED

from .helpers import read_lake, run_aaco

pytestmark = pytest.mark.integration

# light_resnet50: 415 nodes, of which 239 ConstantOfShape weight stand-ins are folded at load (docs/kar.md)
RUNNING_NODES = 176


@pytest.fixture(scope="module")
def run_lake(tmp_path_factory, aaco_bin):
    out = tmp_path_factory.mktemp("run") / "D"
    proc = run_aaco(aaco_bin, "run", "--iterations", "20", "--warmup", "3", "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_exit_zero_and_summary(run_lake):
    _, proc = run_lake
    for col in ("p50 ms", "p95 ms", "p99 ms", "it/s", "kernels/it", "KAR", "launch tax", "device active"):
        assert col in proc.stdout
    assert "light_resnet50" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_lake_datasets_read_with_hive_partitioning(run_lake):
    out, _ = run_lake
    kernels = read_lake(out, "kernels")
    iterations = read_lake(out, "iterations")
    assert set(REQUIRED["kernels"]) <= set(kernels.schema.names)
    assert set(REQUIRED["iterations"]) <= set(iterations.schema.names)
    assert iterations.num_rows == 20
    assert kernels.num_rows > 0
    assert {"date", "node"} <= set(kernels.schema.names)  # hive partition keys
    # every part sits under kind/date=YYYY-MM-DD/node=<node>/part-<seq>.parquet
    parts = list((out / "kernels").rglob("*.parquet"))
    assert parts and all(p.parent.name.startswith("node=") and p.parent.parent.name.startswith("date=") for p in parts)


def test_every_kernel_belongs_to_a_timed_iteration(run_lake):
    out, _ = run_lake
    kernels = read_lake(out, "kernels")
    iterations = read_lake(out, "iterations")
    assert kernels.column("trace_id").null_count == 0
    assert set(kernels.column("trace_id").to_pylist()) == set(iterations.column("trace_id").to_pylist())
    assert set(kernels.column("parent_span_id").to_pylist()) == set(iterations.column("span_id").to_pylist())
    # no warmup kernels: nothing starts before the first timed iteration
    assert pc.min(kernels["start_ns"]).as_py() >= pc.min(iterations["start_ns"]).as_py()
    # trace ids are distinct per iteration
    assert len(set(iterations.column("trace_id").to_pylist())) == 20


def test_analysis_json_kar_matches_lake(run_lake):
    out, _ = run_lake
    doc = json.loads((out / "analysis.json").read_text())
    kar = doc["kar"]
    value = kar["value"] if isinstance(kar, dict) else kar
    assert value > 0
    kernels = read_lake(out, "kernels")
    per_iteration = kernels.filter(pc.equal(kernels["kind"], "kernel")).num_rows / 20
    model = doc["kar"]["models"]["light_resnet50"]
    assert model["graph_nodes"] == RUNNING_NODES  # the running nodes, not all 415
    assert model["kernels_per_iteration"] == pytest.approx(per_iteration)
    assert value == pytest.approx(per_iteration / RUNNING_NODES)
    for key in ("launch", "activity", "latency"):
        assert key in doc
    dev = doc["activity"]["devices"][0]
    assert 0 < dev["active_ratio"] <= 1
    assert doc["latency"]["models"]["light_resnet50"]["iterations"] == 20
    assert doc["launch"]["models"]["light_resnet50"]["launch_tax"] >= 0


def test_sources_json_records_the_clock(run_lake):
    out, _ = run_lake
    rec = json.loads((out / "sources.json").read_text())["sources"][0]
    assert rec["clock"]["method"] == "ort-profiling-start"
    assert rec["events"]["iterations"] == 20


def test_graph_cli_reports_415_nodes(aaco_bin, resnet50):
    proc = run_aaco(aaco_bin, "graph", str(resnet50), "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["nodes"] == 415
    assert doc["running_nodes"] == RUNNING_NODES
    assert doc["folded_nodes"] == 239
    assert doc["folded_ops"] == {"ConstantOfShape": 239}
    assert sum(doc["ops"].values()) == 415
    assert doc["ops"]["Conv"] == 53
    assert doc["opset"] == {"ai.onnx": 9}
    text = run_aaco(aaco_bin, "graph", str(resnet50))
    assert text.returncode == 0
    assert "415 nodes" in text.stdout and "176 running, 239 folded at load" in text.stdout
    assert "opset ai.onnx:9" in text.stdout and "{" not in text.stdout
    total = [line for line in text.stdout.splitlines() if "total" in line]
    assert [int(c) for c in total[0].replace("│", " ").split()[1:]] == [415, 239, RUNNING_NODES]
    missing = run_aaco(aaco_bin, "graph", str(resnet50.parent / "no-such-model.onnx"))
    assert missing.returncode == 2 and "no-such-model.onnx" in missing.stderr


def test_kernel_time_per_family_matches_lake(run_lake):
    out, _ = run_lake
    doc = json.loads((out / "analysis.json").read_text())
    fam = doc["families"]["models"]["light_resnet50"]
    assert fam["iterations"] == 20
    kernels = read_lake(out, "kernels")
    dur = pc.subtract(kernels["end_ns"], kernels["start_ns"])
    assert fam["time_s"] == pytest.approx(pc.sum(dur).as_py() / 1e9)
    conv = fam["families"]["convolution"]
    # ONNX Runtime fuses ResNet-50's Conv+BatchNormalization+Relu(+Sum): one kernel per Conv node.
    assert conv["kernels_per_iteration"] == 53
    assert conv["share"] > 0.5  # a CNN's time goes to its convolutions
    assert sum(f["share"] for f in fam["families"].values()) == pytest.approx(1.0)
    assert fam["top_kernels"][0]["family"] == "convolution"


def test_run_prints_kar_over_running_nodes(tmp_path, aaco_bin):
    out = tmp_path / "D"
    proc = run_aaco(aaco_bin, "run", "-n", "3", "--out", str(out), "--no-progress")
    assert proc.returncode == 0, proc.stderr
    model = json.loads((out / "analysis.json").read_text())["kar"]["models"]["light_resnet50"]
    assert model["iterations"] == 3
    assert model["graph_nodes"] == RUNNING_NODES
    kernels = read_lake(out, "kernels")
    per_iteration = kernels.filter(pc.equal(kernels["kind"], "kernel")).num_rows / 3
    assert model["kernels_per_iteration"] == pytest.approx(per_iteration)
    assert model["kar"] == pytest.approx(per_iteration / RUNNING_NODES)
    row = next(line for line in proc.stdout.splitlines() if "light_resnet50" in line)
    cells = row.split()  # the table's columns, two spaces apart (no cell of this row holds a space but the last two)
    assert cells[6] == f"{per_iteration:.1f}"  # kernels/it
    assert cells[7] == f"{per_iteration / RUNNING_NODES:.3f}"  # KAR, over the running nodes
    doc = json.loads(run_aaco(aaco_bin, "run", "-n", "3", "--out", str(out), "--no-progress", "--json").stdout)
    assert doc["models"]["light_resnet50"]["kar"] == pytest.approx(per_iteration / RUNNING_NODES)
