"""``aaco fleet`` over one lake that three nodes replayed different real samples into.

Each node's counts are checked against a replay of the same sample into a lake of its own, read back
with pyarrow (not DuckDB); latency quantiles against numpy over the same iterations.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

from .helpers import run_aaco

NODES = {
    "gpu-a": "kineto/a100_alexnet_trace.json.gz",
    "gpu-b": "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "gpu-c": "rocprofv3/kernel_trace.csv",
}


def replay(aaco_bin: str, sample: Path, out: Path, node: str) -> None:
    proc = run_aaco(aaco_bin, "replay", str(sample), "--out", str(out), env={"AACO_NODE": node})
    assert proc.returncode == 0, proc.stderr


def rows(lake: Path, kind: str) -> int:
    return ds.dataset(lake / kind, format="parquet").count_rows() if (lake / kind).is_dir() else 0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, aaco_bin: str, samples: Path) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("fleet")
    alone = {}
    for node, sample in NODES.items():
        replay(aaco_bin, samples / sample, root / "lake", node)
        alone[node] = root / f"alone-{node}"
        replay(aaco_bin, samples / sample, alone[node], node)
    return root / "lake", alone


def fleet_json(aaco_bin: str, *args: str) -> object:
    proc = run_aaco(aaco_bin, "fleet", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_summary_counts_each_node_as_its_own_replay(aaco_bin, fleet):
    lake, alone = fleet
    doc = fleet_json(aaco_bin, "summary", "--lake", str(lake))
    got = {n["node"]: n for n in doc["nodes"]}
    assert sorted(got) == sorted(NODES)
    for node, own in alone.items():
        assert got[node]["kernels"] == rows(own, "kernels") > 0
        assert got[node]["iterations"] == rows(own, "iterations")
        assert got[node]["models"]
    assert sum(n["kernels"] for n in doc["nodes"]) == rows(lake, "kernels")


def test_models_quantiles_agree_with_numpy(aaco_bin, fleet):
    lake, alone = fleet
    doc = fleet_json(aaco_bin, "models", "--lake", f"file://{lake}")
    its = ds.dataset(alone["gpu-b"] / "iterations", format="parquet").to_table()
    lat = (np.array(its["end_ns"]) - np.array(its["start_ns"])) / 1e9
    (row,) = [r for r in doc if r["node"] == "gpu-b"]
    assert row["iterations"] == len(lat) > 0
    assert row["p95_s"] == pytest.approx(float(np.percentile(lat, 95)), rel=1e-12)


def test_since_leaves_out_old_events(aaco_bin, fleet):
    lake, _ = fleet
    # the Kineto samples' events are from 2023 and 2025; the rocprofv3 CSV's boot-clock times are anchored to
    # its file's mtime, which is the checkout's, so it may or may not be within the hour
    recent = {n["node"] for n in fleet_json(aaco_bin, "summary", "--lake", str(lake), "--since", "1h")["nodes"]}
    assert recent <= {"gpu-c"}
    assert len(fleet_json(aaco_bin, "nodes", "--lake", str(lake), "--since", "10000d")) == 3


def test_errors_name_the_lake_and_the_fix(aaco_bin, tmp_path):
    proc = run_aaco(aaco_bin, "fleet", "summary", "--lake", str(tmp_path / "nope"))
    assert proc.returncode == 2 and "no such lake directory" in proc.stderr
    proc = run_aaco(aaco_bin, "fleet", "models", "--lake", str(tmp_path))
    assert proc.returncode == 2 and "not a lake" in proc.stderr
    proc = run_aaco(aaco_bin, "fleet", "outliers", "--lake", str(tmp_path), "--since", "soon")
    assert proc.returncode == 2 and "is not a duration" in proc.stderr
