"""The fleet's questions on a lake built in the test: latency quantiles, kernels per iteration, the outlier rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from aaco.agent.fleet import queries
from aaco.agent.fleet.lake import FleetError, FleetLake, lake_path, parse_duration

NS = 10**9


def iterations(latencies_s: dict[str, list[float]], model: str = "llm") -> pa.Table:
    rows: dict[str, list] = {"start_ns": [], "end_ns": [], "node": [], "model": []}
    for node, lats in latencies_s.items():
        for i, lat in enumerate(lats):
            rows["start_ns"].append(i * NS)
            rows["end_ns"].append(i * NS + round(lat * NS))
            rows["node"].append(node)
            rows["model"].append(model)
    return pa.table(
        {**rows, "start_ns": pa.array(rows["start_ns"], pa.int64()), "end_ns": pa.array(rows["end_ns"], pa.int64())}
    )


def lake(its: pa.Table, kernels_per_node: dict[str, int] | None = None) -> FleetLake:
    k = {"start_ns": [], "end_ns": [], "node": [], "model": [], "device": []}
    for node, n in (kernels_per_node or {}).items():
        k["start_ns"] += [0] * n
        k["end_ns"] += [1000] * n
        k["node"] += [node] * n
        k["model"] += ["llm"] * n
        k["device"] += ["0"] * n
    kernels = pa.table(
        {**k, "start_ns": pa.array(k["start_ns"], pa.int64()), "end_ns": pa.array(k["end_ns"], pa.int64())}
    )
    telemetry = pa.table({"ts_ns": pa.array([], pa.int64()), "node": pa.array([], pa.string())})
    return FleetLake(Path("."), {"kernels": kernels, "iterations": its, "telemetry": telemetry})


def test_models_quantiles_and_kernels_per_iteration():
    rng = np.random.default_rng(7)
    lat = {f"n{i}": list(rng.uniform(0.01, 0.02, 50)) for i in range(3)}
    with lake(iterations(lat), {"n0": 500, "n1": 250}).connect() as con:
        rows = {r["node"]: r for r in queries.models(con)}
    for node, values in lat.items():
        got = np.array(values)
        assert rows[node]["iterations"] == 50
        for q in (50, 95, 99):
            # DuckDB's quantile_cont is numpy's linear interpolation; times are whole nanoseconds
            assert rows[node][f"p{q}_s"] == pytest.approx(np.percentile(np.round(got * NS) / NS, q), abs=1e-12)
    assert rows["n0"]["kernels_per_iteration"] == 10.0 and rows["n2"]["kernels_per_iteration"] == 0.0


def test_summary_counts_per_node():
    with lake(iterations({"a": [0.1] * 4, "b": [0.1] * 2}), {"a": 7}).connect() as con:
        assert queries.summary(con) == {
            "nodes": [
                {"node": "a", "kernels": 7, "iterations": 4, "models": ["llm"]},
                {"node": "b", "kernels": 0, "iterations": 2, "models": ["llm"]},
            ]
        }


def test_outlier_rule_names_the_slow_node_and_not_its_near_miss():
    rng = np.random.default_rng(3)
    lat = {f"n{i}": list(rng.normal(0.100 + 0.002 * i, 0.001, 200)) for i in range(6)}  # spread of a few ms
    lat["slow"] = list(rng.normal(0.160, 0.001, 200))  # far: a throttled node
    lat["near"] = list(rng.normal(0.112, 0.001, 200))  # a little beyond the others: not an outlier
    with lake(iterations(lat)).connect() as con:
        found = queries.outliers(con)
    assert [r["node"] for r in found] == ["slow"]
    assert found[0]["modified_z"] > queries.OUTLIER_Z and found[0]["nodes"] == 8


def test_outliers_need_three_nodes_and_handle_a_zero_spread():
    with lake(iterations({"a": [0.1] * 5, "b": [0.5] * 5})).connect() as con:
        assert queries.outliers(con) == []  # two nodes: no fleet to be far from
    with lake(iterations({"a": [0.1] * 5, "b": [0.1] * 5, "c": [0.1] * 5, "d": [0.2] * 5})).connect() as con:
        assert [(r["node"], r["modified_z"]) for r in queries.outliers(con)] == [("d", None)]


@pytest.mark.parametrize(
    ("text", "ns"), [("90s", 90 * NS), ("30m", 1800 * NS), ("24h", 86_400 * NS), ("1.5d", 129_600 * NS)]
)
def test_durations(text, ns):
    assert parse_duration(text) == ns


@pytest.mark.parametrize("text", ["", "3x", "h", "-1h"])
def test_bad_durations_are_clear_errors(text):
    with pytest.raises(FleetError, match="is not a duration"):
        parse_duration(text)


def test_lake_urls(tmp_path):
    assert lake_path(f"file://{tmp_path}") == tmp_path
    with pytest.raises(FleetError, match="only local lakes"):
        lake_path("s3://bucket/lake")
    with pytest.raises(FleetError, match="no such lake directory"):
        FleetLake.open(str(tmp_path / "nope"))
    with pytest.raises(FleetError, match="not a lake"):
        FleetLake.open(str(tmp_path))
