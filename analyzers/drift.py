"""Drift: online change-point detection (CUSUM, EWMA) on a robust baseline, applied per model.

Two detectors share one front end, a robust and self-refreshing baseline, and differ in the chart:

- ``Cusum``: two-sided tabular CUSUM, ``S+ = max(0, S+ + u - k)``, ``S- = max(0, S- - u - k)``,
  alarm when either exceeds ``h``;
- ``Ewma``: ``z = (1 - lam) z + lam u``, alarm when ``|z|`` exceeds ``L`` times its standard
  deviation (the exact, time-varying limit from the start of monitoring).

Both take one value at a time (``update(x) -> ChangePoint | None``) or a sequence (``run``, which
is exactly repeated ``update``), and re-baseline by themselves after an alarm.

Why this front end (real latency series are not Gaussian white noise):

- **Robust baseline.** The in-control level is the median of a window of past values and its
  spread 1.4826 x the MAD (the normal-consistent median absolute deviation), not the mean and
  standard deviation, which one spike would move. They give ``ChangePoint.baseline``, ``sigma``
  and ``magnitude``.
- **Heavy tails, skew and outliers.** The chart input is not ``(x - median) / MAD`` but the
  value's *normal score*: the inverse normal CDF of its mid-rank among the baseline window
  (``(r + 0.5) / (n + 1)``). In control this is N(0, 1)-like whatever the distribution: latency is
  right-skewed (a median/MAD z-score of a lognormal series has a heavy upper tail and doubled the
  upward false alarms in ``benchmarks/drift_quality.py``), heavy-tailed or contaminated by spikes,
  and the score of any value is bounded (about 3.1 with 500 baseline values), so a single spike
  adds at most ``clip - k`` to a CUSUM sum: with ``h = 9`` it takes four spikes in a row, or a real
  shift, to alarm. The scores are centred and scaled by their own mean and standard deviation over
  the window (ties in discrete series make them differ from 0 and 1) and clipped at ``clip`` (3).
- **Autocorrelation.** Consecutive latencies are correlated (queueing, clocks, caches), and a
  CUSUM's false-alarm and delay arithmetic holds for independent inputs. The chart is fed the
  *innovations* of an AR(1) model instead of the scores themselves (pre-whitening):
  ``u_t = (z_t - rho z_(t-1)) / sqrt(1 - rho^2)``, independent N(0, 1)-like in control, with ``rho``
  the lag-1 autocorrelation of the window's scores (used when above two standard errors,
  ``2 / sqrt(n)``, and at most 0.9; negative correlation is not credited). A step of ``d`` sigma
  shows in the innovations as ``d sqrt((1 - rho) / (1 + rho))`` after its first value (``0.58 d``
  at ``rho = 0.5``): a correlated series carries less information per value about a shift, so
  the CUSUM's reference value is scaled to that size (``k rho-adjusted = k sqrt((1 - rho) /
  (1 + rho))``, still half the innovation shift of a 1-sigma step) and its decision interval is
  raised to keep the in-control average run length of the white-noise design (Siegmund's
  approximation below, solved for ``h``, with the false alarms that the fitted baseline's own error
  adds counted on both sides: ``matched_interval``): at ``rho = 0.5`` with 500 baseline values,
  ``k = 0.29`` and ``h = 15.8``. No detector can do much better there: the Kullback-Leibler
  information of a 1-sigma step at ``rho = 0.5`` is a third of that at ``rho = 0``
  (``(1 - rho) / (1 + rho)``), so at the same false-alarm rate the delay is about three times
  longer. ``benchmarks/drift_quality.py`` measures it beside an oracle CUSUM that knows the level,
  the noise and ``rho`` exactly: 47 values of delay at 1 sigma (0.34 false alarms per 10,000) for
  the oracle, 54 (0.76) for this detector, which measured 64 when the correlation was handled by
  inflating the scores' variance instead.
- **Slow trends.** The baseline is refitted every ``refresh`` (50) values from the last ``window``
  (500) in-control values that are at least ``lag`` (50) values old, so it follows a slow trend
  (latency creeping up over hours) instead of alarming on it, while a fresh shift cannot leak into
  its own baseline before the chart has had ``lag`` values to catch it. A 500-value window balances
  the two costs of a refitted baseline: the noise of its estimate (larger windows) and how far it
  lags behind a trend (smaller windows).
- **Flat series.** When the robust spread is below ``min_rel_scale`` (0.5 %) of the level (kernels
  per iteration are often exactly constant; a latency steady to a few microseconds), ranks would
  turn immaterial differences into alarms: the baseline then scores ``(x - median) / scale``
  winsorised at ``clip``, with the scale floored at 0.5 % of the level (and 1e-12). A constant
  series never alarms; a constant series that moves by a few percent alarms within four values.

Choice of ``k`` and ``h`` (ARL reasoning). ``k = 0.5`` is optimal for a 1-sigma shift (``k`` is half
the shift to detect fastest). Siegmund's approximation gives the in-control average run length of
a one-sided CUSUM as ``ARL0 = (exp(2 k b) - 2 k b - 1) / (2 k^2)`` with ``b = h + 1.166``, and its
delay for a shift ``d`` as the same formula with ``k`` replaced by ``k - d``. With ``h = 9``:
two-sided ``ARL0`` about 26,000 values (0.4 false alarms per 10,000) and about 18 values of delay at
1 sigma, 5 at 2 sigma. The goals (at most 1 false alarm per 10,000 values, at most 20 values of
delay at 1 sigma) leave little room between them: ``h = 8.5`` would save a value of delay but
measured 0.94-1.10 false alarms per 10,000 on Gaussian, heavy-tailed, trending and contaminated
series (the estimated baseline costs more than the formula says), where ``h = 9`` measures
0.4-0.7. The EWMA (``lam = 0.1``, ``L = 4.1``) is set to a similar false-alarm rate; it is slower
at 1 sigma (about 20 values on Gaussian noise, against 16.5) and as fast at 2, and is kept as the
alternative chart. ``benchmarks/drift_quality.py`` measures both on Gaussian, heavy-tailed, skewed,
contaminated, autocorrelated and trending series.

Change point and magnitude. ``ChangePoint.index`` is the estimated first value of the new level
(the value after the chart statistic last stood at zero, the classical CUSUM estimate; for the
EWMA, after its last crossing of zero); ``detected_at`` the value at which the alarm was raised.
``magnitude`` is ``|new_level - baseline| / sigma``, in baseline sigmas (robust scale), where
``new_level`` is the median of the values from ``index`` to ``detected_at``; ``ratio`` is
``new_level / baseline``. After an alarm the detector re-baselines on the values from ``index`` on
and stays silent until it holds ``warmup`` (200) values of the new level: a baseline from fewer
values misplaces the level by enough to double the false alarms of the first few hundred values.

``aaco.analyzers.drift_analyzer.DriftAnalyzer`` applies a detector to the iteration latency of each
model and to its kernels per iteration and kernel time per iteration.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final

import numpy as np


@dataclass(frozen=True, slots=True)
class ChangePoint:
    """A detected change of level.

    ``index`` is the estimated first value of the new level and ``detected_at`` the value that raised
    the alarm (0-based positions in the stream the detector was fed, non-finite values included).
    ``magnitude`` is ``|new_level - baseline| / sigma`` (baseline sigmas; ``sigma`` is the robust scale).
    """

    index: int
    detected_at: int
    direction: str  # up | down
    magnitude: float
    baseline: float
    sigma: float
    new_level: float
    statistic: float  # the chart statistic when it alarmed

    @property
    def ratio(self) -> float | None:
        """``new_level / baseline`` (None when the baseline is not positive)."""
        return self.new_level / self.baseline if self.baseline > 0 else None

    @property
    def delay(self) -> int:
        """Values between the estimated change and the alarm."""
        return self.detected_at - self.index

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "index": self.index,
            "detected_at": self.detected_at,
            "direction": self.direction,
            "magnitude": self.magnitude,
            "baseline": self.baseline,
            "sigma": self.sigma,
            "new_level": self.new_level,
            "ratio": self.ratio,
            "statistic": self.statistic,
        }


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
    shift_scale: float = field(init=False)  # sqrt((1 - rho) / (1 + rho)): a unit step's size in the innovations

    def __post_init__(self) -> None:
        object.__setattr__(self, "shift_scale", math.sqrt((1.0 - self.rho) / (1.0 + self.rho)))
        object.__setattr__(self, "_innovation_sd", math.sqrt(1.0 - self.rho * self.rho))
        object.__setattr__(self, "_table", _scores(self.samples) if self.mode == "ranks" else ())

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

    def score(self, x: float) -> float:
        """A value's standardised score ``z`` (N(0, 1)-like in control, bounded by ``clip``)."""
        c = self.clip
        if self.mode == "ranks":
            table, ordered = self._table, self.sorted_values  # type: ignore[attr-defined]
            z = (table[bisect.bisect_left(ordered, x)] + table[bisect.bisect_right(ordered, x)]) / 2
        else:
            z = (x - self.median) / self.scale
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


