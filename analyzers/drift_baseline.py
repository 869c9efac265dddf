"""The drift detectors' front end: a robust, self-refreshing baseline, and the CUSUM run-length arithmetic.

``Baseline`` standardises values against a window of in-control values (normal scores of ranks,
or a floored scale for flat series; AR(1) pre-whitening), or, while young, against a robust level,
a scale per side and a significant trend (``fit_young``); ``siegmund_arl``, ``matched_interval`` and
``young_chart`` size a CUSUM's reference value and decision interval. Derivations and measured
figures: docs/drift.md.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from dataclasses import dataclass, field

import numpy as np
import scipy.special
import scipy.stats

TREND_P = 0.01  # young baselines: Kendall's tau p-value below which the level follows a trend
YOUNG_MARGIN = 1.2  # young CUSUM: reference value over the smallest that can reach the run length
_NORMAL = statistics.NormalDist()


@functools.lru_cache(maxsize=32)
def _scores(n: int) -> tuple[float, ...]:
    """Normal scores of ranks 0..n of a new value among ``n`` baseline values: ``inv_cdf((r + 0.5) / (n + 1))``."""
    inv = statistics.NormalDist().inv_cdf
    return tuple(inv((r + 0.5) / (n + 1)) for r in range(n + 1))


@functools.lru_cache(maxsize=32)
def _score_table(n: int) -> np.ndarray:
    """``_scores(n)`` as a read-only array."""
    table = np.array(_scores(n))
    table.flags.writeable = False
    return table


@dataclass(frozen=True)
class Baseline:
    """The robust standardisation in force for one detector, fitted on its baseline window.

    ``median`` and ``scale`` (1.4826 MAD; the mean absolute deviation when the MAD is 0; never below
    ``min_rel_scale`` of the level) describe the in-control level. A value's standardised score is
    ``z = clip((score - mu) / sd, -clip, clip)`` (``score``) and the chart input the AR(1) innovation
    ``u = clip((z - rho z_prev) / sqrt(1 - rho^2), -clip, clip)`` (``whiten``), where ``score`` is

    - ``ranks`` mode (the series is noisier than the floor): the value's normal score, the inverse
      normal CDF of its (mid-)rank among the baseline values — in control exactly N(0, 1)-like
      whatever the distribution (skewed, heavy-tailed), and bounded (about 3.3 with 1,000 values);
    - ``scale`` mode (noise below the floor, e.g. a constant kernel count): ``(x - median) / scale``
      winsorised at ``clip``;

    and ``mu``, ``sd``, ``rho`` are the mean, standard deviation and lag-1 autocorrelation of the
    baseline values' own scores.
    """

    median: float
    scale: float
    mode: str  # ranks | scale
    mu: float
    sd: float
    rho: float  # clamped to 0..0.9
    clip: float
    samples: int
    sorted_values: tuple[float, ...] = ()  # ranks mode
    slope: float = 0.0  # per stream position, subtracted before scoring (young baselines on a trend)
    t_ref: float = 0.0  # the position ``median`` refers to
    upper_scale: float = 0.0  # scale mode, above the median (0: ``scale``)
    shift_scale: float = field(init=False)  # sqrt((1 - rho) / (1 + rho)): a unit step's size in the innovations

    def __post_init__(self) -> None:
        object.__setattr__(self, "shift_scale", math.sqrt((1.0 - self.rho) / (1.0 + self.rho)))
        object.__setattr__(self, "_innovation_sd", math.sqrt(1.0 - self.rho * self.rho))
        object.__setattr__(self, "_table", _scores(self.samples) if self.mode == "ranks" else ())
        # Young baselines: a new value's deviation from the median has variance (1 + pi / (2 n))
        # sigma^2, and a MAD from each side's n / 2 values has the precision of about 0.37 n / 2
        # values' standard deviation, so the score is Student-like with that many degrees of freedom.
        object.__setattr__(self, "_shrink", 1.0 / math.sqrt(1.0 + math.pi / (2.0 * max(1, self.samples))))
        object.__setattr__(self, "_dof", max(1.0, 0.37 * (self.samples / 2.0 - 1.0)))

    @classmethod
    def fit(cls, values: np.ndarray, clip: float, min_rel_scale: float) -> Baseline:
        """Estimate from values in time order."""
        med = float(np.median(values))
        dev = np.abs(values - med)
        scale = 1.4826 * float(np.median(dev))
        if scale <= 0.0:
            scale = 1.2533 * float(dev.mean())  # mean absolute deviation, normal-consistent
        floor = max(min_rel_scale * abs(med), 1e-12)
        if scale >= floor:
            order = np.argsort(values, kind="stable")
            ordered = values[order]
            n = values.size
            pos = np.arange(n)
            new_group = np.empty(n, dtype=bool)
            new_group[0] = True
            np.not_equal(ordered[1:], ordered[:-1], out=new_group[1:])
            lo = np.maximum.accumulate(np.where(new_group, pos, 0))  # first position of each value's tie group
            last = np.empty(n, dtype=bool)
            last[-1] = True
            last[:-1] = new_group[1:]
            hi = np.minimum.accumulate(np.where(last, pos, n)[::-1])[::-1] + 1  # one past its last position
            table = _score_table(n)
            z = np.empty(n)
            z[order] = (table[lo] + table[hi]) / 2.0
            mode, kept = "ranks", tuple(ordered.tolist())
        else:
            scale = floor
            z = np.clip((values - med) / scale, -clip, clip)
            mode, kept = "scale", ()
        mu = float(z.mean())
        centred = z - mu
        var = float(centred @ centred)
        sd = math.sqrt(var / max(1, z.size - 1))
        if sd < 1e-9:
            sd = 1.0  # a flat window: every in-control value scores 0 anyway
        rho = float(centred[1:] @ centred[:-1]) / var if var > 0 and z.size > 2 else 0.0
        if rho < 2.0 / math.sqrt(z.size):
            rho = 0.0  # not distinguishable from no correlation (2 standard errors): no whitening
        return cls(med, scale, mode, mu, sd, min(rho, 0.9), clip, int(values.size), kept)

    @classmethod
    def fit_young(cls, values: np.ndarray, times: np.ndarray, clip: float, min_rel_scale: float) -> Baseline:
        """Estimate from a young window (fewer values than the warm-up): robust level, scale and trend.

        Too few values for ranks (their normal scores are bounded near ``inv_cdf(1 / (n + 1))``): the
        score is ``(x - level) / scale`` winsorised at ``clip``. When Kendall's tau of the values
        against their positions is significant (p < ``TREND_P``), the level follows the Theil-Sen
        slope (``scipy.stats``) and the median and scale are those of the detrended values,
        ``median`` being the level at the window's last position. ``scale`` and ``upper_scale`` are
        the scales below and above it; ``score`` maps the standardised deviation through the
        Student t CDF of the baseline's precision and the inverse normal CDF (docs/drift.md).
        """
        t_ref = float(times[-1])
        slope = 0.0
        if values.size >= 5 and np.ptp(values) > 0:
            tau = scipy.stats.kendalltau(times, values)
            if tau.pvalue < TREND_P:
                slope = float(scipy.stats.theilslopes(values, times).slope)
        resid = values - slope * (times - t_ref)
        med = float(np.median(resid))
        dev = resid - med
        # Skewed series (latency): one scale per side ("double MAD"), each from that side's deviations.
        sides = [1.4826 * float(np.median(np.abs(dev[dev <= 0]))), 1.4826 * float(np.median(dev[dev >= 0]))]
        mean_dev = 1.2533 * float(np.abs(dev).mean())
        sides = [s if s > 0.0 else mean_dev for s in sides]
        scale = max(sides) if slope else min(sides)
        if slope:
            # The chart scores values up to half a window ahead of the fit: on a curved trend the
            # extrapolation errors exceed the residuals. The scale is at least that of the errors
            # made forecasting the window's second half from a trend fitted on its first.
            half = values.size // 2
            fit = scipy.stats.theilslopes(values[:half], times[:half])
            err = values[half:] - (fit.intercept + fit.slope * times[half:])
            scale = max(scale, 1.4826 * float(np.median(np.abs(err))))
        floor = max(min_rel_scale * abs(med), 1e-12)
        lower, upper = (max(scale, floor), max(scale, floor)) if slope else (max(s, floor) for s in sides)
        # Scores are not restandardised by their own spread (mu 0, sd 1): that would undo the floor.
        z = np.clip(dev / np.where(dev > 0, upper, lower), -clip, clip)
        centred = z - float(z.mean())
        var = float(centred @ centred)
        n = z.size
        rho = float(centred[1:] @ centred[:-1]) / var if var > 0 and n > 2 else 0.0
        if rho < 2.0 / math.sqrt(n):
            rho = 0.0  # as in ``fit``: used when above two standard errors
        return cls(med, lower, "scale", 0.0, 1.0, min(rho, 0.9), clip, int(values.size), (), slope, t_ref, upper)

    def score(self, x: float, t: float = 0.0) -> float:
        """A value's standardised score ``z`` (N(0, 1)-like in control, bounded by ``clip``) at position ``t``."""
        c = self.clip
        if self.slope:
            x -= self.slope * (t - self.t_ref)
        if self.mode == "ranks":
            table, ordered = self._table, self.sorted_values  # type: ignore[attr-defined]
            z = (table[bisect.bisect_left(ordered, x)] + table[bisect.bisect_right(ordered, x)]) / 2
        else:
            d = x - self.median
            z = d / (self.upper_scale if d > 0 and self.upper_scale else self.scale)
            if self.upper_scale:  # a young baseline: its error taken into the score (fit_young)
                z = _NORMAL.inv_cdf(min(max(float(scipy.special.stdtr(self._dof, z * self._shrink)), 1e-12), 1 - 1e-12))
            z = c if z > c else (-c if z < -c else z)
        z = (z - self.mu) / self.sd
        return c if z > c else (-c if z < -c else z)

    def whiten(self, z: float, previous: float) -> float:
        """The chart input: the AR(1) innovation of score ``z`` after ``previous`` (bounded by ``clip``)."""
        c = self.clip
        u = (z - self.rho * previous) / self._innovation_sd  # type: ignore[attr-defined]
        return c if u > c else (-c if u < -c else u)

    def standardise(self, x: float, previous: float = 0.0) -> float:
        """The chart input for one value whose predecessor scored ``previous``."""
        return self.whiten(self.score(x), previous)


