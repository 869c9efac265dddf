"""The analyzers' shared statistics: percentiles, reservoirs, the median ratio with its bootstrap interval."""

from __future__ import annotations

import numpy as np
import pytest

from aaco.analyzers.stats import Reservoir, median_ratio, percentiles


def test_percentiles_of_a_sample_and_of_nothing():
    assert percentiles(np.arange(101.0), (50, 95, 99)) == (50.0, 95.0, 99.0)
    assert percentiles(np.array([]), (50, 99)) == (None, None)


def test_a_reservoir_keeps_everything_until_full_then_a_uniform_sample():
    r = Reservoir(100, np.random.default_rng(0))
    r.add(np.arange(60.0))
    assert r.seen == 60 and list(r.sample()) == list(np.arange(60.0))
    r.add(np.arange(60.0, 10_000.0))
    kept = r.sample()
    assert r.seen == 10_000 and kept.size == 100 and len(set(kept.tolist())) == 100
    # uniform: as many kept from the first half of the stream as from the second, within sampling error
    assert 30 <= int((kept < 5000).sum()) <= 70


def test_a_reservoir_is_reproducible_for_a_seed():
    def kept(seed: int) -> list[float]:
        r = Reservoir(10, np.random.default_rng(seed))
        r.add(np.arange(1000.0))
        return r.sample().tolist()

    assert kept(1) == kept(1) and kept(1) != kept(2)


def test_median_ratio_with_an_interval_around_it():
    rng = np.random.default_rng(3)
    slow, fast = rng.normal(1.3, 0.05, 400), rng.normal(1.0, 0.05, 400)
    est = median_ratio(slow, fast, 2000, np.random.default_rng(0))
    assert est.ratio == pytest.approx(1.3, rel=0.02)
    assert est.ci[0] < est.ratio < est.ci[1] and est.ci[1] - est.ci[0] < 0.05
    assert est.median_a == pytest.approx(float(np.median(slow)))


def test_median_ratio_without_a_positive_denominator():
    est = median_ratio(np.ones(5), np.zeros(5), 100, np.random.default_rng(0))
    assert est.ratio is None and np.isnan(est.ci[0]) and np.isnan(est.ci[1])
