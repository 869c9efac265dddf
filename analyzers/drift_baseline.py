"""The drift detectors' front end: a robust, self-refreshing baseline, and the CUSUM run-length arithmetic.

``Baseline`` standardises values against a window of in-control values (normal scores of ranks,
or a floored scale for flat series; AR(1) pre-whitening), or, while young, against a robust level,
a scale per side and a significant trend (``fit_young``); ``siegmund_arl``, ``matched_interval``,
``young_chart`` and ``young_widening`` size a CUSUM's reference value and decision interval.
Derivations and measured figures: docs/drift.md.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

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


# Hand-written statistics: scipy.stats / scipy.special would cost the agent 27-72 MiB of RSS (the
# daemon's budget is 120 MiB, tests/unit/test_agent_imports.py), and every series starts young, so a
# lazy import would not help. Each is checked against scipy in tests/unit/test_drift_stats.py.


@functools.lru_cache(maxsize=64)
def _kendall_null_cdf(n: int) -> np.ndarray:
    """P(at most c discordant pairs), c = 0..n(n-1)/2, among the n! equally likely orders (no ties).

    The Mahonian numbers by the standard recursion: inserting the j-th value adds 0..j-1 inversions.
    """
    counts = np.ones(1)
    for j in range(2, n + 1):
        counts = np.convolve(counts, np.ones(j))
    return np.cumsum(counts) / math.factorial(n)


def _tie_counts(v: np.ndarray) -> tuple[int, int, int]:
    """Tied pairs, sum t(t-1)(t-2) and sum t(t-1)(2t+5) over the tie groups (sizes t) of ``v``."""
    t = np.unique(v, return_counts=True)[1].astype(np.int64)
    t = t[t > 1]
    return int((t * (t - 1) // 2).sum()), int((t * (t - 1) * (t - 2)).sum()), int((t * (t - 1) * (2 * t + 5)).sum())


def kendall_tau_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided p-value of Kendall's tau between ``x`` and ``y``, as ``scipy.stats.kendalltau`` gives it.

    Without ties and with at most 33 values (or at most one pair out of order) the exact null
    distribution; otherwise the normal approximation of concordant minus discordant pairs with the
    tie-corrected variance (Kendall, 1970). NaN when either side is constant.
    """
    n = x.size
    iu = np.triu_indices(n, 1)
    sx = np.sign(x[:, None] - x[None, :])[iu]
    sy = np.sign(y[:, None] - y[None, :])[iu]
    s = int((sx * sy).sum())  # concordant minus discordant
    dis = int(np.count_nonzero(sx * sy < 0))
    tot = n * (n - 1) // 2
    xtie, x0, x1 = _tie_counts(x)
    ytie, y0, y1 = _tie_counts(y)
    if tot in (xtie, ytie):
        return math.nan
    c = min(dis, tot - dis)
    if xtie == 0 and ytie == 0 and (n <= 33 or c <= 1):
        if n <= 33:
            return min(1.0, 2.0 * float(_kendall_null_cdf(n)[c]))
        return 2.0 * math.exp(math.log(1 + c * (n - 1)) - math.lgamma(n + 1))  # c = 0: 2/n!; c = 1: 2/(n-1)!
    m = n * (n - 1.0)
    var = (m * (2 * n + 5) - x1 - y1) / 18 + 2.0 * xtie * ytie / m + x0 * y0 / (9 * m * (n - 2))
    return math.erfc(abs(s) / math.sqrt(var) / math.sqrt(2.0))


def theil_sen(y: np.ndarray, x: np.ndarray) -> tuple[float, float]:
    """Theil-Sen slope (median of the pairwise slopes) and intercept ``median(y) - slope median(x)``."""
    iu = np.triu_indices(x.size, 1)
    dx = (x[:, None] - x[None, :])[iu]
    dy = (y[:, None] - y[None, :])[iu]
    keep = dx != 0
    slope = float(np.median(dy[keep] / dx[keep]))
    return slope, float(np.median(y)) - slope * float(np.median(x))


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        for num in (even, odd):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return f


def _betainc(a: float, b: float, x: float, y: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)``, with ``y = 1 - x`` given exactly."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    front = math.exp(a * math.log(x) + b * math.log(y) + math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, y) / b


def student_t_cdf(dof: float, t: float) -> float:
    """The Student t CDF with ``dof`` (real, > 0) degrees of freedom, as ``scipy.special.stdtr``."""
    t2 = t * t
    tail = 0.5 * _betainc(dof / 2.0, 0.5, dof / (dof + t2), t2 / (dof + t2))
    return 1.0 - tail if t > 0 else tail


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
        slope and the median and scale are those of the detrended values,
        ``median`` being the level at the window's last position. ``scale`` and ``upper_scale`` are
        the scales below and above it; ``score`` maps the standardised deviation through the
        Student t CDF of the baseline's precision and the inverse normal CDF (docs/drift.md).
        """
        t_ref = float(times[-1])
        slope = 0.0
        if values.size >= 5 and np.ptp(values) > 0 and kendall_tau_p(times, values) < TREND_P:
            slope = theil_sen(values, times)[0]
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
            fit_slope, fit_intercept = theil_sen(values[:half], times[:half])
            err = values[half:] - (fit_intercept + fit_slope * times[half:])
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
                z = _NORMAL.inv_cdf(min(max(student_t_cdf(self._dof, z * self._shrink), 1e-12), 1 - 1e-12))
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


def _crossing(f: Callable[[float], float], target: float, lo: float, hi: float, steps: int) -> tuple[float, float]:
    """Bisection of a rising ``f``: the bracket ``(lo, hi)`` narrowed ``steps`` times around ``f(x) = target``."""
    for _ in range(steps):
        mid = (lo + hi) / 2.0
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return lo, hi


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
    lo, hi = _crossing(lambda x: _log_arl(k_new, x, samples), target, lo, hi, 60)
    return (lo + hi) / 2.0


def young_widening(rho: float, samples: int) -> float:
    """The factor a young CUSUM's ``k`` and ``h`` are widened by for the autocorrelation its baseline cannot exclude.

    The chart input is whitened with the estimate ``rho`` (0 when below two standard errors); the
    true correlation may be up to ``r = rho + 2 / sqrt(samples)`` (at most 0.9), which leaves the
    input a long-run standard deviation ``sqrt((1 - rho) (1 + r) / ((1 + rho) (1 - r)))``. A CUSUM of
    inputs with long-run deviation ``s`` runs as the chart ``(k / s, h / s)`` of standardised ones,
    so ``(s k, s h)`` keeps the designed run length. docs/drift.md.
    """
    r = min(0.9, rho + 2.0 / math.sqrt(max(1, samples)))
    return math.sqrt((1.0 - rho) * (1.0 + r) / ((1.0 + rho) * (1.0 - r))) if r > rho else 1.0


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
        k_new = _crossing(peak, target, lo, hi, 50)[1] * YOUNG_MARGIN
    else:
        k_new = k_min
    top = k_new * samples / 2.0 - 1.166
    return k_new, _crossing(lambda x: _log_arl(k_new, x, samples), target, 0.0, top, 60)[1]
