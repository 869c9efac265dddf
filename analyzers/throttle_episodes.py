"""Throttling episodes per GPU: one GPU's latest readings judged sample by sample (docs/throttle.md)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from aaco.analyzers.throttle_settings import POWER_LIMIT, REASONS, TEMPERATURE_LIMIT, ThrottleSettings
from aaco.contract import telemetry as m
from aaco.contract.snapshot import Finding


@dataclass
class Episode:
    """One throttling episode of one GPU for one reason."""

    node: str
    gpu: str
    reason: str
    start_ns: int
    end_ns: int | None = None  # None while open
    basis: set[str] = field(default_factory=set)  # vendor, clock_power, temperature
    samples: int = 0
    loaded_samples: int = 0
    load_unknown: bool = False
    min_clock_ratio: float | None = None
    peak_temperature_c: float | None = None
    reached_limit: bool = False
    max_power_w: float | None = None
    ended_by: str | None = None  # telemetry | silence

    @property
    def key(self) -> str:
        """A stable identity: ``node/gpu/reason/start_ns``."""
        return f"{self.node}/{self.gpu}/{self.reason}/{self.start_ns}"

    def severity(self) -> str:
        """``info`` (never loaded), ``critical`` (loaded, clock under 70 % or a sensor at its limit), or ``warning``."""
        if self.loaded_samples == 0 and not self.load_unknown:
            return "info"
        if (self.min_clock_ratio is not None and self.min_clock_ratio < 0.7) or self.reached_limit:
            return "critical"
        return "warning"

    def copy(self) -> Episode:
        """An independent copy (for a snapshot)."""
        return replace(self, basis=set(self.basis))

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "node": self.node,
            "gpu": self.gpu,
            "reason": self.reason,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "duration_s": (self.end_ns - self.start_ns) / 1e9 if self.end_ns is not None else None,
            "basis": sorted(self.basis),
            "severity": self.severity(),
            "samples": self.samples,
            "loaded_samples": self.loaded_samples,
            "min_clock_ratio": self.min_clock_ratio,
            "peak_temperature_c": self.peak_temperature_c,
            "max_power_w": self.max_power_w,
            "ended_by": self.ended_by,
        }

    def finding(self, analyzer: str, what: str) -> Finding:
        """The finding for this episode having ``started`` or ``ended``."""
        ts = self.start_ns if what == "started" else (self.end_ns or self.start_ns)
        detail = ""
        if what == "ended":
            detail = f" after {(self.end_ns - self.start_ns) / 1e9:.3g} s" if self.end_ns is not None else ""
            if self.min_clock_ratio is not None:
                detail += f", clock down to {self.min_clock_ratio:.0%} of its maximum"
            if self.peak_temperature_c is not None and self.reason == "thermal":
                detail += f", peak {self.peak_temperature_c:.0f} C"
        summary = f"gpu {self.gpu}: {self.reason} throttling {what}{detail}"
        evidence = {"episode": self.key, "state": "open" if what == "started" else "closed", **self.to_dict()}
        confidence = 0.9 if "vendor" in self.basis else 0.7
        return Finding(ts, self.node, analyzer, f"gpu {self.gpu}", self.severity(), confidence, summary, evidence)


@dataclass
class Gpu:
    """One GPU's latest readings, episodes and counters."""

    node: str
    gpu: str
    first_ts: int
    last_ts: int = 0
    readings: dict[tuple[str, str], tuple[float, int]] = field(default_factory=dict)  # (metric, attr) -> (value, ts)
    open: dict[str, Episode] = field(default_factory=dict)
    history: deque[Episode] = field(default_factory=deque)
    kept_from_ns: int = 0  # iterations before this cannot be classified (episodes forgotten)
    episodes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REASONS, 0))
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(REASONS, 0.0))

    def value(self, metric: str, attr: str, now: int, stale_ns: int) -> float | None:
        """The latest reading of a series, None when there is none within ``stale_ns`` of ``now``."""
        got = self.readings.get((metric, attr))
        return got[0] if got is not None and now - got[1] <= stale_ns else None

    def intervals(self) -> tuple[np.ndarray, np.ndarray]:
        """Union of all episodes (kept and open) as sorted disjoint [start, end) intervals; open ones end at +inf."""
        spans = sorted(
            [(e.start_ns, e.end_ns) for e in self.history] + [(e.start_ns, None) for e in self.open.values()]
        )
        starts: list[int] = []
        ends: list[float] = []
        for s, e in spans:
            end = float("inf") if e is None else float(e)
            if starts and s <= ends[-1]:
                ends[-1] = max(ends[-1], end)
            else:
                starts.append(s)
                ends.append(end)
        return np.array(starts, dtype=np.float64), np.array(ends, dtype=np.float64)


@dataclass(frozen=True)
class _Judgement:
    """What one sample of one GPU says: the basis of each reason, and the figures episodes record."""

    basis: dict[str, set[str]]
    loaded: bool | None
    at_cap: bool
    at_limit: bool
    clock_ratio: float | None
    peak_c: float | None
    power: float | None


