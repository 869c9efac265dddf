"""analyzers.stats.Histogram: counts per bucket and each bucket's latest exemplar."""

from __future__ import annotations

import numpy as np
import pytest

from aaco.analyzers.stats import Histogram
from aaco.contract.signals import Exemplar, HistogramValue

BOUNDS = np.array([1.0, 2.0, 4.0])


def test_each_bucket_keeps_its_latest_observation_with_a_trace():
    h = Histogram(BOUNDS)
    h.add(np.array([0.5, 1.5, 0.7, 9.0, 1.2]), np.array(["a", "b", "c", None, ""], dtype=object), np.arange(5) * 10**9)
    v = h.value()
    assert v.bucket_counts == (2, 4, 4) and v.count == 5 and v.total == pytest.approx(12.9)
    assert v.exemplars == (Exemplar("c", 0.7, 2.0), Exemplar("b", 1.5, 1.0), None, None)
    h.add(np.array([3.0, 1.9]), np.array([None, "e"], dtype=object))  # no times: none kept
    assert h.value().exemplars == (Exemplar("c", 0.7, 2.0), Exemplar("e", 1.9), None, None)


def test_a_big_batch_picks_the_last_traced_row_per_bucket():
    rng = np.random.default_rng(7)
    values = rng.uniform(0.0, 5.0, 200_000)
    traces = np.array([f"{i:032x}" if i % 3 else None for i in range(values.size)], dtype=object)
    h = Histogram(BOUNDS)
    h.add(values, traces)
    slots = np.searchsorted(BOUNDS, values, side="left")
    for bucket, ex in enumerate(h.value().exemplars):
        i = max(i for i in np.flatnonzero(slots == bucket).tolist() if i % 3)
        assert ex == Exemplar(f"{i:032x}", float(values[i]))


def test_exemplars_are_none_or_one_per_bucket():
    HistogramValue((1.0,), (0,), 0, 0.0)
    with pytest.raises(ValueError):
        HistogramValue((1.0,), (0,), 0, 0.0, (None,))
