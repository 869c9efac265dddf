"""Drift: online change-point detection (CUSUM, EWMA) on a robust baseline.

``Cusum`` (two-sided tabular CUSUM) and ``Ewma`` share one front end (``drift_baseline``): a robust,
self-refreshing baseline whose chart input is the AR(1) innovation of each value's normal score.
Both take one value at a time (``update(x) -> ChangePoint | None``) or a sequence (``run``, which is
exactly repeated ``update``), and re-baseline by themselves after an alarm. docs/drift.md derives the
front end, the choice of ``k`` and ``h``, and the change-point and magnitude estimates, with the
figures ``benchmarks/drift_quality.py`` measures. ``aaco.analyzers.drift_analyzer.DriftAnalyzer``
applies a detector to each model's iteration latency, kernels per iteration and kernel time per
iteration.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import numpy as np

from aaco.analyzers.drift_baseline import Baseline, matched_interval, young_chart, young_widening


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


class _Detector:
    """Baseline handling shared by the charts: young and full baselines, lagged refresh, re-baselining.

    The chart runs from ``start`` values on, on a young baseline (``Baseline.fit_young``: robust level,
    scale per side and significant trend; lag and refresh a quarter of its size) until the baseline
    holds ``warmup`` values, then on the full one (ranks, ``lag``, ``refresh``). docs/drift.md.
    """

    kind: ClassVar[str]

    def __init__(
        self,
        *,
        warmup: int = 200,
        start: int = 10,
        window: int = 500,
        lag: int = 50,
        refresh: int = 50,
        clip: float = 3.0,
        min_rel_scale: float = 0.005,
    ) -> None:
        if warmup < 10:
            raise ValueError(f"warmup must be at least 10 values, got {warmup}")
        if not 5 <= start <= warmup:
            raise ValueError(f"start must be between 5 and warmup ({warmup}), got {start}")
        if window < warmup:
            raise ValueError(f"window ({window}) must hold at least warmup ({warmup}) values")
        if lag < 1 or refresh < 1:
            raise ValueError("lag and refresh must be at least 1")
        if clip <= 0 or min_rel_scale < 0:
            raise ValueError("clip must be positive and min_rel_scale not negative")
        self.warmup = warmup
        self.start = start
        self.window = window
        self.lag = lag
        self.refresh = refresh
        self.clip = clip
        self.min_rel_scale = min_rel_scale
        self._n = 0
        self._ring = np.empty(window, dtype=np.float64)
        self._times = np.empty(window, dtype=np.float64)  # the ring's values' positions in the stream
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
            self._push(i, x)
            if self._len >= self.start:
                self._start(i + 1)
            return None
        b = self._baseline
        z = b.score(x, i)
        u = b.whiten(z, self._previous)
        self._previous = z
        self._recent.append((i, x))
        young = self._len < self.warmup
        lag, refresh = self._lag_refresh()
        while len(self._recent) > lag:
            self._push(*self._recent.popleft())
            self._since_refresh += 1
        if self._since_refresh >= refresh or (young and self._len >= self.warmup):
            self._fit()
        hit = self._step(u, i)
        return None if hit is None else self._alarm(*hit, i)

    def _lag_refresh(self) -> tuple[int, int]:
        """``lag`` and ``refresh`` in force: a quarter of a young baseline (at least 2), capped by the settings."""
        if self._len >= self.warmup:
            return self.lag, self.refresh
        young = max(2, self._len // 4)
        return min(self.lag, young), min(self.refresh, young)

    def _push(self, t: int, x: float) -> None:
        self._times[self._pos] = t
        self._ring[self._pos] = x
        self._pos = (self._pos + 1) % self.window
        self._len = min(self._len + 1, self.window)

    def _ordered(self, ring: np.ndarray) -> np.ndarray:
        if self._len < self.window:
            return ring[: self._len].copy()
        return np.concatenate([ring[self._pos :], ring[: self._pos]])

    def _fit(self) -> None:
        values, times = self._ordered(self._ring), self._ordered(self._times)
        if self._len >= self.warmup:
            self._baseline = Baseline.fit(values, self.clip, self.min_rel_scale)
        else:
            self._baseline = Baseline.fit_young(values, times, self.clip, self.min_rel_scale)
        self._since_refresh = 0
        self._adapt(self._baseline)

    def _start(self, next_index: int) -> None:
        self._fit()
        self._previous = 0.0
        self._reset(next_index)

    def _alarm(self, direction: str, start: int, statistic: float, i: int) -> ChangePoint:
        b = self._baseline
        assert b is not None
        post = [(j, x) for j, x in self._recent if j >= start]
        new_level = float(np.median([x for _, x in post]))
        magnitude = abs(new_level - b.median) / b.scale
        cp = ChangePoint(start, i, direction, magnitude, b.median, b.scale, new_level, statistic)
        # Re-baseline on the values after the alarm: those that raised it were selected by it (the
        # extreme ones of the new level, or of the noise when the alarm is false), and a short baseline
        # started on them would be biased enough to raise the next alarm the other way.
        self._baseline = None
        self._recent.clear()
        self._len = self._pos = 0
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
            "start": self.start,
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
    ``h_in_force``); on a young baseline both come from ``young_chart``, widened by
    ``young_widening`` for the autocorrelation the young baseline cannot exclude. Other keywords: see
    ``_Detector`` (``warmup``, ``start``, ``window``, ``lag``,
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
        if baseline.samples < self.warmup:
            k_young, h_young = young_chart(self.k, self.h, k, baseline.samples, self.warmup)
            widen = young_widening(baseline.rho, baseline.samples)
            self.k_in_force, self.h_in_force = widen * k_young, widen * h_young
            return
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
