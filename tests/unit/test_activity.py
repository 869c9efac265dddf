"""Device activity: streaming interval unions, compute / non-compute / idle split per capture window."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aaco.analyzers.activity import ACTIVE_RATIO, TIME_RATIO, ActivityAnalyzer, union_extend

from .builders import NODE, assert_points_valid, item, kernels

FAR_PAST = -(2**62)


def brute_union(intervals: list[tuple[int, int]], above: int = FAR_PAST) -> int:
    """Length of the union of [s, e) intervals, counting only the part above ``above``."""
    events = sorted((max(s, above), max(e, above)) for s, e in intervals if e > s)
    total, cur_s, cur_e = 0, None, None
    for s, e in events:
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


intervals = st.lists(
    st.tuples(st.integers(min_value=0, max_value=1000), st.integers(min_value=0, max_value=200)).map(
        lambda t: (t[0], t[0] + t[1])
    ),
    max_size=40,
)


@settings(max_examples=300)
@given(intervals)
def test_union_extend_equals_brute_force_union(ivs):
    ivs = sorted(ivs, key=lambda t: t[0])
    s = np.array([a for a, _ in ivs], dtype=np.int64)
    e = np.array([b for _, b in ivs], dtype=np.int64)
    added, frontier = union_extend(s, e, FAR_PAST)
    assert added == brute_union(ivs)
    assert frontier == (max(b for _, b in ivs) if ivs else FAR_PAST)


@settings(max_examples=300)
@given(intervals, st.integers(min_value=-10, max_value=1300))
def test_union_extend_counts_only_beyond_frontier(ivs, frontier):
    ivs = sorted(ivs, key=lambda t: t[0])
    s = np.array([a for a, _ in ivs], dtype=np.int64)
    e = np.array([b for _, b in ivs], dtype=np.int64)
    added, new_frontier = union_extend(s, e, frontier)
    assert added == brute_union(ivs, above=frontier)
    assert new_frontier == max([frontier, *(b for _, b in ivs)])


@settings(max_examples=200)
@given(intervals, st.integers(min_value=0, max_value=40))
def test_union_extend_streamed_in_chunks_equals_whole(ivs, cut):
    ivs = sorted(ivs, key=lambda t: t[0])
    s = np.array([a for a, _ in ivs], dtype=np.int64)
    e = np.array([b for _, b in ivs], dtype=np.int64)
    a1, f1 = union_extend(s[:cut], e[:cut], FAR_PAST)
    a2, f2 = union_extend(s[cut:], e[cut:], f1)
    whole, fw = union_extend(s, e, FAR_PAST)
    assert a1 + a2 == whole
    assert f2 == fw


def test_union_extend_empty_keeps_frontier():
    assert union_extend(np.zeros(0, np.int64), np.zeros(0, np.int64), 42) == (0, 42)


def test_union_extend_nested_and_touching():
    s = np.array([0, 2, 10, 20], dtype=np.int64)
    e = np.array([10, 5, 20, 25], dtype=np.int64)
    assert union_extend(s, e, FAR_PAST) == (25, 25)


def batch(spec, device="0", run_id="r", node=NODE):
    """spec: [(start, end, kind)]."""
    n = len(spec)
    return item(
        "kernels",
        kernels(
            [s for s, _, _ in spec],
            [e for _, e, _ in spec],
            kind=[k for _, _, k in spec],
            device=[device] * n,
            run_id=[run_id] * n,
            node=[node] * n,
        ),
    )


def test_compute_noncompute_idle_split():
    a = ActivityAnalyzer()
    # kernels overlap each other and a copy; the second copy runs alone
    a.update(batch([(0, 10, "kernel"), (5, 15, "kernel"), (12, 20, "memcpy"), (30, 40, "memset")]))
    (w,) = a.snapshot().to_dict()["devices"]
    assert w["window_start_ns"] == 0
    assert w["window_end_ns"] == 40
    assert w["busy_ns"] == 30
    assert w["active_ratio"] == pytest.approx(0.75)
    assert w["compute_ratio"] == pytest.approx(15 / 40)
    assert w["noncompute_ratio"] == pytest.approx(15 / 40)
    assert w["idle_ratio"] == pytest.approx(0.25)


def test_copy_hidden_under_kernel_is_compute_time():
    a = ActivityAnalyzer()
    a.update(batch([(0, 100, "kernel"), (10, 50, "memcpy")]))
    (w,) = a.snapshot().to_dict()["devices"]
    assert w["compute_ratio"] == pytest.approx(1.0)
    assert w["noncompute_ratio"] == pytest.approx(0.0)
    assert w["idle_ratio"] == pytest.approx(0.0)


def test_unsorted_batch_is_sorted_within_a_key():
    a = ActivityAnalyzer()
    a.update(batch([(50, 60, "kernel"), (0, 10, "kernel"), (5, 20, "memcpy")]))
    (w,) = a.snapshot().to_dict()["devices"]
    assert w["busy_ns"] == 30
    assert w["compute_ratio"] == pytest.approx(20 / 60)


def test_streaming_batches_in_time_order_accumulate():
    a = ActivityAnalyzer()
    a.update(batch([(0, 10, "kernel")]))
    a.update(batch([(5, 20, "kernel"), (40, 50, "memcpy")]))
    (w,) = a.snapshot().to_dict()["devices"]
    assert (w["window_start_ns"], w["window_end_ns"], w["busy_ns"]) == (0, 50, 30)
    assert w["compute_ratio"] == pytest.approx(0.4)
    assert w["noncompute_ratio"] == pytest.approx(0.2)


def test_windows_per_node_device_run():
    a = ActivityAnalyzer()
    a.update(batch([(0, 10, "kernel"), (20, 30, "kernel")], device="0", run_id="r1"))
    a.update(batch([(0, 30, "kernel")], device="1", run_id="r1"))
    a.update(batch([(1000, 1010, "kernel")], device="0", run_id="r2"))
    a.update(batch([(0, 5, "kernel"), (5, 10, "kernel")], device="0", run_id="r1", node="other"))
    ws = {(w["node"], w["device"], w["run_id"]): w for w in a.snapshot().to_dict()["devices"]}
    assert set(ws) == {(NODE, "0", "r1"), (NODE, "1", "r1"), (NODE, "0", "r2"), ("other", "0", "r1")}
    assert ws[(NODE, "0", "r1")]["active_ratio"] == pytest.approx(2 / 3)
    assert ws[(NODE, "1", "r1")]["active_ratio"] == pytest.approx(1.0)
    assert ws[(NODE, "0", "r2")]["window_start_ns"] == 1000
    assert ws[("other", "0", "r1")]["busy_ns"] == 10


def test_null_run_and_device_fall_back():
    a = ActivityAnalyzer()
    b = kernels([0], [10], device=[None], run_id=[None])
    a.update(item("kernels", b, source="replay"))
    (w,) = a.snapshot().to_dict()["devices"]
    assert (w["device"], w["run_id"]) == ("unknown", "replay")


@settings(max_examples=100)
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=1000),
            st.integers(min_value=1, max_value=100),
            st.sampled_from(["kernel", "memcpy", "memset"]),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_ratios_sum_to_one_and_match_brute_force(spec):
    spec = [(s, s + d, k) for s, d, k in spec]
    a = ActivityAnalyzer()
    a.update(batch(spec))
    (w,) = a.snapshot().to_dict()["devices"]
    span = max(e for _, e, _ in spec) - min(s for s, _, _ in spec)
    busy = brute_union([(s, e) for s, e, _ in spec])
    comp = brute_union([(s, e) for s, e, k in spec if k == "kernel"])
    assert w["busy_ns"] == busy
    assert w["active_ratio"] == pytest.approx(busy / span)
    assert w["compute_ratio"] == pytest.approx(comp / span)
    assert w["noncompute_ratio"] == pytest.approx((busy - comp) / span)
    total = w["compute_ratio"] + w["noncompute_ratio"] + w["idle_ratio"]
    assert total == pytest.approx(1.0)
    assert all(0.0 <= w[k] <= 1.0 for k in ("active_ratio", "compute_ratio", "noncompute_ratio", "idle_ratio"))


def test_to_dict_does_not_leak_private_fields():
    a = ActivityAnalyzer()
    a.update(batch([(0, 10, "kernel")]))
    for w in a.snapshot().to_dict()["devices"]:
        assert not any(k.startswith("_") for k in w)
        assert "_seq" not in w


def test_points_use_latest_window_per_device():
    a = ActivityAnalyzer()
    a.update(batch([(0, 10, "kernel"), (10, 20, "memcpy")], run_id="old"))  # fully busy
    a.update(batch([(0, 10, "kernel"), (30, 40, "kernel")], run_id="new"))  # half busy
    a.update(batch([(0, 10, "memcpy")], device="1", run_id="old"))
    pts = a.snapshot().points()
    assert_points_valid(pts)
    vals = {(p.metric, p.labels["gpu"], p.labels.get("state")): p.value for p in pts}
    assert vals[(ACTIVE_RATIO, "0", None)] == pytest.approx(0.5)
    assert vals[(TIME_RATIO, "0", "compute")] == pytest.approx(0.5)
    assert vals[(TIME_RATIO, "0", "noncompute")] == pytest.approx(0.0)
    assert vals[(TIME_RATIO, "0", "idle")] == pytest.approx(0.5)
    assert vals[(ACTIVE_RATIO, "1", None)] == pytest.approx(1.0)
    assert vals[(TIME_RATIO, "1", "noncompute")] == pytest.approx(1.0)
    assert len(pts) == 8


def test_max_windows_evicts_least_recently_updated():
    a = ActivityAnalyzer(max_windows=2)
    a.update(batch([(0, 10, "kernel")], run_id="a"))
    a.update(batch([(0, 10, "kernel")], run_id="b"))
    a.update(batch([(20, 30, "kernel")], run_id="a"))  # a is now the most recent
    a.update(batch([(0, 10, "kernel")], run_id="c"))
    runs = {w["run_id"] for w in a.snapshot().to_dict()["devices"]}
    assert runs == {"a", "c"}


def test_empty_batch_is_ignored():
    a = ActivityAnalyzer()
    a.update(item("kernels", kernels([])))
    assert a.snapshot().to_dict() == {"devices": []}
    assert a.snapshot().points() == []
