"""Drift: the CUSUM and EWMA detectors (robust baseline, re-baselining) and the streaming drift analyzer."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aaco.analyzers.drift import DETECTORS, ChangePoint, Cusum, Ewma
from aaco.analyzers.drift_analyzer import DriftAnalyzer
from aaco.analyzers.drift_baseline import Baseline, matched_interval, siegmund_arl
from aaco.contract.ids import trace_id
from aaco.contract.schemas import conform
from aaco.contract.serving import request_series

from .builders import assert_points_valid, item, iterations, kernels


def gaussian(seed: int, n: int, level: float = 100.0, sd: float = 5.0) -> np.ndarray:
    return level + sd * np.random.default_rng(seed).standard_normal(n)


def step(seed: int, at: int, n: int, shift_sigmas: float) -> np.ndarray:
    x = gaussian(seed, n)
    x[at:] += 5.0 * shift_sigmas
    return x


# --- detectors ---------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(
    value=st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False),
    n=st.integers(min_value=0, max_value=1500),
    kind=st.sampled_from(sorted(DETECTORS)),
)
def test_a_constant_series_never_alarms(value, n, kind):
    det = DETECTORS[kind]()
    assert det.run([value] * n) == []
    if n >= det.warmup:
        assert det.monitoring and det.baseline is not None and det.baseline.median == value


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    shifts=st.lists(st.floats(min_value=-4, max_value=4), min_size=1, max_size=4),
    kind=st.sampled_from(sorted(DETECTORS)),
    cut=st.integers(min_value=0, max_value=1500),
)
def test_run_equals_repeated_update(seed, shifts, kind, cut):
    rng = np.random.default_rng(seed)
    x = np.concatenate([s + rng.standard_normal(300) for s in shifts]).tolist()
    x[cut % len(x)] = float("nan")
    by_run = DETECTORS[kind]().run(x)
    det = DETECTORS[kind]()
    by_update = [cp for v in x if (cp := det.update(v)) is not None]
    assert by_run == by_update
    # and run continues a stream: two halves give the same as the whole
    det2 = DETECTORS[kind]()
    half = len(x) // 2
    assert det2.run(x[:half]) + det2.run(x[half:]) == by_run


@pytest.mark.parametrize("kind", ["cusum", "ewma"])
@pytest.mark.parametrize("shift", [1.0, -1.0, 2.0])
def test_a_step_is_found_once_with_its_direction_place_and_size(kind, shift):
    x = step(seed=4, at=1000, n=2500, shift_sigmas=shift)
    cps = DETECTORS[kind]().run(x.tolist())
    assert len(cps) == 1, cps
    cp = cps[0]
    assert cp.direction == ("up" if shift > 0 else "down")
    assert 1000 <= cp.detected_at <= 1060  # detected after the step, within a few dozen values
    assert abs(cp.index - 1000) <= (10 if kind == "cusum" else 20)  # the estimated start of the new level
    assert cp.delay == cp.detected_at - cp.index
    assert abs(cp.baseline - 100.0) < 1.0 and abs(cp.sigma - 5.0) < 0.8
    # the median of the few values between the estimated change and the alarm: noisy, and biased away from
    # the baseline (the alarm fires when they run high), so within a sigma
    assert abs(cp.new_level - (100.0 + 5.0 * shift)) < 5.0
    assert cp.magnitude == pytest.approx(abs(cp.new_level - cp.baseline) / cp.sigma)
    assert cp.ratio == pytest.approx(cp.new_level / cp.baseline)
    assert cp.to_dict()["direction"] == cp.direction and cp.to_dict()["ratio"] == cp.ratio


def test_re_baselines_after_an_alarm_and_finds_the_way_back():
    x = gaussian(5, 3000)
    x[1000:2000] += 10.0  # 2 sigma up, then back
    det = Cusum()
    found = []
    for i, v in enumerate(x.tolist()):
        cp = det.update(v)
        if cp is not None:
            found.append(cp)
            # silent while it learns the new level from the values since the estimated change
            assert not det.monitoring or i - cp.index + 1 >= det.warmup
    assert [c.direction for c in found] == ["up", "down"]
    assert abs(found[0].index - 1000) <= 10 and abs(found[1].index - 2000) <= 10
    assert abs(found[1].baseline - 110.0) < 1.5  # the second change is measured from the new level
    assert det.monitoring and abs(det.baseline.median - 100.0) < 1.5


def test_isolated_spikes_do_not_alarm():
    x = gaussian(11, 6000)
    x[200::40] += 500.0  # 100-sigma outliers, one every 40 values
    x[3000:3003] += 500.0  # and a burst of three in a row: each adds at most clip - k = 2.5 < h / 3
    assert Cusum().run(x.tolist()) == []


def test_a_flat_series_that_moves_alarms_within_four_values():
    x = [415.0] * 300 + [430.0] * 50  # kernels per iteration: constant, then 15 more
    (cp,) = Cusum().run(x)
    assert cp.index == 300 and cp.detected_at <= 303 and cp.direction == "up"
    assert cp.baseline == 415.0 and cp.new_level == 430.0 and cp.ratio == pytest.approx(430 / 415)
    assert cp.sigma == pytest.approx(0.005 * 415)  # the relative floor: the MAD of a constant is 0


def test_immaterial_moves_of_a_flat_series_do_not_alarm():
    x = [1000.0] * 300 + [1001.0] * 300  # 0.1 %: below the 0.5 % floor's clip
    cps = Cusum().run(x)
    assert cps == [] or all(c.magnitude < 1.0 for c in cps)
    assert Cusum().run([1000.0] * 300 + [1000.5, 999.5] * 200) == []


def test_baseline_modes_and_skew():
    rng = np.random.default_rng(2)
    skewed = Baseline.fit(np.exp(rng.standard_normal(500)), clip=3.0, min_rel_scale=0.005)
    assert skewed.mode == "ranks"
    # normal scores are symmetric whatever the skew: a value at the window's 99th percentile scores like -the 1st
    hi, lo = np.quantile(skewed.sorted_values, [0.99, 0.01])
    assert skewed.standardise(hi) == pytest.approx(-skewed.standardise(lo), abs=0.1)
    assert abs(skewed.standardise(1e12)) <= 3.0  # bounded
    flat = Baseline.fit(np.full(200, 7.0), clip=3.0, min_rel_scale=0.005)
    assert flat.mode == "scale" and flat.standardise(7.0) == 0.0 and flat.standardise(100.0) == 3.0


def test_autocorrelation_is_whitened_and_white_noise_is_left_alone():
    rng = np.random.default_rng(4)
    e = rng.standard_normal(500)
    ar = np.empty(500)
    prev = 0.0
    for i in range(500):
        prev = 0.6 * prev + e[i]
        ar[i] = prev
    b = Baseline.fit(ar, clip=3.0, min_rel_scale=0.0)
    assert 0.45 < b.rho < 0.75 and b.shift_scale == pytest.approx(math.sqrt((1 - b.rho) / (1 + b.rho)))
    # the chart input is the AR(1) innovation: a value that continues its predecessor's excursion scores less
    assert b.whiten(1.0, 1.0) == pytest.approx((1.0 - b.rho) / math.sqrt(1.0 - b.rho**2))
    u = [b.whiten(b.score(x), b.score(p)) for p, x in itertools.pairwise(ar)]
    assert abs(np.corrcoef(u[1:], u[:-1])[0, 1]) < 0.15 and 0.8 < np.std(u) < 1.2  # white, unit variance
    white = Baseline.fit(rng.standard_normal(500), clip=3.0, min_rel_scale=0.0)
    assert white.rho == 0.0 and white.shift_scale == 1.0 and white.whiten(1.5, 2.0) == 1.5


def test_a_correlated_baseline_keeps_the_white_noise_run_length():
    # k scaled to a 1-sigma step's size in the innovations; h solved so Siegmund's in-control ARL is unchanged
    for k_new in (0.45, 0.29, 0.11):
        h_new = matched_interval(0.5, 9.0, k_new)
        assert siegmund_arl(k_new, h_new) == pytest.approx(siegmund_arl(0.5, 9.0), rel=1e-6)
        assert h_new > 9.0
    assert matched_interval(0.5, 9.0, 0.5) == 9.0
    rng = np.random.default_rng(5)
    ar = np.empty(3000)
    prev = 0.0
    for i, e in enumerate(rng.standard_normal(3000) * math.sqrt(0.75)):
        prev = 0.5 * prev + e
        ar[i] = prev
    det = Cusum()
    det.run((100.0 + 5.0 * ar).tolist())
    rho = det.baseline.rho
    assert 0.35 < rho < 0.65
    assert det.k_in_force == pytest.approx(0.5 * math.sqrt((1 - rho) / (1 + rho)))
    assert det.h_in_force == pytest.approx(matched_interval(0.5, 9.0, det.k_in_force, det.baseline.samples))
    assert det.h_in_force > matched_interval(0.5, 9.0, det.k_in_force)  # the fitted baseline's error is paid for


def test_the_baseline_follows_a_slow_trend():
    n = 20_000
    x = gaussian(8, n) + 5.0 * 2.0 * np.arange(n) / n  # 2 sigma over 20,000 values
    det = Cusum()
    det.run(x.tolist())
    assert abs(det.baseline.median - (100.0 + 10.0)) < 1.5  # it kept up (about 300 values behind)


def test_non_finite_values_are_skipped_but_keep_their_position():
    x = step(seed=3, at=1000, n=2000, shift_sigmas=2.0).tolist()
    clean = Cusum().run(x)
    x[500] = float("nan")
    x[501] = float("inf")
    det = Cusum()
    dirty = det.run(x)
    assert det.skipped == 2 and det.samples == 2000
    assert [c.index for c in dirty] == [c.index for c in clean]


def test_settings_are_checked():
    for bad in ({"warmup": 5}, {"warmup": 100, "window": 50}, {"lag": 0}, {"clip": 0}, {"k": -1}, {"h": 0}):
        with pytest.raises(ValueError):
            Cusum(**bad)
    with pytest.raises(ValueError):
        Ewma(lam=0)
    assert Cusum().params()["h"] == 9.0 and Ewma().params()["detector"] == "ewma"


def test_changepoint_ratio_without_a_positive_baseline():
    cp = ChangePoint(10, 20, "up", 2.0, 0.0, 1.0, 2.0, 9.5)
    assert cp.ratio is None and cp.delay == 10


# --- analyzer ----------------------------------------------------------------------------------


def latency_batch(lat_s: np.ndarray, model: str = "m", run_id: str = "run-1", t0: int = 10**18) -> pa.RecordBatch:
    ends = t0 + np.cumsum((lat_s * 1e9).astype(np.int64) + 1000)
    starts = ends - (lat_s * 1e9).astype(np.int64)
    return iterations(list(zip(starts.tolist(), ends.tolist(), strict=True)), model=model, run_id=run_id)


def points(result) -> dict:
    return {(p.metric.prom_name, tuple(sorted(p.labels.items()))): p.value for p in result.points()}


def test_latency_change_point_becomes_a_finding_with_evidence_and_metrics():
    lat = 0.010 + 0.0005 * np.random.default_rng(1).standard_normal(700)
    lat[400:] += 0.005  # 10 ms -> 15 ms
    a = DriftAnalyzer(hold_s=0.0)
    b = latency_batch(lat)
    a.update(item("iterations", b))
    (f,) = a.drain_findings()
    ev = f.evidence
    assert f.analyzer == "drift" and f.subject == "m" and f.node == "node-a"
    assert ev["series"] == "latency" and ev["direction"] == "up" and ev["unit"] == "s"
    assert ev["baseline"] == pytest.approx(0.010, rel=0.03) and ev["new_level"] == pytest.approx(0.015, rel=0.05)
    assert ev["ratio"] == pytest.approx(1.5, rel=0.06) and ev["magnitude_sigmas"] > 5
    assert f.severity == ("critical" if ev["ratio"] >= 1.5 else "warning")
    assert abs(ev["change_index"] - 400) <= 3 and 400 <= ev["detected_index"] <= 410
    rows = b.to_pylist()
    assert f.trace_id == rows[ev["detected_index"]]["trace_id"] == trace_id("node-a", "run-1", ev["detected_index"])
    assert f.ts_ns == rows[ev["detected_index"]]["end_ns"] == ev["detected_ts_ns"]
    assert ev["change_ts_ns"] == rows[ev["change_index"]]["end_ns"]
    assert ev["change_trace_id"] == rows[ev["change_index"]]["trace_id"]
    assert f"rose from {ev['baseline'] * 1e3:.3g} ms to {ev['new_level'] * 1e3:.3g} ms" in f.summary
    res = a.snapshot()
    assert_points_valid(res.points())
    pts = points(res)
    labels = (("model", "m"), ("node", "node-a"), ("series", "latency"))
    assert pts[("aaco_drift_changepoints", (("direction", "up"), *labels))] == 1.0
    assert pts[("aaco_drift_changepoints", (("direction", "down"), *labels))] == 0.0
    assert pts[("aaco_drift_active", labels)] == 0.0  # re-baselined (hold 0): back to normal
    (s,) = res.to_dict()["series"]
    assert s["state"] == "monitoring" and s["last_change"]["trace_id"] == f.trace_id


def test_active_from_the_alarm_until_re_baselined_and_the_hold_passed():
    lat = np.concatenate([np.full(300, 0.010), np.full(4, 0.020)])  # a flat series: alarms on the 4th
    a = DriftAnalyzer(hold_s=60.0)
    a.update(item("iterations", latency_batch(lat)))
    assert len(a.drain_findings()) == 1
    labels = (("model", "m"), ("node", "node-a"), ("series", "latency"))
    assert points(a.snapshot())[("aaco_drift_active", labels)] == 1.0
    assert a.snapshot().to_dict()["series"][0]["state"] == "rebaselining"
    # 300 more iterations of 20 ms: re-baselined after 200, but only 6 s of data time: still held
    a.update(item("iterations", latency_batch(np.full(300, 0.020), t0=10**18 + 10**9)))
    assert points(a.snapshot())[("aaco_drift_active", labels)] == 1.0
    assert a.snapshot().to_dict()["series"][0]["state"] == "monitoring"
    a.update(item("iterations", latency_batch(np.full(5, 0.020), t0=10**18 + 100 * 10**9)))
    assert points(a.snapshot())[("aaco_drift_active", labels)] == 0.0
    assert a.drain_findings() == []


def kernel_batch(per_iteration: list[int], first: int = 0, model: str = "m", dur_ns: int = 1000) -> pa.RecordBatch:
    starts, its, traces = [], [], []
    for j, n in enumerate(per_iteration, start=first):
        for k in range(n):
            starts.append(10**18 + j * 10**6 + k * 2000)
            its.append(j)
            traces.append(trace_id("node-a", "run-1", j))
    n = len(starts)
    b = kernels(starts, [s + dur_ns for s in starts])
    t = pa.Table.from_batches([b])
    for name, values, typ in (
        ("model", [model] * n, pa.string()),
        ("run_id", ["run-1"] * n, pa.string()),
        ("iteration", its, pa.int64()),
        ("trace_id", traces, pa.string()),
    ):
        t = t.set_column(t.schema.get_field_index(name), name, pa.array(values, typ))
    return conform("kernels", t)


def test_kernels_per_iteration_and_kernel_time_series():
    a = DriftAnalyzer()
    counts = [20] * 250 + [25] * 20
    # iterations split across batches: a batch boundary inside iteration 40
    b1 = kernel_batch([*counts[:40], 10])
    b2 = kernel_batch([10, *counts[41:]], first=40)
    a.update(item("kernels", b1))
    a.update(item("kernels", b2))
    found = {f.evidence["series"]: f for f in a.drain_findings()}
    assert set(found) == {"kernels_per_iteration", "kernel_time"}
    f = found["kernels_per_iteration"]
    assert f.evidence["baseline"] == 20.0 and f.evidence["new_level"] == 25.0 and f.evidence["change_index"] == 250
    assert f.severity == "warning" and f.trace_id == trace_id("node-a", "run-1", f.evidence["detected_index"])
    k = found["kernel_time"]
    assert k.evidence["baseline"] == pytest.approx(20e-6) and k.evidence["new_level"] == pytest.approx(25e-6)
    series = {s["series"]: s for s in a.snapshot().to_dict()["series"]}
    assert series["kernels_per_iteration"]["values"] == 268  # the last two iterations are still open
    assert series["kernels_per_iteration"]["changepoints"] == {"up": 1, "down": 0}


def test_models_are_bounded_and_drops_counted():
    a = DriftAnalyzer(max_models=2)
    for m in ("a", "b", "c"):
        a.update(item("iterations", latency_batch(np.full(10, 0.01), model=m)))
    res = a.snapshot()
    assert {s["model"] for s in res.to_dict()["series"]} == {"a", "b"}
    assert res.to_dict()["dropped"]["max_models"] == 10
    assert_points_valid(res.points())


def test_snapshots_are_immutable():
    a = DriftAnalyzer()
    a.update(item("iterations", latency_batch(np.full(250, 0.01))))
    before = a.snapshot()
    doc = before.to_dict()
    a.update(item("iterations", latency_batch(np.full(50, 0.03), t0=2 * 10**18)))
    assert before.to_dict() == doc and before.series[0].values == 250
    assert a.snapshot().series[0].values == 300 and a.snapshot().series[0].changepoints["up"] == 1


def test_unknown_detector_or_bad_options_fail_at_construction():
    with pytest.raises(ValueError):
        DriftAnalyzer(detector="magic")
    with pytest.raises(ValueError):
        DriftAnalyzer(detector_options={"h": -1})
    assert DriftAnalyzer(detector="ewma").snapshot().to_dict()["detector"]["detector"] == "ewma"


def request_batch(ttft_s: np.ndarray, tpot_s: np.ndarray, model: str = "llm", t0: int = 10**18) -> pa.RecordBatch:
    """Requests of 65 output tokens each, a second apart, listed newest first (the analyzer orders them by end)."""
    n = len(ttft_s)
    out = 65
    e2e = ttft_s + tpot_s * (out - 1)
    ends = t0 + np.arange(n, dtype=np.int64) * 10**9 + (e2e * 1e9).astype(np.int64)
    rows = {
        "start_ns": ends - (e2e * 1e9).astype(np.int64),
        "end_ns": ends,
        "node": ["node-a"] * n,
        "model": [model] * n,
        "trace_id": [f"{i:032x}" for i in range(n)],
        "span_id": [f"{i:016x}" for i in range(n)],
        "source": ["otlp"] * n,
        "output_tokens": [out] * n,
        "queue_s": np.full(n, 0.001),
        "ttft_s": ttft_s,
        "e2e_s": e2e,
    }
    return conform("requests", pa.table(rows).take(pa.array(np.arange(n)[::-1])))


def test_ttft_step_is_a_drift_finding_on_ttft_not_tpot():
    rng = np.random.default_rng(7)
    n = 600
    ttft = 0.200 + 0.010 * rng.standard_normal(n)
    ttft[300:] += 0.030  # 3 sigma up after 300 requests
    tpot = 0.020 + 0.001 * rng.standard_normal(n)
    b = request_batch(ttft, tpot)
    a = DriftAnalyzer(hold_s=0.0)
    a.update(item("requests", b))
    (f,) = a.drain_findings()
    ev = f.evidence
    assert ev["series"] == "ttft" and ev["unit"] == "s" and ev["direction"] == "up" and f.subject == "llm"
    # the new level is the median from the estimated start (a few values early: noise drifted up) to detection
    assert ev["baseline"] == pytest.approx(0.200, rel=0.03) and 0.205 < ev["new_level"] < 0.235
    assert 285 <= ev["change_index"] <= 305 and 300 <= ev["detected_index"] <= 320
    assert f.trace_id == f"{ev['detected_index']:032x}" and ev["change_trace_id"] == f"{ev['change_index']:032x}"
    assert f.summary.startswith("llm: TTFT rose from") and f.severity == "warning"
    series = {s["series"]: s for s in a.snapshot().to_dict()["series"]}
    assert set(series) == {"ttft", "tpot"} and series["tpot"]["values"] == n
    assert series["ttft"]["changepoints"] == {"up": 1, "down": 0} and series["tpot"]["changepoints"]["up"] == 0
    pts = points(a.snapshot())
    assert (
        pts[
            ("aaco_drift_changepoints", (("direction", "up"), ("model", "llm"), ("node", "node-a"), ("series", "ttft")))
        ]
        == 1.0
    )
    assert_points_valid(a.snapshot().points())


def test_steady_requests_raise_nothing_and_requests_without_a_tpot_are_skipped():
    rng = np.random.default_rng(9)  # seed 8's TPOT has one of the ~0.5 false alarms per 10,000 values
    n = 1200
    ttft = 0.200 + 0.010 * rng.standard_normal(n)
    tpot = 0.020 + 0.001 * rng.standard_normal(n)
    b = request_batch(ttft, tpot)
    one_token = b.set_column(b.schema.get_field_index("output_tokens"), "output_tokens", pa.array([1] * n, pa.int64()))
    assert np.isnan(request_series(one_token).values["tpot_s"]).all()
    a = DriftAnalyzer()
    a.update(item("requests", b))
    a.update(item("requests", one_token))
    assert a.drain_findings() == []
    series = {s["series"]: s for s in a.snapshot().to_dict()["series"]}
    assert series["ttft"]["values"] == 2 * n and series["tpot"]["values"] == n
    assert series["ttft"]["state"] == "monitoring" and a.snapshot().to_dict()["dropped"]["not_finite"] == 0