class _Detector:
    """Baseline handling shared by the charts: warm-up, lagged refresh, re-baselining after an alarm."""

    kind: ClassVar[str]

    def __init__(
        self,
        *,
        warmup: int = 200,
        window: int = 500,
        lag: int = 50,
        refresh: int = 50,
        clip: float = 3.0,
        min_rel_scale: float = 0.005,
    ) -> None:
        if warmup < 10:
            raise ValueError(f"warmup must be at least 10 values, got {warmup}")
        if window < warmup:
            raise ValueError(f"window ({window}) must hold at least warmup ({warmup}) values")
        if lag < 1 or refresh < 1:
            raise ValueError("lag and refresh must be at least 1")
        if clip <= 0 or min_rel_scale < 0:
            raise ValueError("clip must be positive and min_rel_scale not negative")
        self.warmup = warmup
        self.window = window
        self.lag = lag
        self.refresh = refresh
        self.clip = clip
        self.min_rel_scale = min_rel_scale
        self._n = 0
        self._ring = np.empty(window, dtype=np.float64)
        self._len = 0
        self._pos = 0
        self._recent: deque[tuple[int, float]] = deque()
        self._baseline: Baseline | None = None
        self._since_refresh = 0
        self._previous = 0.0  # the last value's score, for the AR(1) innovation
        self.skipped = 0  # non-finite values

    @property
    def samples(self) -> int:
        """Values fed so far (non-finite ones included)."""
        return self._n

    @property
    def baseline(self) -> Baseline | None:
        """The baseline in force (None while warming up or re-baselining)."""
        return self._baseline

    @property
    def monitoring(self) -> bool:
        """True when the chart runs (a baseline is in force)."""
        return self._baseline is not None

    def run(self, values: Iterable[float]) -> list[ChangePoint]:
        """Feed ``values`` in (continuing the stream) and return the change points found, in order."""
        out = []
        for x in values:
            cp = self.update(x)
            if cp is not None:
                out.append(cp)
        return out

    def update(self, x: float) -> ChangePoint | None:
        """Fold one value in; a ``ChangePoint`` when it raises an alarm."""
        i = self._n
        self._n += 1
        x = float(x)
        if not math.isfinite(x):
            self.skipped += 1
            return None
        if self._baseline is None:
            self._push(x)
            if self._len >= self.warmup:
                self._start(i + 1)
            return None
        b = self._baseline
        z = b.score(x)
        u = b.whiten(z, self._previous)
        self._previous = z
        self._recent.append((i, x))
        if len(self._recent) > self.lag:
            self._push(self._recent.popleft()[1])
            self._since_refresh += 1
            if self._since_refresh >= self.refresh:
                self._fit()
        hit = self._step(u, i)
        return None if hit is None else self._alarm(*hit, i)

    def _push(self, x: float) -> None:
        self._ring[self._pos] = x
        self._pos = (self._pos + 1) % self.window
        self._len = min(self._len + 1, self.window)

    def _values(self) -> np.ndarray:
        if self._len < self.window:
            return self._ring[: self._len].copy()
        return np.concatenate([self._ring[self._pos :], self._ring[: self._pos]])

    def _fit(self) -> None:
        self._baseline = Baseline.fit(self._values(), self.clip, self.min_rel_scale)
        self._since_refresh = 0
        self._adapt(self._baseline)

    def _start(self, next_index: int) -> None:
        self._fit()
        self._previous = 0.0
        self._reset(next_index)

    def _alarm(self, direction: str, start: int, statistic: float, i: int) -> ChangePoint:
        b = self._baseline
        assert b is not None
        post = [x for j, x in self._recent if j >= start]
        new_level = float(np.median(post))
        magnitude = abs(new_level - b.median) / b.scale
        cp = ChangePoint(start, i, direction, magnitude, b.median, b.scale, new_level, statistic)
        # Re-baseline on the new level: the values since the estimated change are its first ones.
        self._baseline = None
        self._recent.clear()
        self._len = self._pos = 0
        for x in post[-self.window :]:
            self._push(x)
        if self._len >= self.warmup:
            self._start(i + 1)
        return cp

    def _adapt(self, baseline: Baseline) -> None:
        """Adjust the chart to a new baseline (its autocorrelation); nothing by default."""

    def _reset(self, next_index: int) -> None:
        raise NotImplementedError

    def _step(self, u: float, i: int) -> tuple[str, int, float] | None:
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """The detector's settings (JSON)."""
        return {
            "detector": self.kind,
            "warmup": self.warmup,
            "window": self.window,
            "lag": self.lag,
            "refresh": self.refresh,
            "clip": self.clip,
            "min_rel_scale": self.min_rel_scale,
        }


