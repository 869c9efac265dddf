"""Drift: the hand-written Kendall tau test, Theil-Sen slope and Student t CDF agree with scipy's."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.special
import scipy.stats

from aaco.analyzers.drift_baseline import _kendall_null_cdf, kendall_tau_p, student_t_cdf, theil_sen


def _kendall_cases(seed: int):
    rng = np.random.default_rng(seed)
    for _ in range(60):
        n = int(rng.integers(2, 200))
        t = np.arange(float(n))
        trend = rng.choice([0.0, 0.01, 0.05, 0.3])
        y = trend * t + rng.standard_normal(n)
        yield t, y  # no ties: exact up to 33 values
        yield t, np.round(y * rng.choice([0.5, 2.0, 10.0]))  # ties in y: the normal approximation
        yield np.floor(t / rng.integers(1, 4)), np.round(y)  # ties on both sides


@pytest.mark.parametrize("seed", range(5))
def test_kendall_p_value_matches_scipy_exact_and_asymptotic(seed):
    for x, y in _kendall_cases(seed):
        want = scipy.stats.kendalltau(x, y).pvalue
        got = kendall_tau_p(x, y)
        if math.isnan(want):
            assert math.isnan(got)
        else:
            assert got == pytest.approx(want, rel=1e-9, abs=1e-300), (x.size, want, got)


def test_kendall_p_value_at_the_edges_of_the_exact_method():
    for n in (2, 3, 5, 33, 34, 40, 180):
        t = np.arange(float(n))
        for y in (t.copy(), t[::-1].copy(), np.r_[t[1], t[0], t[2:]]):  # 0 or 1 pair out of order
            assert kendall_tau_p(t, y) == pytest.approx(scipy.stats.kendalltau(t, y).pvalue, rel=1e-9, abs=1e-300)
    assert math.isnan(kendall_tau_p(np.arange(5.0), np.ones(5)))


def test_the_null_distribution_is_the_mahonian_numbers():
    cdf = _kendall_null_cdf(4)  # 1, 3, 5, 6, 5, 3, 1 orders of 4 values with 0..6 inversions
    assert np.diff(np.r_[0.0, cdf]) * 24 == pytest.approx([1, 3, 5, 6, 5, 3, 1])
    assert _kendall_null_cdf(33)[-1] == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_theil_sen_matches_scipy(seed):
    rng = np.random.default_rng(seed)
    for _ in range(100):
        n = int(rng.integers(2, 201))
        t = np.sort(rng.choice(10 * n, n, replace=False)).astype(float)
        y = rng.standard_normal() * t + rng.standard_t(2, n)
        if rng.random() < 0.3:
            y = np.round(y)
        want = scipy.stats.theilslopes(y, t)
        slope, intercept = theil_sen(y, t)
        assert slope == pytest.approx(want.slope, rel=1e-12, abs=1e-12)
        assert intercept == pytest.approx(want.intercept, rel=1e-12, abs=1e-9)


def test_student_t_cdf_matches_scipy():
    rng = np.random.default_rng(5)
    dofs = np.r_[0.37 * (np.arange(10, 200) / 2.0 - 1.0), 0.5, 3.0, 30.0, rng.uniform(0.2, 100, 200)]
    ts = np.r_[0.0, 1e-3, -1e-3, 0.5, -0.5, 3.0, -3.0, 40.0, -40.0, 1e6, rng.standard_normal(50) * 3]
    for dof in dofs:
        for t in ts:
            want = float(scipy.special.stdtr(dof, t))
            got = student_t_cdf(float(dof), float(t))
            assert got == pytest.approx(want, rel=1e-10, abs=1e-300), (dof, t, want, got)


@pytest.mark.parametrize("t", [1e-8, -1e-8, 1e-4, 0.3, -2.0, 7.0, -1e3])
def test_student_t_cdf_matches_the_closed_forms_near_zero_too(t):
    # Closed forms for 1, 2 and 4 degrees of freedom; scipy's stdtr is off by ~1.6e-9 at t = 1e-8 with one.
    assert student_t_cdf(1.0, t) == pytest.approx(0.5 + math.atan(t) / math.pi, rel=1e-14)
    assert student_t_cdf(2.0, t) == pytest.approx(0.5 + t / (2.0 * math.sqrt(2.0 + t * t)), rel=1e-14)
    x = t / math.sqrt(4.0 + t * t)
    assert student_t_cdf(4.0, t) == pytest.approx(0.5 + 0.75 * x * (1.0 - x * x / 3.0), rel=1e-13)
