"""Row grouping for analyzers agrees with pyarrow's group-by: constant, compact and sparse ints, strings, nulls."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aaco.analyzers.grouping import group


def reference(columns: list[pa.Array], values: np.ndarray) -> dict[tuple, tuple[int, int, int, int]]:
    """Per key: count, sum, min, max, by pyarrow's group-by."""
    names = [f"k{i}" for i in range(len(columns))]
    t = pa.table({**dict(zip(names, columns, strict=True)), "v": values})
    out = t.group_by(names).aggregate([("v", "count"), ("v", "sum"), ("v", "min"), ("v", "max")]).to_pylist()
    return {tuple(r[n] for n in names): (r["v_count"], r["v_sum"], r["v_min"], r["v_max"]) for r in out}


def ours(columns: list[pa.Array], values: np.ndarray) -> dict[tuple, tuple[int, int, int, int]]:
    g = group(*columns)
    assert len(set(g.keys)) == len(g.keys)
    c, s, lo, hi = g.counts(), g.sums(values), g.mins(values), g.maxs(values)
    return {k: (int(c[i]), int(s[i]), int(lo[i]), int(hi[i])) for i, k in enumerate(g.keys)}


@pytest.mark.parametrize(
    "columns",
    [
        [pa.array(["n"] * 6), pa.array(["m"] * 6)],  # all constant
        [pa.array(["n"] * 6), pa.array([0, 0, 1, 1, 2, 2])],  # compact ints
        [pa.array([7, 10**15, 7, -3, 10**15, 7])],  # sparse ints (sort path)
        [pa.array(["a", "b", None, "a", None, "c"]), pa.array([1, None, 1, 2, None, 1])],  # strings, nulls
        [pa.array([None] * 6, pa.string()), pa.array([3] * 6)],  # all-null column
    ],
)
def test_matches_pyarrow(columns):
    values = np.array([5, 1, 8, 2, 9, 4], np.int64)
    assert ours(columns, values) == reference(columns, values)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["x", "y", None]), st.integers(-5, 5) | st.none(), st.integers(0, 1000)),
        min_size=1,
        max_size=60,
    )
)
def test_matches_pyarrow_on_random_rows(rows):
    a = pa.array([r[0] for r in rows], pa.string())
    b = pa.array([r[1] for r in rows], pa.int64())
    values = np.array([r[2] for r in rows], np.int64)
    assert ours([a, b], values) == reference([a, b], values)


def test_empty_and_chunked():
    assert group(pa.array([], pa.string())).keys == []
    chunked = pa.chunked_array([["a", "b"], ["a"]])
    g = group(chunked)
    assert sorted(g.keys) == [("a",), ("b",)]
    assert list(g.counts()[[g.keys.index(("a",)), g.keys.index(("b",))]]) == [2, 1]


@pytest.mark.parametrize(
    "column",
    [
        pa.array(["ab", "ab", "ab", "ab"]),
        pa.array(["ab", "ab", "ba", "ab"]),  # same lengths, other bytes
        pa.array(["ab", "ab", "abc", "ab"]),
        pa.array(["", "", "", ""]),
        pa.array(["x", "ab", "ab", "ab", "ab"]).slice(1),  # a slice: offsets start past zero
        pa.array(["ab", "ab", "ab", "ab", "zz"]).slice(0, 4),
        pa.array(["q", "q", "q", "r"], pa.large_string()),
        pa.array(["q", "q", "q", "q"], pa.large_string()).slice(1),
        pa.array([1.5, 1.5, 1.5, 2.5]),
    ],
)
def test_constant_detection_matches_pyarrow(column):
    values = np.arange(len(column), dtype=np.int64)
    assert ours([column], values) == reference([column], values)
