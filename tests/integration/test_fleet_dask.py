"""A real distributed engine reads the fleet's lake on S3 and agrees with DuckDB (issue 16).

A Dask distributed ``LocalCluster`` of two workers reads the ``iterations`` of an ``s3://`` lake on
SeaweedFS straight from the store, with Dask's own ``read_parquet`` (hive partitions give ``node``),
and computes each model and node's p95 latency exactly: a group-by apply of numpy's linear
percentile, not Dask's approximate quantile. ``aaco fleet models`` (DuckDB's ``quantile_cont``)
must give the same numbers to 1e-9. The store is reached through fsspec's wrapper of the pyarrow
S3 filesystem: Dask's pyarrow-filesystem reader keeps pyarrow ``FileInfo`` objects in its graph,
which cannot be sent to a distributed worker.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from aaco.agent.fleet import queries
from aaco.agent.fleet.lake import FleetLake
from tests.conftest import skip_or_fail

from .test_fleet_s3 import lake_in_bucket

pytestmark = pytest.mark.integration

# real samples whose replays hold iterations of a model (2 to 6 each), one node each
NODES = {
    "gpu-a": "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "gpu-b": "kineto-hta/trace_diff_control_control.json.gz",
    "gpu-c": "kineto-hta/trace_diff_test_test.json.gz",
    "gpu-d": "kineto-hta/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
}


def p95(latencies: pd.Series) -> float:
    """The exact p95 of one group: numpy's linear interpolation, as DuckDB's quantile_cont."""
    return float(np.percentile(latencies.to_numpy(dtype=np.float64), 95))


def test_dask_on_a_local_cluster_agrees_with_duckdb_on_each_models_p95(
    tmp_path, aaco_bin, samples, seaweed, monkeypatch
):
    try:
        import dask.dataframe as dd
        import distributed
        from fsspec.implementations.arrow import ArrowFSWrapper
    except ImportError as exc:
        skip_or_fail(f"Dask is not installed ({exc}): pip install -e '.[dev]' (dask[dataframe], distributed)")
    _, url = lake_in_bucket(aaco_bin, samples, seaweed, tmp_path, NODES)
    fs = ArrowFSWrapper(seaweed.filesystem())
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        workers = set(client.scheduler_info()["workers"])
        assert len(workers) == 2
        its = dd.read_parquet(
            f"{url.removeprefix('s3://')}/iterations", filesystem=fs, columns=["start_ns", "end_ns", "model", "node"]
        )
        assert its.npartitions == len(NODES)  # one part per node, read by the workers from the store
        its = its[its.model.notnull()]
        its = its.assign(latency_s=(its.end_ns - its.start_ns) / 1e9, node=its.node.astype(str))
        by_group = its.groupby(["model", "node"]).latency_s.apply(p95, meta=("latency_s", "f8"))
        with distributed.get_task_stream(client) as stream:
            got = by_group.compute()
        ran_on = {task["worker"] for task in stream.data}
    assert stream.data and ran_on <= workers  # the graph ran on the cluster's workers
    dask_p95 = {(model, node): value for (model, node), value in got.items()}

    for name, value in seaweed.env.items():
        monkeypatch.setenv(name, value)
    with FleetLake.open(url).connect() as con:
        duck_p95 = {(r["model"], r["node"]): r["p95_s"] for r in queries.models(con)}
    assert sorted(n for _, n in duck_p95) == sorted(NODES)
    assert dask_p95.keys() == duck_p95.keys()
    for key, value in duck_p95.items():
        assert dask_p95[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