class Cusum(_Detector):
    """Two-sided tabular CUSUM on the robust baseline, re-baselining after each alarm.

    ``k`` (reference value) and ``h`` (decision interval) are in units of the standardised input
    of an uncorrelated series; the defaults (0.5, 9) are argued in the module docstring. On a
    correlated baseline the chart runs on the innovations with ``k`` scaled by the baseline's
    ``shift_scale`` and ``h`` matched to the same in-control run length (``k_in_force``,
    ``h_in_force``). Other keywords: see ``_Detector`` (``warmup``, ``window``, ``lag``,
    ``refresh``, ``clip``, ``min_rel_scale``).
    """

    kind: ClassVar[str] = "cusum"

    def __init__(self, k: float = 0.5, h: float = 9.0, **kw: Any) -> None:
        if k < 0 or h <= 0:
            raise ValueError(f"k must be >= 0 and h > 0, got k={k}, h={h}")
        super().__init__(**kw)
        self.k = k
        self.h = h
        self.k_in_force = k
        self.h_in_force = h
        self._up = self._down = 0.0
        self._up_start = self._down_start = 0

    def _adapt(self, baseline: Baseline) -> None:
        k = self.k * baseline.shift_scale
        self.k_in_force = k
        self.h_in_force = matched_interval(self.k, self.h, k, baseline.samples)

    def _reset(self, next_index: int) -> None:
        self._up = self._down = 0.0
        self._up_start = self._down_start = next_index

    def _step(self, u: float, i: int) -> tuple[str, int, float] | None:
        k, h = self.k_in_force, self.h_in_force
        up = self._up + u - k
        if up <= 0.0:
            up = 0.0
            self._up_start = i + 1
        down = self._down - u - k
        if down <= 0.0:
            down = 0.0
            self._down_start = i + 1
        self._up, self._down = up, down
        if up > h:
            return ("up", self._up_start, up)
        if down > h:
            return ("down", self._down_start, down)
        return None

    @property
    def statistics(self) -> tuple[float, float]:
        """The current sums ``(S+, S-)``."""
        return (self._up, self._down)

    def params(self) -> dict[str, Any]:
        """Settings, with ``k`` and ``h``."""
        return {**super().params(), "k": self.k, "h": self.h}


