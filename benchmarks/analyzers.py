"""Every analyzer of the agent together over 2,000,000+ kernel events: events per second (goal >= 2M/s).

The analyzers are the agent's own list (``build_analyzers`` on the default configuration, derived
ones included), driven by the pipeline's ``dispatch`` and ``publish_snapshot`` exactly as the agent
drives them, with no exporters. The workload is a training-like stream, already correlated as the
correlator leaves it: iterations of 1,000 kernels each (names from the real samples' libraries,
two streams, launch calls with delays), a GPU telemetry reading set every 100 ms, and a snapshot
every 1,000,000 events (the agent snapshots every 5 s, so this is more often than live).

Baseline, same batches, same run: the floor any kernel breakdown pays, a single pyarrow pass that
groups each batch by kernel name and sums durations. The ratio (floor time / analyzers' time) says
what the full set of analyses costs over that one aggregation. Generating the batches is not timed.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.config import AgentConfig
from aaco.agent.pipeline.bus import Bus
from aaco.agent.pipeline.correlator import Correlator
from aaco.agent.pipeline.worker import ANALYZER_ERRORS, Pipeline
from aaco.agent.service import build_analyzers
from aaco.contract.ids import span_id, trace_id
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.stats import Stats

NAMES = [
    "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>",
    "ampere_sgemm_32x32_sliced1x4_tn",
    "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps>>",
    "fmha_fwd_kernel",
    "void at::native::(anonymous namespace)::softmax_warp_forward",
    "ncclDevKernel_AllReduce_Sum_f16_RING_LL",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel",
]
NODE = "bench-node"
MODEL = "bench-model"
RUN = "bench-run"
T0 = 1_795_000_000_000_000_000
BATCH = 65_536


def workload(n_events: int, per_iteration: int, seed: int = 1) -> list[EventBatch]:
    """Iterations, kernels (batches of 64k rows, in time order) and telemetry, interleaved as live."""
    rng = np.random.default_rng(seed)
    n_it = n_events // per_iteration
    n = n_it * per_iteration
    gpu_ns = rng.lognormal(np.log(8_000), 1.0, n).astype(np.int64) + 1_000
    gap_ns = rng.integers(500, 5_000, n)
    start = T0 + np.cumsum(gpu_ns + gap_ns) - gpu_ns
    end = start + gpu_ns
    it = np.arange(n) // per_iteration
    launch_end = start - rng.integers(0, 150_000, n)
    launch_start = launch_end - rng.integers(3_000, 20_000, n)
    names = pa.DictionaryArray.from_arrays(pa.array(np.arange(n) % len(NAMES), pa.int32()), pa.array(NAMES))
    kinds = np.where(np.arange(n) % 97 == 0, "memcpy", "kernel")
    first = np.searchsorted(it, np.arange(n_it))
    last = np.append(first[1:], n) - 1
    it_start, it_end = start[first] - 10_000, end[last] + 10_000
    tids = [trace_id(NODE, RUN, i) for i in range(n_it)]
    sids = [span_id(NODE, RUN, i) for i in range(n_it)]

    items: list[EventBatch] = []
    it_done = 0
    next_tel = int(start[0])
    for lo in range(0, n, BATCH):
        hi = min(lo + BATCH, n)
        it_hi = int(it[hi - 1]) + 1
        if it_hi > it_done:
            sl = slice(it_done, it_hi)
            items.append(
                EventBatch(
                    "iterations",
                    conform(
                        "iterations",
                        {
                            "start_ns": it_start[sl],
                            "end_ns": it_end[sl],
                            "node": [NODE] * (it_hi - it_done),
                            "pid": np.full(it_hi - it_done, 42),
                            "model": [MODEL] * (it_hi - it_done),
                            "run_id": [RUN] * (it_hi - it_done),
                            "trace_id": tids[sl],
                            "span_id": sids[sl],
                            "source": ["bench"] * (it_hi - it_done),
                            "iteration": np.arange(it_done, it_hi),
                        },
                    ),
                    "bench",
                )
            )
            it_done = it_hi
        k = slice(lo, hi)
        m = hi - lo
        items.append(
            EventBatch(
                "kernels",
                conform(
                    "kernels",
                    {
                        "start_ns": start[k],
                        "end_ns": end[k],
                        "node": [NODE] * m,
                        "pid": np.full(m, 42),
                        "tid": np.full(m, 43),
                        "device": ["0"] * m,
                        "stream": (np.arange(lo, hi) % 2) * 13 + 7,
                        "name": names[lo:hi].cast(pa.string()),
                        "kind": kinds[k],
                        "correlation_id": np.arange(lo, hi),
                        "source": ["bench"] * m,
                        "launch_start_ns": launch_start[k],
                        "launch_end_ns": launch_end[k],
                        "model": [MODEL] * m,
                        "run_id": [RUN] * m,
                        "iteration": it[k],
                        "trace_id": [tids[i] for i in it[k]],
                    },
                ),
                "bench",
            )
        )
        tel_ts = np.arange(next_tel, int(end[hi - 1]), 100_000_000)
        next_tel = int(tel_ts[-1]) + 100_000_000 if tel_ts.size else next_tel
        if tel_ts.size:
            items.append(EventBatch("telemetry", telemetry(tel_ts, rng), "bench"))
    return items


def telemetry(ts: np.ndarray, rng: np.random.Generator) -> pa.RecordBatch:
    """One reading set per timestamp for GPU 0: utilization, power, temperature, clocks, throttle."""
    rows: dict[str, list] = {k: [] for k in ("ts_ns", "node", "device", "metric", "value", "unit", "attributes")}
    for t in ts.tolist():
        clock = float(rng.choice([1.7e9, 1.2e9], p=[0.9, 0.1]))
        throttled = clock < 1.5e9
        for metric, value, unit, attrs in (
            ("hw.gpu.utilization", 0.95, "1", []),
            ("hw.power", 560.0 if throttled else 420.0, "W", []),
            ("hw.temperature", 71.0, "Cel", [("sensor", "junction")]),
            ("aaco.gpu.clock.frequency", clock, "Hz", [("clock", "graphics")]),
            ("aaco.gpu.clock.max", 1.7e9, "Hz", [("clock", "graphics")]),
            ("aaco.gpu.throttle.active", 1.0 if throttled else 0.0, "1", [("reason", "power")]),
        ):
            for col, v in zip(rows, (t, NODE, "0", metric, value, unit, attrs), strict=True):
                rows[col].append(v)
    table = pa.table(
        {
            **{k: v for k, v in rows.items() if k != "attributes"},
            "attributes": pa.array(rows["attributes"], pa.map_(pa.string(), pa.string())),
        }
    )
    return conform("telemetry", table)


def run_analyzers(items: list[EventBatch], snapshot_every: int) -> tuple[float, Stats, dict]:
    """Dispatch every batch through the agent's analyzers; seconds taken, stats, the last snapshot."""
    stats = Stats()
    config = AgentConfig()
    pipeline = Pipeline(Bus(stats), Correlator(stats), build_analyzers(config), [], stats, NODE)
    since = 0
    t0 = time.perf_counter()
    for item in items:
        pipeline.dispatch(item)
        if item.kind == "kernels":
            since += item.batch.num_rows
            if since >= snapshot_every:
                pipeline.publish_snapshot()
                since = 0
    snap = pipeline.publish_snapshot()
    return time.perf_counter() - t0, stats, snap.to_dict()


