"""The statistics the analyzers share: percentiles, bounded samples, the bootstrap of a median ratio.

- ``percentiles``: exact percentiles of a sample (None for an empty one);
- ``evenly_spaced``: a deterministic thinning of a long series to at most ``cap`` values;
- ``Reservoir``: a uniform sample of bounded size from a stream (Algorithm R);
- ``bootstrap_medians`` and ``median_ratio``: the ratio of two medians with its percentile
  bootstrap 95 % interval, each resample's median drawn exactly from its order statistic;
- ``log2_quantile``: a quantile of a power-of-two histogram;
- ``Histogram``: a cumulative-bounds histogram with count, sum and the latest exemplar of each
  bucket (what ``contract.signals.HistogramValue`` exports).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from aaco.contract.signals import Exemplar, HistogramValue


def percentiles(values: np.ndarray, qs: Sequence[float]) -> tuple[float | None, ...]:
    """Percentiles ``qs`` (0-100) of ``values`` (linear interpolation); all None when it is empty."""
    if values.size == 0:
        return (None,) * len(qs)
    return tuple(float(v) for v in np.percentile(values, list(qs)))


def evenly_spaced(values: np.ndarray, cap: int) -> np.ndarray:
    """All values up to ``cap``, else ``cap`` evenly spaced ones (deterministic, spread over the series)."""
    if values.size <= cap:
        return values
    return values[np.linspace(0, values.size - 1, cap).round().astype(np.int64)]


class Reservoir:
    """A uniform sample of at most ``size`` values of a stream (Algorithm R), drawn with ``rng``."""

    def __init__(self, size: int, rng: np.random.Generator) -> None:
        self.values = np.empty(size)
        self.seen = 0
        self._rng = rng

    def add(self, values: np.ndarray) -> None:
        """Offer each value in turn: every value seen has the same chance to be kept."""
        size = self.values.size
        for x in values.tolist():
            if self.seen < size:
                self.values[self.seen] = x
            else:
                j = int(self._rng.integers(0, self.seen + 1))
                if j < size:
                    self.values[j] = x
            self.seen += 1

    def sample(self) -> np.ndarray:
        """The values kept (a view)."""
        return self.values[: min(self.seen, self.values.size)]


def bootstrap_medians(ordered: np.ndarray, draws: int, rng: np.random.Generator) -> np.ndarray:
    """Medians of ``draws`` bootstrap resamples of a sorted sample, drawn exactly without resampling.

    A resample of n values is n uniform indices ``floor(n U_i)``; its k-th smallest value is the
    sample's value at ``floor(n U_(k))``, and the k-th order statistic of n uniforms is
    Beta(k, n - k + 1) (the next one adds ``(1 - U_(k)) Beta(1, n - k)``). So each bootstrap median
    costs two Beta draws instead of a resample and a selection over n values: the same distribution
    as resampling, at O(draws) rather than O(draws x n).
    """
    n = ordered.size
    k = (n + 1) // 2
    u = rng.beta(k, n - k + 1, draws)
    lo = ordered[np.minimum((n * u).astype(np.int64), n - 1)]
    if n % 2:
        return lo
    u2 = u + (1.0 - u) * rng.beta(1, n - k, draws)
    return (lo + ordered[np.minimum((n * u2).astype(np.int64), n - 1)]) / 2.0


@dataclass(frozen=True)
class MedianRatio:
    """``median(a) / median(b)`` (None when ``median(b)`` is not positive) and its 95 % interval."""

    ratio: float | None
    ci: tuple[float, float]  # NaN when no resample had a positive median(b)
    median_a: float
    median_b: float


def median_ratio(a: np.ndarray, b: np.ndarray, draws: int, rng: np.random.Generator) -> MedianRatio:
    """The ratio of medians of two samples with a percentile bootstrap 95 % confidence interval."""
    a, b = np.sort(a), np.sort(b)
    med_a, med_b = float(np.median(a)), float(np.median(b))
    ra, rb = bootstrap_medians(a, draws, rng), bootstrap_medians(b, draws, rng)
    r = ra / np.where(rb > 0, rb, np.nan)
    lo, hi = np.nanpercentile(r, [2.5, 97.5]) if np.isfinite(r).any() else (np.nan, np.nan)
    return MedianRatio(med_a / med_b if med_b > 0 else None, (float(lo), float(hi)), med_a, med_b)


def log2_quantile(slots: np.ndarray, q: float) -> float | None:
    """Quantile ``q`` (seconds) of a log2 histogram (slot k: [2**k, 2**(k+1)) ns), linear within a slot."""
    total = float(slots.sum())
    if total <= 0:
        return None
    target = q * total
    cum = np.cumsum(slots)
    k = int(np.searchsorted(cum, target, side="left"))
    k = min(k, slots.size - 1)
    before = float(cum[k - 1]) if k else 0.0
    lo = 0.0 if k == 0 else float(1 << k)
    hi = float(1 << (k + 1))
    frac = (target - before) / float(slots[k]) if slots[k] else 1.0
    return (lo + (hi - lo) * min(1.0, max(0.0, frac))) / 1e9


@dataclass
class Histogram:
    """Observations counted into buckets ``bounds`` (bucket i holds ``bounds[i-1] < v <= bounds[i]``), with +Inf.

    Each bucket keeps an exemplar: its latest observation whose trace id is known.
    """

    bounds: np.ndarray
    per_bucket: np.ndarray = field(init=False)  # not cumulative; the last slot is +Inf
    count: int = 0
    total: float = 0.0
    # each bucket's exemplar as columns (trace id None: none yet), made into Exemplars only on export
    _ex_trace: np.ndarray = field(init=False, repr=False)
    _ex_value: np.ndarray = field(init=False, repr=False)
    _ex_ts: np.ndarray = field(init=False, repr=False)  # seconds, NaN: no timestamp

    def __post_init__(self) -> None:
        slots = self.bounds.size + 1
        self.per_bucket = np.zeros(slots, dtype=np.int64)
        self._ex_trace = np.full(slots, None, dtype=object)
        self._ex_value = np.zeros(slots)
        self._ex_ts = np.full(slots, np.nan)

    def add(self, values: np.ndarray, traces: np.ndarray, ts_ns: np.ndarray | None = None) -> None:
        """Count ``values``; in each bucket the last one with a trace id (not None, not empty) becomes its exemplar.

        ``ts_ns``, when given, is each observation's time (Unix nanoseconds), kept with its exemplar.
        """
        if values.size == 0:
            return
        slots = np.searchsorted(self.bounds, values, side="left")
        self.per_bucket += np.bincount(slots, minlength=self.bounds.size + 1)
        self.count += int(values.size)
        self.total += float(values.sum())
        traces = np.asarray(traces, dtype=object)
        known = np.flatnonzero(np.not_equal(traces, None) & np.not_equal(traces, ""))[::-1]
        if known.size == 0:
            return
        buckets, first = np.unique(slots[known], return_index=True)  # scanning backwards: each bucket's last row
        rows = known[first]
        self._ex_trace[buckets] = traces[rows]
        self._ex_value[buckets] = values[rows]
        self._ex_ts[buckets] = ts_ns[rows] / 1e9 if ts_ns is not None else np.nan

    @property
    def exemplars(self) -> tuple[Exemplar | None, ...]:
        """Each bucket's exemplar (None where no observation with a trace id fell in it), +Inf last."""
        return tuple(
            None if t is None else Exemplar(str(t), float(v), None if np.isnan(ts) else float(ts))
            for t, v, ts in zip(self._ex_trace.tolist(), self._ex_value.tolist(), self._ex_ts.tolist(), strict=True)
        )

    def value(self) -> HistogramValue:
        """The exported form: cumulative counts per bound, count, sum, an exemplar per bucket."""
        cumulative = np.cumsum(self.per_bucket)[: self.bounds.size]
        return HistogramValue(
            tuple(float(b) for b in self.bounds),
            tuple(int(c) for c in cumulative),
            self.count,
            self.total,
            self.exemplars,
        )