class Ewma(_Detector):
    """EWMA control chart on the robust baseline, re-baselining after each alarm.

    ``lam`` is the smoothing weight, ``L`` the limit in standard deviations of the EWMA statistic
    (exact time-varying variance ``lam / (2 - lam) (1 - (1 - lam)^(2t))``). Other keywords: see
    ``_Detector``.
    """

    kind: ClassVar[str] = "ewma"

    def __init__(self, lam: float = 0.1, L: float = 4.1, **kw: Any) -> None:  # noqa: N803 (the chart's usual name)
        if not 0 < lam <= 1 or L <= 0:
            raise ValueError(f"lam must be in (0, 1] and L > 0, got lam={lam}, L={L}")
        super().__init__(**kw)
        self.lam = lam
        self.L = L
        self._z = 0.0
        self._t = 0
        self._up_start = self._down_start = 0

    def _reset(self, next_index: int) -> None:
        self._z = 0.0
        self._t = 0
        self._up_start = self._down_start = next_index

    def _step(self, u: float, i: int) -> tuple[str, int, float] | None:
        lam = self.lam
        z = (1.0 - lam) * self._z + lam * u
        self._z = z
        self._t += 1
        if z <= 0.0:
            self._up_start = i + 1
        if z >= 0.0:
            self._down_start = i + 1
        limit = self.L * math.sqrt(lam / (2.0 - lam) * (1.0 - (1.0 - lam) ** (2 * self._t)))
        if z > limit:
            return ("up", self._up_start, z)
        if z < -limit:
            return ("down", self._down_start, z)
        return None

    def params(self) -> dict[str, Any]:
        """Settings, with ``lam`` and ``L``."""
        return {**super().params(), "lam": self.lam, "L": self.L}


DETECTORS: Final[dict[str, type[_Detector]]] = {"cusum": Cusum, "ewma": Ewma}
