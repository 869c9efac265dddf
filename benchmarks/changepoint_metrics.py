"""Change-point scores of the Turing Change Point Benchmark: F1 with a margin and segmentation covering.

Written here from the definitions of van den Burg & Williams (2020), "An Evaluation of Change Point
Detection Algorithms" (arXiv:2003.06222, section 5.1), not from TCPDBench's code. A change point is
the index of the first value of a new segment; the start of the series (index 0) is a change point
of every set, the annotators' and the detector's, so a method that reports nothing (the paper's
"zero" method) scores the precision of finding the start.

- **F1.** ``TP(T, X)``: the points of ``T`` matched one-to-one to points of ``X`` within ``margin``
  (5) values. Precision is ``|TP(G, X)| / |X|`` with ``G`` the union of all annotators' sets;
  recall the mean over annotators ``k`` of ``|TP(T_k, X)| / |T_k|``; ``F1 = 2 P R / (P + R)``.
  Matching takes the largest one-to-one matching (on a line with one window width, taking the
  leftmost free candidate for each true point in order is optimal).
- **Covering.** The partition of ``0..n-1`` into segments at the change points;
  ``C(G, G') = (1 / n) sum_{A in G} |A| max_{A' in G'} J(A, A')`` with ``J`` the Jaccard index,
  ``G`` an annotator's partition and ``G'`` the detector's; the score is the mean over annotators.

Hand-written because no maintained library implements these two definitions (ruptures' metrics
have no multi-annotator precision or covering).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

MARGIN = 5


def _points(cps: Iterable[int], n: int, what: str) -> list[int]:
    """Sorted distinct change points with the start (0) added; a clear error for one outside the series."""
    out = {0}
    for c in map(int, cps):
        if not 0 <= c < n:
            raise ValueError(f"{what} change point {c} outside the series of {n} values")
        out.add(c)
    return sorted(out)


def true_positives(true: Sequence[int], found: Sequence[int], margin: int = MARGIN) -> int:
    """Size of the largest one-to-one matching of sorted ``true`` to sorted ``found`` within ``margin``."""
    matched = j = 0
    for t in true:
        while j < len(found) and found[j] < t - margin:
            j += 1
        if j < len(found) and found[j] <= t + margin:
            matched += 1
            j += 1
    return matched


def f1_score(annotations: Mapping[str, Iterable[int]], found: Iterable[int], n: int, margin: int = MARGIN) -> float:
    """The benchmark's F1 of ``found`` against every annotator's change points (series of ``n`` values)."""
    if not annotations:
        raise ValueError("no annotations")
    x = _points(found, n, "detected")
    sets = [_points(a, n, "annotated") for a in annotations.values()]
    union = sorted(set().union(*sets))
    precision = true_positives(union, x, margin) / len(x)
    recall = sum(true_positives(t, x, margin) / len(t) for t in sets) / len(sets)
    return 0.0 if precision + recall == 0 else 2 * precision * recall / (precision + recall)


def _segments(points: Sequence[int], n: int) -> list[tuple[int, int]]:
    bounds = [*points, n]
    return [(bounds[i], bounds[i + 1]) for i in range(len(points))]


def covering(true: Iterable[int], found: Iterable[int], n: int) -> float:
    """Covering of the partition at ``true`` change points by the partition at ``found`` ones."""
    truth = _segments(_points(true, n, "annotated"), n)
    pred = _segments(_points(found, n, "detected"), n)
    total = 0.0
    for a0, a1 in truth:
        best = 0.0
        for b0, b1 in pred:
            inter = min(a1, b1) - max(a0, b0)
            if inter > 0:
                best = max(best, inter / (max(a1, b1) - min(a0, b0)))
        total += (a1 - a0) * best
    return total / n


def cover_score(annotations: Mapping[str, Iterable[int]], found: Iterable[int], n: int) -> float:
    """The benchmark's cover: ``covering`` of each annotator's partition by ``found``'s, averaged."""
    if not annotations:
        raise ValueError("no annotations")
    found = list(found)
    return sum(covering(a, found, n) for a in annotations.values()) / len(annotations)
