"""Baseline figures and the regression verdict: exact statistics, and causes known from first principles."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from aaco.analyzers.baseline import model_profile, union_per_group
from aaco.analyzers.stats import evenly_spaced
from aaco.analyzers.verdict import (
    RECOMMENDATIONS,
    VerdictInputError,
    compare,
    evidence,
    fmt_pct,
    latency_test,
    severity,
)
from aaco.contract.schemas import conform

MS, US = 1_000_000, 1_000


def test_separated_samples_have_the_exact_mann_whitney_p_value():
    # Every session latency exceeds every baseline one: U = 25, and under H0 each of the C(10, 5) = 252
    # rank arrangements is equally likely, so the exact one-sided p-value is 1/252.
    base = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    sess = np.array([6.0, 7.0, 8.0, 9.0, 10.0])
    t = latency_test(base, sess)
    assert t["p_value"] == pytest.approx(1 / 252)
    assert t["latency_delta_pct"] == pytest.approx((8 / 3 - 1) * 100, abs=0.01)
    # any resample's session median is >= 6 and baseline median <= 5: the interval lies in [+20 %, +900 %]
    lo, hi = t["latency_delta_ci95_pct"]
    assert 20 <= lo <= t["latency_delta_pct"] <= hi <= 900
    assert t["regression"] is True and t["confidence"] == 1.0


def test_a_scaled_sample_has_the_exact_median_delta_and_scipys_p_value():
    rng = np.random.default_rng(7)
    base = rng.lognormal(np.log(0.010), 0.2, 400)
    sess = base * 1.2  # every latency 20 % longer
    t = latency_test(base, sess)
    assert t["latency_delta_pct"] == pytest.approx(20.0)
    assert t["p_value"] == pytest.approx(stats.mannwhitneyu(sess, base, alternative="greater").pvalue)
    lo, hi = t["latency_delta_ci95_pct"]
    assert lo < 20.0 < hi and lo > 5.0
    assert t["regression"] is True
    # deterministic: the same inputs give the same interval (CI runs are reproducible)
    assert latency_test(base, sess)["latency_delta_ci95_pct"] == t["latency_delta_ci95_pct"]


def test_identical_samples_are_no_regression():
    base = np.linspace(0.010, 0.012, 50)
    t = latency_test(base, base.copy())
    assert t["latency_delta_pct"] == 0.0
    assert t["regression"] is False and t["improvement"] is False
    assert t["p_value"] > 0.4
    assert t["confidence"] >= 0.9  # nearly every replicate stays under +5 %


def test_significant_but_small_is_not_a_regression_and_faster_is_an_improvement():
    rng = np.random.default_rng(3)
    base = rng.normal(0.010, 0.0002, 2000)
    small = latency_test(base, base * 1.02)  # 2 %: detectable with 2,000 samples, under the 5 % threshold
    assert small["p_value"] < 0.01 and small["regression"] is False
    assert latency_test(base, base * 1.02, min_delta_pct=1.0)["regression"] is True
    faster = latency_test(base, base * 0.8)
    assert faster["regression"] is False and faster["improvement"] is True and faster["latency_delta_pct"] < -19


def test_too_few_samples_is_an_input_error():
    with pytest.raises(VerdictInputError, match="at least 5"):
        latency_test(np.ones(3), np.ones(10))


def test_severity_bands():
    assert [severity(d, True) for d in (3, 5, 14.9, 15, 49, 50)] == [
        "low",
        "medium",
        "medium",
        "high",
        "high",
        "critical",
    ]
    assert severity(80, False) == "none"


def test_union_per_group_counts_overlap_once_and_keeps_groups_apart():
    # group 0: [0,10) and [5,15) -> 15; group 1: [100,110) inside and [120,130) -> 20; group 2: [3,4) -> 1.
    # Group 1 starts before group 0 ends in absolute time would not matter: each is its own union.
    codes = np.array([1, 0, 0, 1, 2, 1])
    starts = np.array([100, 0, 5, 120, 3, 102])
    ends = np.array([110, 10, 15, 130, 4, 108])
    assert union_per_group(codes, starts, ends) == 15 + 20 + 1
    assert union_per_group(np.array([], dtype=np.int64), np.array([]), np.array([])) == 0


def test_evenly_spaced_keeps_all_or_spreads_evenly():
    x = np.arange(100.0)
    assert evenly_spaced(x, 200) is x
    kept = evenly_spaced(x, 10)
    assert kept.size == 10 and kept[0] == 0 and kept[-1] == 99 and np.all(np.diff(kept) > 0)


def _lake_tables(n_it: int, length_ns: int, kernels_per_it: list[tuple[str, str, int]], model: str = "m"):
    """Iterations of ``length_ns`` and, in each, kernels (name, kind, duration) back to back."""
    it = conform(
        "iterations",
        {
            "start_ns": pa.array([i * length_ns for i in range(n_it)], pa.int64()),
            "end_ns": pa.array([(i + 1) * length_ns for i in range(n_it)], pa.int64()),
            "node": ["n"] * n_it,
            "pid": pa.array([1] * n_it, pa.int64()),
            "model": [model] * n_it,
            "run_id": ["r"] * n_it,
            "trace_id": [f"{i:032x}" for i in range(n_it)],
            "span_id": [f"{i:016x}" for i in range(n_it)],
            "source": ["t"] * n_it,
        },
    )
    rows: dict[str, list] = {k: [] for k in ("start_ns", "end_ns", "name", "kind", "trace_id")}
    for i in range(n_it):
        t = i * length_ns
        for name, kind, dur in kernels_per_it:
            rows["start_ns"].append(t), rows["end_ns"].append(t + dur)
            rows["name"].append(name), rows["kind"].append(kind), rows["trace_id"].append(f"{i:032x}")
            t += dur
    n = len(rows["name"])
    k = conform(
        "kernels",
        {
            **{c: pa.array(v, pa.int64()) for c, v in rows.items() if c.endswith("_ns")},
            "node": ["n"] * n,
            "pid": pa.array([1] * n, pa.int64()),
            "tid": pa.array([1] * n, pa.int64()),
            "device": ["0"] * n,
            "stream": pa.array([0] * n, pa.int64()),
            "name": rows["name"],
            "kind": rows["kind"],
            "correlation_id": pa.array(range(n), pa.int64()),
            "source": ["t"] * n,
            "model": [model] * n,
            "trace_id": rows["trace_id"],
        },
    )
    return pa.Table.from_batches([it]), pa.Table.from_batches([k])


def test_model_profile_figures():
    it, k = _lake_tables(10, 10 * MS, [("Cijk_gemm", "kernel", 4 * MS), ("Memcpy HtoD", "memcpy", 2 * MS)])
    p = model_profile(it, k, "m")
    assert p["iterations"] == 10 and len(p["latency_s"]) == 10
    assert p["latency"]["p50_s"] == pytest.approx(0.010)
    assert p["kernels_per_iteration"] == 1.0 and p["events_per_iteration"] == {"kernel": 1.0, "memcpy": 1.0}
    assert p["avg_kernel_duration_us"] == pytest.approx(4000)
    assert p["family_time_per_iteration_s"] == pytest.approx({"gemm": 0.004, "memcpy": 0.002})
    assert p["busy_per_iteration_s"] == pytest.approx(0.006)
    assert p["host_gap_per_iteration_s"] == pytest.approx(0.004)
    assert p["cpu_overhead_ratio"] is None  # no launch calls in these kernels
    assert p["microkernel_pct"] == 0.0


def profile(lat_ms: float, families: dict[str, float], gap_ms: float, kpi: float, dur_us: float, n: int = 30) -> dict:
    """A profile: ``n`` latencies around ``lat_ms`` (+-1 %), per-iteration family time (ms), host gap."""
    lat = lat_ms / 1e3 * (1 + 0.01 * np.sin(np.arange(n)))
    return {
        "iterations": n,
        "latency_s": lat.tolist(),
        "latency": {"mean_s": float(lat.mean()), "p50_s": float(np.median(lat))},
        "kernels_per_iteration": kpi,
        "avg_kernel_duration_us": dur_us,
        "busy_per_iteration_s": sum(families.values()) / 1e3,
        "host_gap_per_iteration_s": gap_ms / 1e3,
        "family_time_per_iteration_s": {f: v / 1e3 for f, v in families.items()},
    }


BASE = profile(10.0, {"gemm": 6.0, "elementwise": 2.0}, 2.0, 100, 80.0)


def test_cause_compute_bound():
    """The GEMMs take 3 ms more per iteration and nothing else moved: more arithmetic."""
    v = compare(BASE, profile(13.0, {"gemm": 9.0, "elementwise": 2.0}, 2.0, 100, 110.0))
    assert v["regression"] and v["suspected_cause"] == "compute-bound"
    assert v["latency_delta_pct"] == pytest.approx(30.0, abs=0.5)
    assert v["severity"] == "high" and v["recommendation"] == RECOMMENDATIONS["compute-bound"]
    assert v["attribution_per_iteration_s"]["compute_kernels_s"] == pytest.approx(0.003)


def test_cause_memory_bound():
    """A 4 ms copy appeared in every iteration: the time went to moving data."""
    v = compare(BASE, profile(14.0, {"gemm": 6.0, "elementwise": 2.0, "memcpy": 4.0}, 2.0, 100, 80.0))
    assert v["suspected_cause"] == "memory-bound"
    assert v["evidence"]["family_time_delta"]["memcpy"] == "new"


def test_cause_launch_bound():
    """Kernels per iteration x1.67 and each 35 % shorter (the seeds' example: a graph split into more,
    smaller kernels); the GPU does the same work but waits 2 ms more on the host issuing them."""
    v = compare(BASE, profile(12.0, {"gemm": 6.0, "elementwise": 2.0}, 4.0, 167, 52.0))
    assert v["suspected_cause"] == "launch-bound"
    assert v["evidence"]["kernel_launch_count_delta"] == "+67%"
    assert v["evidence"]["avg_kernel_duration_delta"] == "-35%"
    assert v["recommendation"].startswith("More and shorter kernels per iteration: investigate graph partitioning")


def test_cause_cpu_bound():
    """Same kernels, same count, 3 ms more waiting on the host: host-side work, not launches."""
    v = compare(BASE, profile(13.0, {"gemm": 6.0, "elementwise": 2.0}, 5.0, 100, 80.0))
    assert v["suspected_cause"] == "CPU-bound"


def test_cause_throttled():
    """Every family slower by the same factor and the compute clock 25 % lower: the GPU ran slower."""
    env_b = {"clocks": {"value": {"graphics": {"median_hz": 1.7e9, "max_hz": 1.7e9}}}}
    env_s = {"clocks": {"value": {"graphics": {"median_hz": 1.275e9, "max_hz": 1.7e9}}}}
    v = compare(BASE, profile(12.7, {"gemm": 8.0, "elementwise": 2.7}, 2.0, 100, 107.0), env_b, env_s)
    assert v["suspected_cause"] == "throttled"
    assert v["clock_drop"] == pytest.approx(0.25)


def test_no_regression_has_no_cause():
    v = compare(BASE, profile(10.0, {"gemm": 6.0, "elementwise": 2.0}, 2.0, 100, 80.0))
    assert v["regression"] is False and v["severity"] == "none"
    assert v["suspected_cause"] is None and v["recommendation"] is None
    assert v["latency_delta_pct"] == 0.0


def test_verdict_has_the_seeds_shape():
    v = compare(BASE, profile(13.0, {"gemm": 9.0, "elementwise": 2.0}, 2.0, 100, 110.0))
    for key, kind in (
        ("regression", bool),
        ("severity", str),
        ("confidence", float),
        ("latency_delta_pct", float),
        ("suspected_cause", str),
        ("evidence", dict),
        ("recommendation", str),
    ):
        assert isinstance(v[key], kind), key
    assert {"kernel_launch_count_delta", "avg_kernel_duration_delta"} <= set(v["evidence"])
    assert len(v["latency_delta_ci95_pct"]) == 2 and 0 <= v["p_value"] <= 1


def test_evidence_formatting():
    assert fmt_pct(67.2) == "+67%" and fmt_pct(-35.4) == "-35%" and fmt_pct(None) == "n/a"
    ev = evidence({"cpu_overhead_ratio": 0.25, "kernels_per_iteration": 0}, {"cpu_overhead_ratio": 0.305})
    assert ev["cpu_overhead_delta"] == "+22%"
    assert ev["kernel_launch_count_delta"] == "n/a"  # no baseline count to compare with