class Episodes:
    """Every GPU's episodes; ``report`` is called with (episode, ``started`` | ``ended``) as they happen."""

    def __init__(self, settings: ThrottleSettings, report: Callable[[Episode, str], None]) -> None:
        self.settings = settings
        self.stale_ns = int(settings.stale_s * 1e9)
        self.gpus: dict[tuple[str, str], Gpu] = {}
        self.newest_ts = 0
        self._report = report

    def gpu(self, node: str, gpu: str, ts: int) -> Gpu | None:
        """The GPU's state, made on first sight; None past ``max_devices``."""
        g = self.gpus.get((node, gpu))
        if g is None:
            if len(self.gpus) >= self.settings.max_devices:
                return None
            g = self.gpus[(node, gpu)] = Gpu(node, gpu, first_ts=ts, kept_from_ns=ts)
        return g

    def power_cap(self, g: Gpu) -> float | None:
        """The GPU's cap as last published, else the configured one."""
        return g.value(POWER_LIMIT, "", g.last_ts, self.stale_ns) or self.settings.power_cap_w

    def _judge(self, g: Gpu, now: int) -> _Judgement:
        s = self.settings
        v = lambda metric, attr="": g.value(metric, attr, now, self.stale_ns)  # noqa: E731
        util = v(m.UTILIZATION)
        power = v(m.POWER)
        cap = v(POWER_LIMIT) or s.power_cap_w
        domain = "graphics" if v(m.CLOCK, "graphics") is not None else "sm"
        clock, clock_max = v(m.CLOCK, domain), v(m.CLOCK_MAX, domain)
        ratio = clock / clock_max if clock is not None and clock_max else None
        at_cap = power is not None and cap is not None and cap > 0 and power >= cap * (1.0 - s.power_margin)
        loaded = util >= s.load_threshold if util is not None else None
        temps = {
            attr: val
            for (metric, attr), (val, t) in g.readings.items()
            if metric == m.TEMPERATURE and now - t <= self.stale_ns
        }
        hot, at_limit, peak = False, False, max(temps.values()) if temps else None
        for sensor, temp in temps.items():
            limit = v(TEMPERATURE_LIMIT, sensor) or s.temperature_limits_c.get(sensor)
            if limit is not None and temp >= limit - s.temperature_margin_c:
                hot = True
                at_limit = at_limit or temp >= limit
        basis: dict[str, set[str]] = {r: set() for r in REASONS}
        for r in REASONS:
            flag = v(m.THROTTLE, r)
            if flag is not None and flag >= 0.5:
                basis[r].add("vendor")
        if at_cap and (loaded is None or loaded) and ratio is not None and ratio < s.clock_ratio:
            basis["power"].add("clock_power")
        if hot:
            basis["thermal"].add("temperature")
        return _Judgement(basis, loaded, at_cap, at_limit, ratio, peak, power)

    def evaluate(self, g: Gpu, now: int) -> None:
        """Judge the GPU's readings at ``now``: open, extend or close its episodes of each reason."""
        j = self._judge(g, now)
        if g.last_ts:
            step = min(now - g.last_ts, self.stale_ns) / 1e9
            for r in g.open:
                g.seconds[r] += step
        g.last_ts = now
        for r in REASONS:
            ep = g.open.get(r)
            if j.basis[r]:
                started = ep is None
                if ep is None:
                    ep = g.open[r] = Episode(g.node, g.gpu, r, now)
                    g.episodes[r] += 1
                _extend(ep, j, r)
                if started:
                    self._report(ep, "started")
            elif ep is not None:
                self._close(g, ep, now, "telemetry")
        self.newest_ts = max(self.newest_ts, now)

    def _close(self, g: Gpu, ep: Episode, end_ns: int, how: str) -> None:
        ep.end_ns = end_ns
        ep.ended_by = how
        del g.open[ep.reason]
        g.history.append(ep)
        while len(g.history) > self.settings.max_episodes:
            old = g.history.popleft()
            g.kept_from_ns = max(g.kept_from_ns, old.end_ns or old.start_ns)
        self._report(ep, "ended")

    def expire(self) -> None:
        """GPUs silent for ``stale_s`` (of the newest telemetry time) end their open episodes."""
        for g in self.gpus.values():
            if g.open and self.newest_ts - g.last_ts > self.stale_ns:
                for ep in list(g.open.values()):
                    self._close(g, ep, g.last_ts, "silence")


def _extend(ep: Episode, j: _Judgement, reason: str) -> None:
    """Add one throttled sample to an episode."""
    ep.basis |= j.basis[reason]
    ep.samples += 1
    ep.loaded_samples += 1 if j.loaded or (j.loaded is None and j.at_cap) else 0
    ep.load_unknown = ep.load_unknown or (j.loaded is None and not j.at_cap)
    if j.clock_ratio is not None:
        ep.min_clock_ratio = j.clock_ratio if ep.min_clock_ratio is None else min(ep.min_clock_ratio, j.clock_ratio)
    if j.peak_c is not None:
        ep.peak_temperature_c = j.peak_c if ep.peak_temperature_c is None else max(ep.peak_temperature_c, j.peak_c)
    ep.reached_limit = ep.reached_limit or (reason == "thermal" and j.at_limit)
    if j.power is not None:
        ep.max_power_w = j.power if ep.max_power_w is None else max(ep.max_power_w, j.power)
