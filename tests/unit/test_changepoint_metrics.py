"""The TCPDBench scores (benchmarks/changepoint_metrics.py) on cases worked out by hand."""

from __future__ import annotations

import pytest

from tests.support.benchmarks import load_benchmark

cm = load_benchmark("changepoint_metrics")

ANN = {"a": [50], "b": [50, 70]}


def test_f1_of_nothing_is_the_precision_of_the_start() -> None:
    # X = {0}: precision 1 (0 is in the union), recall mean(1/2, 1/3) = 5/12.
    assert cm.f1_score(ANN, [], 100) == pytest.approx(2 * (5 / 12) / (1 + 5 / 12))


def test_f1_within_margin() -> None:
    # X = {0, 52}: precision 2/2, recall mean(2/2, 2/3) = 5/6.
    assert cm.f1_score(ANN, [52], 100) == pytest.approx(2 * (5 / 6) / (1 + 5 / 6))
    assert cm.f1_score(ANN, [45, 55], 100) == pytest.approx(2 * (2 / 3) * (5 / 6) / (2 / 3 + 5 / 6))


def test_f1_outside_margin() -> None:
    # 56 is 6 values from 50: X = {0, 56}, precision 1/2, recall 5/12.
    assert cm.f1_score(ANN, [56], 100) == pytest.approx(2 * 0.5 * (5 / 12) / (0.5 + 5 / 12))


def test_f1_perfect_for_one_annotator_and_duplicates_ignored() -> None:
    assert cm.f1_score({"a": [30, 60]}, [60, 30, 30], 100) == pytest.approx(1.0)


def test_matching_is_one_to_one_and_largest() -> None:
    assert cm.true_positives([10, 12], [11]) == 1
    assert cm.true_positives([10], [8, 12]) == 1
    assert cm.true_positives([5, 10], [8, 13], margin=3) == 2
    assert cm.true_positives([0, 20], [40]) == 0


def test_covering() -> None:
    assert cm.covering([5], [], 10) == pytest.approx(0.5)
    assert cm.covering([5], [5], 10) == pytest.approx(1.0)
    assert cm.covering([], [5], 10) == pytest.approx(0.5)
    # [0,4) best J 4/6 with [0,6); [4,10) best J 4/6 with [6,10).
    assert cm.covering([4], [6], 10) == pytest.approx(4 / 6)


def test_cover_score_averages_annotators() -> None:
    assert cm.cover_score({"a": [5], "b": []}, [5], 10) == pytest.approx((1.0 + 0.5) / 2)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        cm.f1_score(ANN, [100], 100)
    with pytest.raises(ValueError, match="outside"):
        cm.cover_score({"a": [-1]}, [], 10)
    with pytest.raises(ValueError, match="no annotations"):
        cm.f1_score({}, [], 10)