def siegmund_arl(k: float, h: float) -> float:
    """Siegmund's approximation of a one-sided CUSUM's in-control average run length.

    ``(exp(2 k b) - 2 k b - 1) / (2 k^2)`` with ``b = h + 1.166``, for independent N(0, 1) inputs
    (and, with ``k`` replaced by ``k - d``, the delay for a shift ``d``).
    """
    b = h + 1.166
    if abs(k) < 1e-9:
        return b * b
    a = 2.0 * k * b
    return (math.exp(a) - a - 1.0) / (2.0 * k * k)


def _log_arl(k: float, h: float, samples: int) -> float:
    """Log of Siegmund's in-control ARL, less the loss expected from a baseline fitted on ``samples`` values.

    The fitted level is off by ``e ~ N(0, 1 / samples)`` in innovation units (whatever the
    autocorrelation: a correlated window's mean is noisier by ``(1 + rho) / (1 - rho)`` and the
    innovations shrink a level by the inverse), which moves ``k`` to ``k - e`` and multiplies the
    false-alarm rate by ``E exp(2 b e) = exp(2 b^2 / samples)``: the smaller ``k``, the larger ``b``
    and the loss.
    """
    b = h + 1.166
    a = 2.0 * k * b
    # Past a = 50 the exponential alone is the ARL to double precision (and may overflow a float).
    log = a - math.log(2.0 * k * k) if a > 50.0 else math.log(siegmund_arl(k, h))
    return log - (2.0 * b * b / samples if samples > 0 else 0.0)


