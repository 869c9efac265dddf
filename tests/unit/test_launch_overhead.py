"""HTA's launch measures, streaming: launch delay, short kernels, outliers, per stream and per iteration."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from aaco.analyzers.launch import LaunchAnalyzer
from aaco.analyzers.launch_overhead import (
    DELAY_OUTLIERS,
    LAUNCH_CPU,
    LAUNCH_DELAY,
    LAUNCH_DELAY_BUCKETS,
    RUNTIME_OUTLIERS,
    SHORT_KERNELS,
)

from .builders import assert_points_valid, item, kernels

US = 1000


def launched(specs, model="m", node="node-a", run_id="r", iterations=None, streams=None):
    """Kernels from (launch_start_us, launch_dur_us, delay_us, gpu_dur_us) specs; delay may be negative."""
    ls, le, ks, ke = [], [], [], []
    for l0, ldur, delay, gdur in specs:
        ls.append(l0 * US)
        le.append((l0 + ldur) * US)
        ks.append((l0 + ldur + delay) * US)
        ke.append((l0 + ldur + delay + gdur) * US)
    n = len(specs)
    cols = {
        "launch_start_ns": ls,
        "launch_end_ns": le,
        "model": [model] * n,
        "node": [node] * n,
        "run_id": [run_id] * n,
    }
    if iterations is not None:
        cols["iteration"] = iterations
    if streams is not None:
        cols["stream"] = streams
    return item("kernels", kernels(ks, ke, **cols), source="src")


def overhead(a: LaunchAnalyzer, model="m"):
    return a.snapshot().to_dict()["models"][model]["launch_overhead"]


def test_hta_definitions():
    a = LaunchAnalyzer()
    a.update(
        launched(
            [
                (0, 10, 5, 2),  # short: gpu 2 < cpu 10 <= 50
                (100, 10, -3, 20),  # kernel starts before its launch call returns: delay clipped to 0
                (200, 60, 0, 5),  # runtime outlier (cpu 60 > 50), not short (cpu above the cutoff)
                (400, 5, 150, 50),  # delay outlier (150 > 100)
                (600, 50, 100, 50),  # on both cutoffs: neither outlier (strictly greater), not short (gpu == cpu)
            ]
        )
    )
    o = overhead(a)
    assert o["launched"] == o["kernels"] == 5
    assert o["short_kernels"] == 1
    assert o["runtime_outliers"] == 1
    assert o["delay_outliers"] == 1
    assert o["mean_delay_us"] == pytest.approx((5 + 0 + 0 + 150 + 100) / 5)
    assert o["launch_cpu_s"] == pytest.approx((10 + 10 + 60 + 5 + 50) * 1e-6)
    assert o["max_delay_us"] == 150


def test_kernels_without_launch_calls_are_counted_but_not_measured():
    a = LaunchAnalyzer()
    a.update(item("kernels", kernels([0, 10_000], model=["m", "m"], run_id=["r", "r"])))
    assert overhead(a) is None
    a.update(launched([(0, 10, 5, 2)]))
    o = overhead(a)
    assert (o["kernels"], o["launched"]) == (3, 1)


def test_delay_quantiles_within_five_percent():
    rng = np.random.default_rng(7)
    delays = rng.lognormal(mean=3.0, sigma=1.2, size=5000).round(3)
    a = LaunchAnalyzer()
    specs = [(i * 10_000, 5, float(d), 1) for i, d in enumerate(delays)]
    for k in range(0, len(specs), 1000):
        a.update(launched(specs[k : k + 1000]))
    q = overhead(a)["delay_quantiles_us"]
    for label, p in (("p50", 50), ("p90", 90), ("p99", 99)):
        exact = float(np.percentile(delays, p))
        assert q[label] == pytest.approx(exact, rel=0.05), (label, q[label], exact)


def test_per_stream_and_recent_iterations():
    a = LaunchAnalyzer()
    a.update(
        launched(
            [(0, 10, 5, 2), (20, 10, 200, 2), (40, 60, 1, 1), (400, 5, 1, 1)],
            streams=[7, 7, 20, 20],
            iterations=[0, 0, 1, None],
        )
    )
    o = overhead(a)
    streams = {s["stream"]: s for s in o["streams"]}
    assert set(streams) == {7, 20}
    assert streams[7]["kernels"] == 2 and streams[7]["delay_outliers"] == 1 and streams[7]["short_kernels"] == 2
    assert streams[20]["runtime_outliers"] == 1
    its = {(r["run_id"], r["iteration"]): r for r in o["recent_iterations"]}
    assert set(its) == {("r", 0), ("r", 1)}  # the kernel outside any iteration is in no iteration's row
    assert its[("r", 0)]["kernels"] == 2 and its[("r", 0)]["mean_delay_us"] == pytest.approx(102.5)


def test_bounded_streams_and_iterations():
    a = LaunchAnalyzer()
    n = 200
    a.update(launched([(i * 100, 5, 1, 1) for i in range(n)], streams=list(range(n)), iterations=list(range(n))))
    o = overhead(a)
    assert len(o["streams"]) == 64 and o["streams_dropped"] == n - 64
    assert len(o["recent_iterations"]) == 32
    assert [r["iteration"] for r in o["recent_iterations"]] == list(range(n - 32, n))
    assert o["kernels"] == n  # totals keep everything


def test_groups_are_kept_apart_and_points_valid():
    a = LaunchAnalyzer()
    both = launched([(0, 10, 5, 2)], model="a")
    a.update(both)
    a.update(launched([(0, 10, 500, 2), (100, 100, 0, 1)], model="b"))
    assert overhead(a, "a")["delay_outliers"] == 0
    assert overhead(a, "b")["delay_outliers"] == 1 and overhead(a, "b")["runtime_outliers"] == 1
    pts = a.snapshot().points()
    assert_points_valid(pts)
    by = {(p.metric.prom_name, p.labels["model"]): p.value for p in pts if "model" in p.labels}
    assert by[(SHORT_KERNELS.prom_name, "a")] == 1
    assert by[(RUNTIME_OUTLIERS.prom_name, "b")] == 1
    assert by[(DELAY_OUTLIERS.prom_name, "b")] == 1
    assert by[(LAUNCH_CPU.prom_name, "b")] == pytest.approx(110e-6)
    hist = by[(LAUNCH_DELAY.prom_name, "b")]
    assert hist.count == 2 and hist.total == pytest.approx(500e-6)
    # cumulative: 0 s delay in every bucket, 500 us only from the 0.5 ms bucket on
    assert hist.bucket_counts == tuple(1 if b < 500e-6 else 2 for b in LAUNCH_DELAY_BUCKETS)


def test_mixed_groups_in_one_batch():
    a = LaunchAnalyzer()
    one = launched([(0, 10, 5, 2), (10, 10, 5, 2)], model="a").batch
    two = launched([(0, 10, 300, 2)], model="b").batch

    mixed = pa.concat_tables([pa.Table.from_batches([one]), pa.Table.from_batches([two])]).combine_chunks()
    a.update(item("kernels", mixed.to_batches()[0], source="src"))
    assert overhead(a, "a")["launched"] == 2 and overhead(a, "a")["delay_outliers"] == 0
    assert overhead(a, "b")["launched"] == 1 and overhead(a, "b")["delay_outliers"] == 1
