"""Iteration latency: quantiles over a window, cumulative histogram, exemplar, throughput."""

from __future__ import annotations

import math

import pytest

from aaco.analyzers.latency import ITERATION_LATENCY, THROUGHPUT, LatencyAnalyzer
from aaco.contract.signals import LATENCY_BUCKETS, HistogramValue

from .builders import NODE, assert_points_valid, item, iterations

MS = 1_000_000


def spans_ms(durations_ms: list[float], start: int = 10**18) -> list[tuple[int, int]]:
    out, t = [], start
    for d in durations_ms:
        out.append((t, t + round(d * MS)))
        t += 10**9
    return out


def test_quantiles_mean_min_max_throughput():
    a = LatencyAnalyzer()
    a.update(item("iterations", iterations(spans_ms(list(range(1, 102))), model="resnet")))
    m = a.snapshot().models[(NODE, "resnet")]
    assert m.iterations == 101
    assert m.window == 101
    assert m.p50_s == pytest.approx(0.051)
    assert m.p95_s == pytest.approx(0.096)
    assert m.p99_s == pytest.approx(0.100)
    assert m.mean_s == pytest.approx(0.051)
    assert m.min_s == pytest.approx(0.001)
    assert m.max_s == pytest.approx(0.101)
    assert m.throughput_per_s == pytest.approx(1 / 0.051)


def test_window_bounds_quantiles_but_not_counts():
    a = LatencyAnalyzer(window=3)
    a.update(item("iterations", iterations(spans_ms([100, 100, 100, 1, 2, 3]))))
    m = a.snapshot().models[(NODE, "m")]
    assert m.iterations == 6
    assert m.window == 3
    assert m.max_s == pytest.approx(0.003)
    assert m.p50_s == pytest.approx(0.002)
    assert m.throughput_per_s == pytest.approx(500.0)
    # the histogram still counts all six
    h = a.snapshot().histograms[(NODE, "m")]
    assert h.count == 6
    assert h.total == pytest.approx(0.306)


def test_histogram_is_cumulative():
    a = LatencyAnalyzer()
    # exactly on a bound (0.1 ms), between bounds, and beyond the last (100 s)
    a.update(item("iterations", iterations(spans_ms([0.1, 3, 70, 100_000]))))
    h = a.snapshot().histograms[(NODE, "m")]
    assert isinstance(h, HistogramValue)
    assert h.bounds == LATENCY_BUCKETS
    expected = [sum(1 for v in (0.0001, 0.003, 0.07, 100.0) if v <= b) for b in LATENCY_BUCKETS]
    assert list(h.bucket_counts) == expected
    assert h.bucket_counts[0] == 1  # le=0.0001 includes the 0.1 ms iteration
    assert h.bucket_counts[-1] == 3  # le=60 excludes the 100 s one
    assert h.count == 4
    assert h.total == pytest.approx(100.0731)
    assert list(h.bucket_counts) == sorted(h.bucket_counts)


def test_histogram_accumulates_across_updates():
    a = LatencyAnalyzer()
    a.update(item("iterations", iterations(spans_ms([1, 1]))))
    a.update(item("iterations", iterations(spans_ms([20]))))
    h = a.snapshot().histograms[(NODE, "m")]
    assert h.count == 3
    idx_1ms = LATENCY_BUCKETS.index(0.001)
    idx_25ms = LATENCY_BUCKETS.index(0.025)
    assert h.bucket_counts[idx_1ms] == 2
    assert h.bucket_counts[idx_25ms] == 3


def test_exemplar_is_latest_trace_id():
    a = LatencyAnalyzer()
    b1 = iterations(spans_ms([1, 2]), run_id="r1")
    a.update(item("iterations", b1))
    b2 = iterations(spans_ms([7]), run_id="r2")
    a.update(item("iterations", b2))
    h = a.snapshot().histograms[(NODE, "m")]
    ex = h.exemplars[LATENCY_BUCKETS.index(0.01)]  # 7 ms
    assert ex is not None and ex.trace_id == b2.column("trace_id")[0].as_py()
    assert ex.value == pytest.approx(0.007)
    assert ex.ts_s == pytest.approx(b2.column("end_ns")[0].as_py() / 1e9)


def test_exemplar_kept_when_new_iterations_have_no_trace():
    a = LatencyAnalyzer()
    b1 = iterations(spans_ms([1]))
    a.update(item("iterations", b1))
    a.update(item("iterations", iterations(spans_ms([5]), with_ids=False)))
    h = a.snapshot().histograms[(NODE, "m")]
    assert [e.trace_id for e in h.exemplars if e] == [b1.column("trace_id")[0].as_py()]
    assert h.count == 2


def test_null_model_is_unknown_and_models_separate():
    a = LatencyAnalyzer()
    a.update(item("iterations", iterations(spans_ms([1]), model=None)))
    a.update(item("iterations", iterations(spans_ms([2, 4]), model="b")))
    snap = a.snapshot()
    assert set(snap.models) == {(NODE, "unknown"), (NODE, "b")}
    assert snap.models[(NODE, "b")].mean_s == pytest.approx(0.003)
    d = snap.to_dict()
    assert set(d["models"]) == {"unknown", "b"}


def test_to_dict_keys_by_node_when_several_nodes():
    a = LatencyAnalyzer()
    a.update(item("iterations", iterations(spans_ms([1]), node="n1")))
    a.update(item("iterations", iterations(spans_ms([1]), node="n2")))
    assert set(a.snapshot().to_dict()["models"]) == {"n1/m", "n2/m"}


def test_max_models_drops_new_models():
    a = LatencyAnalyzer(max_models=1)
    a.update(item("iterations", iterations(spans_ms([1]), model="a")))
    a.update(item("iterations", iterations(spans_ms([1]), model="b")))
    assert set(a.snapshot().models) == {(NODE, "a")}
    assert a.dropped_models == 1


def test_snapshot_is_immutable_after_updates():
    a = LatencyAnalyzer()
    a.update(item("iterations", iterations(spans_ms([1]))))
    snap = a.snapshot()
    a.update(item("iterations", iterations(spans_ms([9]))))
    assert snap.histograms[(NODE, "m")].count == 1
    assert snap.models[(NODE, "m")].iterations == 1


def test_empty_batch_and_empty_snapshot():
    a = LatencyAnalyzer()
    a.update(item("iterations", iterations([])))
    snap = a.snapshot()
    assert snap.models == {}
    assert snap.points() == []
    assert snap.to_dict() == {"models": {}}


def test_points_labels_and_values():
    a = LatencyAnalyzer()
    a.update(item("iterations", iterations(spans_ms([2, 2]), model="resnet")))
    pts = a.snapshot().points()
    assert_points_valid(pts)
    by_metric = {p.metric: p for p in pts}
    assert set(by_metric) == {ITERATION_LATENCY, THROUGHPUT}
    assert dict(by_metric[THROUGHPUT].labels) == {"node": NODE, "model": "resnet"}
    assert math.isclose(by_metric[THROUGHPUT].value, 500.0)
    assert by_metric[ITERATION_LATENCY].value.count == 2


def test_zero_latency_has_no_throughput_point():
    a = LatencyAnalyzer()
    a.update(item("iterations", iterations([(10, 10)])))
    snap = a.snapshot()
    assert snap.models[(NODE, "m")].throughput_per_s is None
    assert [p.metric for p in snap.points()] == [ITERATION_LATENCY]