def matched_interval(k: float, h: float, k_new: float, samples: int = 0) -> float:
    """The decision interval that gives reference value ``k_new`` the in-control run length of ``(k, h)``.

    Siegmund's approximation, with the loss of a baseline fitted on ``samples`` values (0: none)
    counted on both sides, solved by bisection. Where no interval reaches it (a reference value so
    small that the baseline's own error is as large: ``rho`` above about 0.8 with 500 values), the
    interval matched without that loss is returned.
    """
    if k_new == k or k <= 0.0 or k_new <= 0.0:
        return h
    target = _log_arl(k, h, samples)
    top = 1e6 if samples <= 0 else k_new * samples / 2.0 - 1.166  # the loss-adjusted ARL peaks there
    if top <= 0.0 or _log_arl(k_new, top, samples) < target:
        return h if samples <= 0 else matched_interval(k, h, k_new)
    lo, hi = 0.0, max(h, 1.0)
    while hi < top and _log_arl(k_new, hi, samples) < target:
        hi = min(hi * 2.0, top)
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if _log_arl(k_new, mid, samples) < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0


def young_chart(k: float, h: float, k_min: float, samples: int, warmup: int) -> tuple[float, float]:
    """The reference value and decision interval for a baseline of ``samples`` values, fewer than ``warmup``.

    The target is the loss-adjusted in-control run length of ``(k, h)`` on a baseline of ``warmup``
    values (``_log_arl``). A short baseline's error caps the run length any interval reaches with a
    given reference value (the cap rises with it), so the reference value is ``YOUNG_MARGIN`` times
    the smallest one whose cap reaches the target (and at least ``k_min``, the reference value the
    baseline's autocorrelation calls for), and the interval is the one that reaches it, by bisection.
    """
    target = _log_arl(k, h, warmup)

    def peak(k_new: float) -> float:
        top = k_new * samples / 2.0 - 1.166
        return _log_arl(k_new, top, samples) if top > 0.0 else -math.inf

    lo, hi = k_min, max(k_min, 1.0)
    if peak(k_min) < target:
        while peak(hi) < target:
            hi *= 2.0
        for _ in range(50):
            mid = (lo + hi) / 2.0
            if peak(mid) < target:
                lo = mid
            else:
                hi = mid
        k_new = hi * YOUNG_MARGIN
    else:
        k_new = k_min
    top = k_new * samples / 2.0 - 1.166
    a, b = 0.0, top
    for _ in range(60):
        mid = (a + b) / 2.0
        if _log_arl(k_new, mid, samples) < target:
            a = mid
        else:
            b = mid
    return k_new, b
