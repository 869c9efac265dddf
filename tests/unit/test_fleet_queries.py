"""The fleet's questions on a lake built in the test: latency quantiles, kernels per iteration, the outlier rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from aaco.agent.fleet import dimensions, queries
from aaco.agent.fleet.lake import FleetError, FleetLake, parse_duration
from aaco.contract.kernels import FAMILIES, family_of
from aaco.contract.schemas import SCHEMAS
from aaco.contract.telemetry import THROTTLE, THROTTLE_REASONS
from aaco.contract.versions import SCHEMA as VERSIONS
from aaco.contract.versions import row as versions_row

NS = 10**9


def table(kind: str, rows: list[dict]) -> pa.Table:
    """Rows of one kind with the contract's full schema (the columns a row lacks are null)."""
    return pa.Table.from_pylist(rows, schema=SCHEMAS[kind])


def iterations(latencies_s: dict[str, list[float]], model: str = "llm", graph_nodes: int | None = None) -> pa.Table:
    rows = [
        {
            "start_ns": i * NS,
            "end_ns": i * NS + round(lat * NS),
            "node": node,
            "model": model,
            "graph_nodes": graph_nodes,
        }
        for node, lats in latencies_s.items()
        for i, lat in enumerate(lats)
    ]
    return table("iterations", rows)


def lake(
    its: pa.Table,
    kernels_per_node: dict[str, int] | None = None,
    kernels: list[dict] | None = None,
    telemetry: list[dict] | None = None,
    versions: pa.Table | None = None,
) -> FleetLake:
    rows = list(kernels or [])
    for node, n in (kernels_per_node or {}).items():
        rows += [{"start_ns": 0, "end_ns": 1000, "node": node, "model": "llm", "kind": "kernel", "iteration": 0}] * n
    tables = {
        "kernels": table("kernels", rows),
        "iterations": its,
        "telemetry": table("telemetry", telemetry or []),
        "versions": versions if versions is not None else VERSIONS.empty_table(),
    }
    return FleetLake(Path("."), tables)


def test_models_quantiles_and_kernels_per_iteration():
    rng = np.random.default_rng(7)
    lat = {f"n{i}": list(rng.uniform(0.01, 0.02, 50)) for i in range(3)}
    copies = [{"start_ns": 0, "end_ns": 10, "node": "n0", "model": "llm", "kind": "memcpy", "iteration": 0}] * 9
    with lake(iterations(lat), {"n0": 500, "n1": 250}, kernels=copies).connect() as con:
        rows = {r["node"]: r for r in queries.models(con)}
    for node, values in lat.items():
        got = np.array(values)
        assert rows[node]["iterations"] == 50
        for q in (50, 95, 99):
            # DuckDB's quantile_cont is numpy's linear interpolation; times are whole nanoseconds
            assert rows[node][f"p{q}_s"] == pytest.approx(np.percentile(np.round(got * NS) / NS, q), abs=1e-12)
    # launches only (the KAR analyzer's count): copies and memsets are not kernels of the graph
    assert rows["n0"]["kernels_per_iteration"] == 10.0 and rows["n2"]["kernels_per_iteration"] == 0.0
    assert rows["n0"]["kar"] is None and rows["n0"]["throttled_share"] is None


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
    with pytest.raises(FleetError, match="no such lake directory"):
        FleetLake.open(str(tmp_path / "nope"))
    with pytest.raises(FleetError, match="not a lake"):
        FleetLake.open(str(tmp_path))


