"""Drift: the young baseline (the chart from ``start`` values on, before the full warm-up)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aaco.analyzers.drift import DETECTORS, Cusum
from aaco.analyzers.drift_baseline import Baseline, _log_arl, young_chart, young_widening
from tests.support.benchmarks import load_benchmark

drift_quality = load_benchmark("drift_quality")  # its AR(1) generator: the series drift_quality.py measures


@pytest.mark.parametrize("seed", range(5))
def test_a_large_step_in_a_short_series_is_found_where_it_starts(seed):
    x = 100.0 + 5.0 * np.random.default_rng(seed).standard_normal(40)
    x[25:] += 30.0  # 6 sigma, 15 values after a 10-value start
    cps = Cusum().run(x.tolist())
    assert [abs(c.index - 25) <= 1 for c in cps] == [True]
    assert cps[0].direction == "up" and cps[0].detected_at < 40


@pytest.mark.parametrize("kind", sorted(DETECTORS))
def test_before_start_nothing_runs_and_after_it_the_chart_does(kind):
    det = DETECTORS[kind]()
    det.run([1.0, 2.0, 3.0, 2.0, 1.0, 2.0, 3.0, 2.0, 1.0])
    assert not det.monitoring
    det.update(2.0)
    assert det.monitoring and det.baseline is not None and det.baseline.samples == det.start


def test_a_linear_trend_on_a_young_baseline_is_followed_not_alarmed():
    alarms = 0
    for seed in range(10):
        t = np.arange(150)
        x = 100.0 + 2.0 * t + np.random.default_rng(seed).standard_normal(150)
        alarms += len(Cusum().run(x.tolist()))
    assert alarms == 0
    t = np.arange(30.0)
    b = Baseline.fit_young(100.0 + 2.0 * t + np.random.default_rng(0).standard_normal(30), t, 3.0, 0.005)
    assert b.slope == pytest.approx(2.0, abs=0.1) and b.t_ref == 29.0
    assert abs(b.score(100.0 + 2.0 * 35, 35)) < 2.0  # on the extrapolated line
    assert b.score(100.0 + 2.0 * 35 + 20.0, 35) == 3.0  # 20 above it: clipped


def test_white_noise_has_no_young_trend_and_skew_gets_a_scale_per_side():
    rng = np.random.default_rng(3)
    t = np.arange(60.0)
    assert Baseline.fit_young(rng.standard_normal(60), t, 3.0, 0.005).slope == 0.0
    skewed = Baseline.fit_young(np.exp(1.0 * rng.standard_normal(60)), t, 3.0, 0.005)
    assert skewed.upper_scale > 1.5 * skewed.scale


@pytest.mark.parametrize("samples", [10, 20, 50, 120, 199])
def test_the_young_chart_keeps_the_run_length_of_the_full_warmup(samples):
    k, h = young_chart(0.5, 9.0, 0.5, samples, 200)
    assert k >= 0.5
    assert _log_arl(k, h, samples) == pytest.approx(_log_arl(0.5, 9.0, 200), abs=1e-6)
    if samples >= 120:
        assert k == 0.5  # large enough a baseline for the design's own reference value
    assert young_chart(0.5, 9.0, 0.5, 199, 200)[1] == pytest.approx(9.0, abs=0.05)


def test_the_young_reference_value_falls_as_the_baseline_grows():
    ks = [young_chart(0.5, 9.0, 0.5, n, 200)[0] for n in (10, 15, 20, 30, 50, 80)]
    assert ks == sorted(ks, reverse=True) and ks[0] > 1.5


def test_in_control_white_noise_rarely_alarms_while_young():
    rng = np.random.default_rng(11)
    alarms = sum(len(Cusum().run((100.0 + 5.0 * rng.standard_normal(250)).tolist())) for _ in range(100))
    assert alarms <= 3  # measured 0 in 100, 8 without young_widening (drift_quality.py measures the rate)


def test_the_young_chart_is_widened_for_the_correlation_its_baseline_cannot_exclude():
    assert young_widening(0.0, 10) == pytest.approx(math.sqrt((1 + 2 / math.sqrt(10)) / (1 - 2 / math.sqrt(10))))
    assert young_widening(0.0, 10) > young_widening(0.0, 50) > young_widening(0.0, 199) > 1.0
    assert young_widening(0.5, 100) == pytest.approx(math.sqrt(0.5 * 1.7 / (1.5 * 0.3)))
    assert young_widening(0.9, 20) == 1.0  # at the cap: nothing larger to allow for
    det = Cusum()
    det.run((100.0 + np.random.default_rng(0).standard_normal(10)).tolist())
    b = det.baseline
    k, h = young_chart(det.k, det.h, det.k * b.shift_scale, b.samples, det.warmup)
    w = young_widening(b.rho, b.samples)
    assert (det.k_in_force, det.h_in_force) == pytest.approx((w * k, w * h))


def test_in_control_ar1_rarely_alarms_while_young():
    rng = np.random.default_rng(12)
    alarms = sum(len(Cusum().run((100.0 + 5.0 * drift_quality.ar1(rng, 250)).tolist())) for _ in range(200))
    assert alarms <= 15  # measured 5 in 200; 64 without the widening (young_widening 1)