def floor(items: list[EventBatch]) -> float:
    """Seconds for one pyarrow group-by-name of durations per kernels batch."""
    t0 = time.perf_counter()
    for item in items:
        if item.kind != "kernels":
            continue
        b = item.batch
        dur = pc.subtract(b.column("end_ns"), b.column("start_ns"))
        pa.table({"name": b.column("name"), "dur": dur}).group_by("name").aggregate([("dur", "sum")])
    return time.perf_counter() - t0


def main() -> None:
    """Run the benchmark and print one JSON line."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_097_152, help="Kernel events (default 2,097,152).")
    ap.add_argument("--per-iteration", type=int, default=1000, help="Kernels per iteration.")
    ap.add_argument("--rounds", type=int, default=3, help="Rounds; the median is reported.")
    args = ap.parse_args()
    items = workload(args.events, args.per_iteration)
    kernels = sum(i.batch.num_rows for i in items if i.kind == "kernels")
    others = sum(i.batch.num_rows for i in items if i.kind != "kernels")
    ours, base = [], []
    for _ in range(args.rounds):
        base.append(floor(items))
        secs, stats, doc = run_analyzers(items, 1_000_000)
        ours.append(secs)
    errors = int(stats.total(ANALYZER_ERRORS))
    analyzers = sorted(k for k in doc if k not in ("generated_at_ns", "node", "findings"))
    t_ours, t_base = float(np.median(ours)), float(np.median(base))
    print(
        json.dumps(
            {
                "benchmark": "analyzers",
                "kernel_events": kernels,
                "other_events": others,
                "analyzers": analyzers,
                "analyzer_errors": errors,
                "rounds": args.rounds,
                "seconds": round(t_ours, 3),
                "events_per_s": round(kernels / t_ours),
                "goal_events_per_s": 2_000_000,
                "meets_goal": kernels / t_ours >= 2_000_000,
                "baseline": "pyarrow group-by name, sum of durations, per batch",
                "baseline_seconds": round(t_base, 3),
                "baseline_events_per_s": round(kernels / t_base),
                "ratio_baseline_time_over_ours": round(t_base / t_ours, 4),
                "families_iterations": doc.get("families", {}).get("models", {}).get(MODEL, {}).get("iterations"),
            }
        )
    )


if __name__ == "__main__":
    main()
