"""``aaco fleet`` over one lake that three nodes replayed different real samples into.

Each node's counts are checked against a replay of the same sample into a lake of its own, read back
with pyarrow (not DuckDB); latency quantiles against numpy over the same iterations; device activity,
kernels per iteration and kernel families against what the node's own analyzers wrote (analysis.json).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from aaco.contract.versions import row as versions_row

from .helpers import run_aaco, run_aaco_each

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


@pytest.fixture
def fleet(fleet_lakes: tuple[Path, dict[str, Path]]) -> tuple[Path, dict[str, Path]]:
    """The session's three-node lake and each node's own (tests/integration/conftest.py)."""
    return fleet_lakes


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
    missing, not_a_lake, bad_since = run_aaco_each(
        aaco_bin,
        ("fleet", "summary", "--lake", str(tmp_path / "nope")),
        ("fleet", "models", "--lake", str(tmp_path)),
        ("fleet", "outliers", "--lake", str(tmp_path), "--since", "soon"),
    )
    assert missing.returncode == 2 and "no such lake directory" in missing.stderr
    assert not_a_lake.returncode == 2 and "not a lake" in not_a_lake.stderr
    assert bad_since.returncode == 2 and "is not a duration" in bad_since.stderr


def analysis(own: Path) -> dict:
    """What the node's own analyzers concluded over the same replay (its analysis.json)."""
    return json.loads((own / "analysis.json").read_text())


def test_activity_kar_and_families_agree_with_each_nodes_own_analyzers(aaco_bin, fleet):
    lake, alone = fleet
    queries = ("nodes", "models", "families")
    answers = run_aaco_each(aaco_bin, *(("fleet", q, "--lake", str(lake), "--json") for q in queries))
    for proc in answers:
        assert proc.returncode == 0, proc.stderr
    nodes = {r["node"]: r for r in json.loads(answers[0].stdout)}
    models, families = (json.loads(proc.stdout) for proc in answers[1:])
    for node, own in alone.items():
        doc = analysis(own)
        windows = doc["activity"]["devices"]
        busy = sum(w["busy_ns"] for w in windows)
        span = sum(max(1, w["window_end_ns"] - w["window_start_ns"]) for w in windows)
        assert nodes[node]["active_ratio"] == pytest.approx(busy / span, rel=1e-9)
        assert nodes[node]["throttled_share"] is None  # no telemetry in these captures
        kernels = ds.dataset(own / "kernels", format="parquet").to_table(columns=["start_ns", "end_ns"])
        assert nodes[node]["busy_s"] == pytest.approx(
            float(np.sum(np.array(kernels["end_ns"]) - np.array(kernels["start_ns"]))) / 1e9, rel=1e-12
        )
        for row in [r for r in models if r["node"] == node]:
            kar = doc["kar"]["models"][row["model"]]
            assert row["kernels_per_iteration"] == pytest.approx(kar["kernels_per_iteration"], rel=1e-12)
            assert row["kar"] == kar["kar"]
            own_families = doc["families"]["models"][row["model"]]["families"]
            assert [f["family"] for f in row["top_families"]] == sorted(
                own_families, key=lambda f: -own_families[f]["time_s"]
            )[:3]
        got = {(r["model"], r["family"]): r["time_s"] for r in families if r["node"] == node}
        want = {
            (model, fam): v["time_s"]
            for model, g in doc["families"]["models"].items()
            for fam, v in g["families"].items()
        }
        assert got == pytest.approx(want, rel=1e-9)


def test_models_by_version_splits_a_node_at_its_upgrade(aaco_bin, fleet):
    lake, alone = fleet
    its = ds.dataset(alone["gpu-b"] / "iterations", format="parquet").to_table().sort_by("start_ns")
    starts = np.array(its["start_ns"])
    upgrade = int(starts[-1])  # the last iteration runs on the new driver
    versions = pa.concat_tables(
        [
            versions_row(int(starts[0]), "gpu-b", {"gpu_driver": "6.8.5", "rocm_version": "6.2.0"}),
            versions_row(upgrade, "gpu-b", {"gpu_driver": "6.10.5", "rocm_version": "6.4.1"}),
        ]
    ).drop_columns(["node"])
    part = lake / "versions" / "date=2025-02-17" / "node=gpu-b" / "part-000000.parquet"
    part.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(versions, part)
    try:
        rows = [r for r in fleet_json(aaco_bin, "models", "--by-version", "--lake", str(lake)) if r["node"] == "gpu-b"]
    finally:
        part.unlink()
    lat = (np.array(its["end_ns"]) - np.array(its["start_ns"])) / 1e9
    assert [(r["gpu_driver"], r["rocm_version"], r["iterations"]) for r in rows] == [
        ("6.8.5", "6.2.0", len(lat) - 1),
        ("6.10.5", "6.4.1", 1),
    ]
    assert rows[0]["p95_s"] == pytest.approx(float(np.percentile(lat[:-1], 95)), rel=1e-12)
    assert rows[1]["p95_s"] == pytest.approx(float(lat[-1]), rel=1e-12)
