"""The span rate budget on the kernels' own clock: what is granted depends on the kernels alone, not on batching."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from aaco.exporters.otlp_rate import NS_PER_S, TokenBucket, TraceTimeBudget


def grant_all(starts: np.ndarray, cuts: list[int], rate: int) -> np.ndarray:
    budget = TraceTimeBudget(rate)
    edges = [0, *sorted(set(cuts)), starts.size]
    return np.concatenate([budget.grant(starts[a:b]) for a, b in itertools.pairwise(edges)])


@settings(max_examples=200, deadline=None)
@given(
    offsets=st.lists(st.integers(min_value=0, max_value=5 * NS_PER_S), min_size=1, max_size=300),
    cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=10),
    rate=st.integers(min_value=1, max_value=50),
)
def test_the_same_kernels_get_the_same_grants_however_they_are_batched(offsets, cuts, rate):
    starts = np.array(offsets, dtype=np.int64) + 1_700_000_000 * NS_PER_S
    whole = TraceTimeBudget(rate).grant(starts)
    split = grant_all(starts, [c for c in cuts if c <= starts.size], rate)
    assert (whole == split).all()
    seconds = starts // NS_PER_S
    for s in np.unique(seconds):  # each second of trace time: its first `rate` kernels, in arrival order
        in_second = np.flatnonzero(seconds == s)
        assert whole[in_second].tolist() == [i < rate for i in range(in_second.size)]


def test_old_seconds_are_forgotten_beyond_the_bound():
    budget = TraceTimeBudget(1, max_windows=3)
    for s in range(5):
        assert budget.grant(np.array([s * NS_PER_S])).tolist() == [True]
    assert budget.grant(np.array([4 * NS_PER_S])).tolist() == [False]  # still counted
    assert budget.grant(np.array([0])).tolist() == [True]  # forgotten: granted again


def test_the_wall_clock_bucket_refills_with_time():
    now = [0.0]
    bucket = TokenBucket(10, lambda: now[0])
    assert bucket.take(25) == 10
    now[0] = 0.5
    assert bucket.take(25) == 5