def union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union of intervals, merged one by one in start order."""
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(zip(starts.tolist(), ends.tolist(), strict=True)):
        if cur_e is None or s > cur_e:
            total += 0 if cur_e is None else cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (0 if cur_e is None else cur_e - cur_s)


def test_device_active_ratio_is_the_union_of_busy_intervals_over_each_window():
    rng = np.random.default_rng(11)
    rows, expected = [], {}
    for node in ("a", "b"):
        busy = window = 0
        for device in ("0", "1"):
            for run in ("r1", "r2"):
                starts = rng.integers(0, 10**6, 300) + (0 if run == "r1" else 10**8)  # overlapping, unsorted
                ends = starts + rng.integers(0, 20_000, 300)
                rows += [
                    {"start_ns": int(s), "end_ns": int(e), "node": node, "device": device, "run_id": run}
                    | {"model": "llm", "kind": "kernel" if i % 5 else "memcpy", "iteration": 0}
                    for i, (s, e) in enumerate(zip(starts, ends, strict=True))
                ]
                busy += union_ns(starts, ends)
                window += int(ends.max() - starts.min())
        expected[node] = busy / window
    with lake(iterations({"a": [0.1], "b": [0.1]}), kernels=rows).connect() as con:
        by_node = {r["node"]: r["active_ratio"] for r in queries.nodes(con)}
        by_model = {r["node"]: r["active_ratio"] for r in queries.models(con)}
    for node, ratio in expected.items():
        assert by_node[node] == pytest.approx(ratio, rel=1e-12) and by_model[node] == pytest.approx(ratio, rel=1e-12)
    assert 0 < min(expected.values()) < 1


def flags(node: str, device: str, times_s: list[float], throttled: list[bool]) -> list[dict]:
    """Vendor throttle flags: one row per reason per sample, the power reason set where throttled."""
    return [
        {"ts_ns": round(t * NS), "node": node, "device": device, "metric": THROTTLE, "unit": "1"}
        | {"value": 1.0 if (on and reason == "power") else 0.0, "attributes": [("reason", reason)]}
        for t, on in zip(times_s, throttled, strict=True)
        for reason in THROTTLE_REASONS
    ] + [
        {"ts_ns": round(t * NS), "node": node, "device": device, "metric": "hw.power", "value": 300.0, "unit": "W"}
        for t in times_s
    ]


def test_throttled_share_counts_the_time_after_each_throttled_sample():
    # gpu 0: samples at 0, 1, 2, 3, 200 s; throttled at 1 and 3: 1 s, then 60 s (a gap counts up to stale_s)
    # gpu 1: samples every second, never throttled
    t0 = [0, 1, 2, 3, 200]
    tel = flags("a", "0", t0, [False, True, False, True, False]) + flags("a", "1", [0, 1, 2, 3], [False] * 4)
    its = iterations({"a": [0.1, 0.1, 0.1, 0.1, 0.1]})  # starts at 0..4 s: those at 1 and 3 (and 4) are throttled
    with lake(its, {"a": 1}, telemetry=tel).connect() as con:
        (node,) = queries.nodes(con)
        (model,) = queries.models(con)
    throttled = 1 + 60
    observed = (1 + 1 + 1 + 60) + 3
    assert node["throttled_s"] == pytest.approx(throttled) and node["throttled_share"] == pytest.approx(
        throttled / observed
    )
    assert model["throttled_share"] == pytest.approx(3 / 5)


def test_kar_is_kernels_per_iteration_over_running_graph_nodes():
    its = iterations({"a": [0.1] * 4}, graph_nodes=20)
    with lake(its, {"a": 100}).connect() as con:
        (row,) = queries.models(con)
    assert row["kernels_per_iteration"] == 25.0 and row["graph_nodes"] == 20 and row["kar"] == 1.25


NAMES = [
    "cudnn_ampere_scudnn_128x64_relu",
    "sm80_xmma_fprop_implicit_gemm",
    "void cudnn::ops::nchwToNhwcKernel",
    "ampere_sgemm_32x32_sliced1x4_tn",
    "Cijk_Ailk_Bljk_SB_MT64x64x8",
    "void at::native::reduce_kernel",
    "void at::native::vectorized_elementwise_kernel",
    "flash_fwd_kernel",
    "ncclDevKernel_AllReduce_Sum_f32",
    "Add_kernel",
    "addition_kernel",
    "my_custom_kernel",
    "",
]


def test_family_case_is_the_contracts_rules():
    import duckdb

    names = [*NAMES, "RELU_fused", "Sum_kernel", "summary_kernel", "all_gather"]
    con = duckdb.connect()
    con.register("k", pa.table({"name": [*names, "x", "y"], "kind": ["kernel"] * len(names) + ["memcpy", "memset"]}))
    got = con.execute(f"SELECT {dimensions.family_case()} FROM k").fetchall()
    assert [g[0] for g in got] == [family_of(n) for n in names] + ["memcpy", "memset"]
    assert "\\\\b" in dimensions.family_case("spark") and "\\\\b" not in dimensions.family_case("trino")
    assert "regexp_like(lower(name)" in dimensions.family_case("trino")


def test_families_time_shares_and_top_families():
    rng = np.random.default_rng(5)
    rows, time_by = [], {}
    for i in range(400):
        name = NAMES[int(rng.integers(len(NAMES)))]
        dur = int(rng.integers(1, 10_000))
        model = "llm" if i % 3 else None
        rows.append(
            {"start_ns": i * 10**5, "end_ns": i * 10**5 + dur, "node": "a", "name": name, "kind": "kernel"}
            | {"model": model}
        )
        key = (model or "unknown", family_of(name))
        time_by[key] = time_by.get(key, 0) + dur
    with lake(iterations({"a": [0.1]}), kernels=rows).connect() as con:
        fams = queries.families(con)
        (node,) = queries.nodes(con)
        (model,) = queries.models(con)
    assert {(r["model"], r["family"]): r["time_s"] * NS for r in fams} == pytest.approx(time_by)
    assert all(r["family"] in FAMILIES for r in fams)
    llm = {f: t for (m, f), t in time_by.items() if m == "llm"}
    ranked = sorted(llm, key=lambda f: -llm[f])[: dimensions.TOP_FAMILIES]
    assert [f["family"] for f in model["top_families"]] == ranked
    assert model["top_families"][0]["share"] == pytest.approx(llm[ranked[0]] / sum(llm.values()))
    everything = {}
    for (_, f), t in time_by.items():
        everything[f] = everything.get(f, 0) + t
    assert [f["family"] for f in node["top_families"]] == sorted(everything, key=lambda f: -everything[f])[:3]


def test_models_by_version_splits_at_the_upgrade():
    rng = np.random.default_rng(9)
    before, after = list(rng.normal(0.10, 0.002, 60)), list(rng.normal(0.13, 0.002, 40))
    its = iterations({"a": before + after, "b": [0.1] * 10})  # node a's iteration i starts at i s
    ver = pa.concat_tables(
        [
            versions_row(20 * NS, "a", {"gpu_driver": "570.1", "cuda_version": "12.8"}),  # after 20 iterations ran
            versions_row(60 * NS, "a", {"gpu_driver": "580.2", "cuda_version": "13.0"}),  # the upgrade
        ]
    )
    with lake(its, versions=ver).connect() as con:
        rows = queries.models_by_version(con)
    a = [r for r in rows if r["node"] == "a"]
    assert [(r["gpu_driver"], r["iterations"]) for r in a] == [("570.1", 60), ("580.2", 40)]
    for r, lats in zip(a, (before, after), strict=True):
        assert r["p95_s"] == pytest.approx(np.percentile(np.round(np.array(lats) * NS) / NS, 95), abs=1e-12)
    (b,) = [r for r in rows if r["node"] == "b"]
    assert b["iterations"] == 10 and b["gpu_driver"] is None  # no versions rows: one group, versions unknown
