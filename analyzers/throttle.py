"""Throttling: episodes per GPU from telemetry, and what they cost in iteration latency.

**Episodes.** Telemetry rows are evaluated per GPU and sample time (all readings of one GPU with one
``ts_ns``), in time order, against the latest reading of each series (readings older than
``stale_s`` are not used). A GPU is throttled for a reason when

- ``power``: the vendor says so (``aaco.gpu.throttle.active{reason=power}`` = 1), or the clock is
  below ``clock_ratio`` (90 %) of its maximum under load with power at its cap — graphics clock
  (``sm`` where there is no graphics domain) over ``aaco.gpu.clock.max``, utilisation at least
  ``load_threshold`` (0.5; unknown utilisation counts as loaded when power is at the cap), power
  within ``power_margin`` (5 %) of the cap. The cap is the GPU's ``aaco.gpu.power.limit`` reading
  where its source has one (nvidia-smi, NVML, rocm-smi, sysfs), else ``power_cap_w``; with
  neither, power throttling is only what the vendor reports;
- ``thermal``: the vendor says so, or a temperature sensor is within ``temperature_margin_c`` (5 C)
  of its limit: the GPU's ``aaco.gpu.temperature.limit{sensor}`` reading where published, else
  ``temperature_limits_c`` (edge 89 C — the A100's slowdown threshold —, junction 105 C — MI200 /
  MI300 hotspot throttling —, memory 95 C — HBM);
- ``current``, ``other``: the vendor says so (``other``: throttled without a stated reason, as
  amd-smi's ``throttle_status`` reports it).

An episode of a (GPU, reason) starts at the first sample where the condition holds and ends at
the first sample where it does not (``end_ns`` is that sample's time); a GPU silent for
``stale_s`` ends its open episodes at its last sample (``ended_by: silence``). No smoothing: one
throttled sample is one episode, as the inputs say. Severity: ``info`` when the GPU was never under
load during the episode (an idle GPU at low clocks costs nothing), ``critical`` when under load the
clock fell below 70 % of its maximum or a sensor reached its limit, else ``warning``. A finding is
emitted when an episode starts and when it ends (with its duration, clock floor, peak temperature
and power).

**Latency impact.** An iteration (``iterations`` rows) runs on the GPUs its model's kernels ran on
(learned from correlated ``kernels`` rows: ``model`` and ``device``), or, for a model whose kernels
are not seen or whose devices have no telemetry, on every GPU of its node with telemetry (one
process per GPU is the common layout; with several models per node it is conservative: an episode
on any GPU counts). It is *inside* when its [start, end] overlaps an episode of any reason on one
of its GPUs, *outside* when it overlaps none, and waits (bounded, ``max_pending``) until telemetry
covers its end. Iterations older than the telemetry kept (before a GPU's first sample, or before
the oldest of the ``max_episodes`` episodes kept per GPU) are counted as ``unknown``. Per model,
bounded reservoirs (``reservoir`` values, uniform sampling) of inside and outside latencies give
the impact: ``median(inside) / median(outside)`` with a percentile bootstrap 95 % confidence
interval (``bootstrap`` draws, seeded: results are reproducible; each resample's median is drawn
exactly from its order-statistic distribution, ``bootstrap_medians``). It is significant when both
sides have ``min_samples`` iterations and the interval excludes 1; a finding is emitted when it
becomes significant.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.analyzers.base import Analyzer
from aaco.analyzers.grouping import group
from aaco.contract import telemetry as m
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define
from aaco.contract.snapshot import Finding

POWER_LIMIT: Final = m.POWER_LIMIT  # W: the enforced cap, where the source knows it
TEMPERATURE_LIMIT: Final = "aaco.gpu.temperature.limit"  # Cel, attribute sensor; no source publishes it yet
REASONS: Final = m.THROTTLE_REASONS  # power, thermal, current, other
DEFAULT_TEMPERATURE_LIMITS_C: Final[dict[str, float]] = {"edge": 89.0, "junction": 105.0, "memory": 95.0}
DROP_REASONS: Final = ("max_devices", "max_models", "late_telemetry", "pending_overflow")
_ATTRIBUTE: Final[dict[str, str]] = {**m.SERIES_ATTRIBUTE, TEMPERATURE_LIMIT: "sensor"}

THROTTLE_ACTIVE = define(
    "aaco.throttle.active",
    "aaco_throttle_active",
    "gauge",
    "1",
    "1 while a GPU is in a throttling episode for a reason (power, thermal, current, other), else 0.",
    ("node", "gpu", "reason"),
)
THROTTLE_EPISODES = define(
    "aaco.throttle.episodes",
    "aaco_throttle_episodes",
    "counter",
    "{episode}",
    "Throttling episodes started, by GPU and reason.",
    ("node", "gpu", "reason"),
)
THROTTLE_SECONDS = define(
    "aaco.throttle.time",
    "aaco_throttle_seconds",
    "counter",
    "s",
    "Time a GPU spent throttled, by reason (telemetry time between samples while in an episode).",
    ("node", "gpu", "reason"),
)
IMPACT = define(
    "aaco.throttle.latency_impact",
    "aaco_throttle_latency_impact_ratio",
    "gauge",
    "1",
    "Median iteration latency inside throttling episodes over the median outside them.",
    ("node", "model"),
)
IMPACT_LOW = define(
    "aaco.throttle.latency_impact.ci_low",
    "aaco_throttle_latency_impact_ci_low_ratio",
    "gauge",
    "1",
    "Lower bound of the 95 % bootstrap confidence interval of the throttling latency impact ratio.",
    ("node", "model"),
)
IMPACT_HIGH = define(
    "aaco.throttle.latency_impact.ci_high",
    "aaco_throttle_latency_impact_ci_high_ratio",
    "gauge",
    "1",
    "Upper bound of the 95 % bootstrap confidence interval of the throttling latency impact ratio.",
    ("node", "model"),
)
ITERATIONS = define(
    "aaco.throttle.iterations",
    "aaco_throttle_iterations",
    "counter",
    "{iteration}",
    "Iterations classified against throttling episodes: inside, outside, unknown (no telemetry then).",
    ("node", "model", "state"),
)
DROPPED = define(
    "aaco.throttle.dropped",
    "aaco_throttle_dropped",
    "counter",
    "{event}",
    "Inputs the throttle analyzer did not use: max_devices, max_models (caps reached), late_telemetry (older "
    "than the GPU's last sample), pending_overflow (iterations waiting for telemetry beyond the cap).",
    ("reason",),
)


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


@dataclass
class _Gpu:
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


@dataclass
class _Impact:
    """Latency reservoirs of one model, inside and outside episodes, and the latest estimate."""

    inside: np.ndarray
    outside: np.ndarray
    n_inside: int = 0
    n_outside: int = 0
    unknown: int = 0
    estimated_at: tuple[int, int] = (0, 0)
    estimate: dict[str, Any] | None = None
    significant: bool = False


@dataclass(frozen=True)
class ThrottleResult:
    """Episodes per GPU, the latency impact per model, and the analyzer's counters."""

    gpus: tuple[dict[str, Any], ...]
    impact: dict[tuple[str, str], dict[str, Any]]
    dropped: dict[str, int]
    settings: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        """``{"gpus": [...], "impact": {model: {...}}, "dropped": {...}, "settings": {...}}``."""
        nodes = {n for n, _ in self.impact}
        impact = {(mo if len(nodes) <= 1 else f"{n}/{mo}"): dict(v) for (n, mo), v in sorted(self.impact.items())}
        return {
            "gpus": [dict(g) for g in self.gpus],
            "impact": impact,
            "dropped": dict(self.dropped),
            "settings": dict(self.settings),
        }

    def latency_impact(self, node: str, model: str) -> float | None:
        """The impact as the bottleneck classifier reads it (``ratio - 1``).

        ``ratio - 1`` when significant, 0 when measured and not significant (both sides have enough
        iterations), None when not measured.
        """
        v = self.impact.get((node, model))
        if v is None or v["ratio"] is None:
            return None
        if v["significant"]:
            return v["ratio"] - 1.0
        return 0.0 if v["enough"] else None

    def points(self) -> list[MetricPoint]:
        """Active gauges, episode and time counters per GPU and reason; impact per model; drops."""
        pb = PointBuilder()
        for g in self.gpus:
            for reason in REASONS:
                labels = {"node": g["node"], "gpu": g["gpu"], "reason": reason}
                pb.add(THROTTLE_ACTIVE, 1.0 if reason in g["throttled"] else 0.0, **labels)
                pb.add(THROTTLE_EPISODES, float(g["episodes_total"][reason]), **labels)
                pb.add(THROTTLE_SECONDS, float(g["throttled_seconds"][reason]), **labels)
        for (node, model), v in self.impact.items():
            for state in ("inside", "outside", "unknown"):
                pb.add(ITERATIONS, float(v["iterations"][state]), node=node, model=model, state=state)
            if v["ratio"] is not None:
                pb.add(IMPACT, v["ratio"], node=node, model=model)
                pb.add(IMPACT_LOW, v["ci"][0], node=node, model=model)
                pb.add(IMPACT_HIGH, v["ci"][1], node=node, model=model)
        for reason in DROP_REASONS:
            pb.add(DROPPED, float(self.dropped.get(reason, 0)), reason=reason)
        return pb.points


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


_TRACKED: Final = frozenset(
    {m.UTILIZATION, m.POWER, m.CLOCK, m.CLOCK_MAX, m.TEMPERATURE, m.THROTTLE, POWER_LIMIT, TEMPERATURE_LIMIT}
)
# The columns that say which GPU and series a telemetry row is; the rest are its time and value.
_LAYOUT_COLUMNS: Final = ("node", "device", "metric", "attributes")
# One GPU's rows of one sample: node, GPU, row numbers, (metric, series attribute) of each row.
_Group = tuple[str, str, list[int], list[tuple[str, str]]]


class ThrottleAnalyzer(Analyzer):
    """Throttling episodes per GPU from telemetry; their latency impact per model from iterations."""

    name = "throttle"
    kinds = frozenset({"telemetry", "iterations", "kernels"})

    def __init__(
        self,
        *,
        load_threshold: float = 0.5,
        clock_ratio: float = 0.9,
        power_margin: float = 0.05,
        power_cap_w: float | None = None,
        temperature_limits_c: dict[str, float] | None = None,
        temperature_margin_c: float = 5.0,
        stale_s: float = 60.0,
        max_devices: int = 256,
        max_models: int = 256,
        max_episodes: int = 256,
        max_pending: int = 10_000,
        reservoir: int = 2048,
        bootstrap: int = 1000,
        min_samples: int = 20,
        seed: int = 0,
    ) -> None:
        self.load_threshold = load_threshold
        self.clock_ratio = clock_ratio
        self.power_margin = power_margin
        self.power_cap_w = power_cap_w
        self.temperature_limits_c = dict(
            DEFAULT_TEMPERATURE_LIMITS_C if temperature_limits_c is None else temperature_limits_c
        )
        self.temperature_margin_c = temperature_margin_c
        self.stale_ns = int(stale_s * 1e9)
        self.max_devices = max_devices
        self.max_models = max_models
        self.max_episodes = max_episodes
        self.max_pending = max_pending
        self.reservoir = reservoir
        self.bootstrap = bootstrap
        self.min_samples = min_samples
        self.seed = seed
        self._gpus: dict[tuple[str, str], _Gpu] = {}
        self._newest_ts = 0
        self._model_devices: dict[tuple[str, str], set[str]] = {}
        self._pending: deque[tuple[str, str, int, int, str | None]] = deque()  # node, model, start, end, trace
        self._impact: dict[tuple[str, str], _Impact] = {}
        self._rng = np.random.default_rng(seed)  # reservoir sampling (deterministic for a given input)
        self._dropped: dict[str, int] = dict.fromkeys(DROP_REASONS, 0)
        self._layout: tuple[pa.RecordBatch, list[_Group]] | None = None  # the last telemetry rows' grouping
        # Made on first use, not at import: pyarrow imports pandas (about 30 MiB resident) on its first
        # list conversion unless the agent has already kept it out (cli.keep_pandas_out), at start.
        self._tracked: pa.Array | None = None

    # --- telemetry -> episodes -----------------------------------------------------------------

    def update(self, item: EventBatch) -> None:
        """Fold telemetry (episodes), kernels (model -> GPUs) or iterations (latency impact) in."""
        b = item.batch
        if b.num_rows == 0:
            return
        if item.kind == "telemetry":
            self._telemetry(b)
        elif item.kind == "kernels":
            self._kernels(b)
        elif item.kind == "iterations":
            self._iterations(b)
            self._classify()

    def _telemetry(self, b: pa.RecordBatch) -> None:
        if self._tracked is None:
            self._tracked = pa.array(sorted(_TRACKED))
        sel = b.filter(pc.is_in(b.column("metric"), self._tracked))
        if sel.num_rows:
            ts = sel.column("ts_ns").to_numpy()
            values = sel.column("value").to_numpy(zero_copy_only=False).tolist()
            # A source sends the same rows sample after sample, all of one time: their grouping per GPU
            # is kept, and a batch that matches it skips reading its identity columns again.
            one_time = bool((ts == ts[0]).all())
            layout = sel.select(_LAYOUT_COLUMNS)
            if one_time and self._layout is not None and self._layout[0].equals(layout):
                now = int(ts[0])
                for node, device, rows, keys in self._layout[1]:
                    self._sample(now, node, device, rows, keys, values)
            else:
                groups = self._groups(sel, ts)
                self._layout = (layout, [group for _, group in groups]) if one_time else None
                for now, (node, device, rows, keys) in groups:
                    self._sample(now, node, device, rows, keys, values)
        self._expire()
        self._classify()

    @staticmethod
    def _groups(sel: pa.RecordBatch, ts: np.ndarray) -> list[tuple[int, _Group]]:
        """The rows of each sample, by time then GPU: (time, (node, GPU, rows, (metric, attribute) per row))."""
        nodes = sel.column("node").to_pylist()
        devices = sel.column("device").fill_null("").to_pylist()
        metrics = sel.column("metric").to_pylist()
        attrs = sel.column("attributes").to_pylist()
        out: list[tuple[int, _Group]] = []
        last: tuple[int, str, str] | None = None
        for i in np.lexsort((devices, nodes, ts)).tolist():  # by time, then GPU
            at = (int(ts[i]), nodes[i], devices[i])
            if at != last:
                out.append((at[0], (at[1], at[2], [], [])))
                last = at
            metric = metrics[i]
            _, (_, _, rows, keys) = out[-1]
            rows.append(i)
            keys.append((metric, dict(attrs[i] or ()).get(_ATTRIBUTE.get(metric, ""), "")))
        return out

    def _gpu(self, node: str, gpu: str, ts: int) -> _Gpu | None:
        g = self._gpus.get((node, gpu))
        if g is None:
            if len(self._gpus) >= self.max_devices:
                return None
            g = self._gpus[(node, gpu)] = _Gpu(node, gpu, first_ts=ts, kept_from_ns=ts)
        return g

    def _sample(
        self, now: int, node: str, device: str, rows: list[int], keys: list[tuple[str, str]], values: list[float]
    ) -> None:
        g = self._gpu(node, device, now)
        if g is None:
            self._dropped["max_devices"] += len(rows)
            return
        if now < g.last_ts:
            self._dropped["late_telemetry"] += len(rows)
            return
        for i, key in zip(rows, keys, strict=True):
            g.readings[key] = (float(values[i]), now)
        self._evaluate(g, now)

    def _evaluate(self, g: _Gpu, now: int) -> None:
        v = lambda metric, attr="": g.value(metric, attr, now, self.stale_ns)  # noqa: E731
        util = v(m.UTILIZATION)
        power = v(m.POWER)
        cap = v(POWER_LIMIT) or self.power_cap_w
        domain = "graphics" if v(m.CLOCK, "graphics") is not None else "sm"
        clock, clock_max = v(m.CLOCK, domain), v(m.CLOCK_MAX, domain)
        ratio = clock / clock_max if clock is not None and clock_max else None
        at_cap = power is not None and cap is not None and cap > 0 and power >= cap * (1.0 - self.power_margin)
        loaded = util >= self.load_threshold if util is not None else None
        temps = {
            attr: val
            for (metric, attr), (val, t) in g.readings.items()
            if metric == m.TEMPERATURE and now - t <= self.stale_ns
        }
        hot, at_limit, peak = False, False, max(temps.values()) if temps else None
        for sensor, temp in temps.items():
            limit = v(TEMPERATURE_LIMIT, sensor) or self.temperature_limits_c.get(sensor)
            if limit is not None and temp >= limit - self.temperature_margin_c:
                hot = True
                at_limit = at_limit or temp >= limit
        basis: dict[str, set[str]] = {r: set() for r in REASONS}
        for r in REASONS:
            flag = v(m.THROTTLE, r)
            if flag is not None and flag >= 0.5:
                basis[r].add("vendor")
        if at_cap and (loaded is None or loaded) and ratio is not None and ratio < self.clock_ratio:
            basis["power"].add("clock_power")
        if hot:
            basis["thermal"].add("temperature")
        if g.last_ts:
            step = min(now - g.last_ts, self.stale_ns) / 1e9
            for r in g.open:
                g.seconds[r] += step
        g.last_ts = now
        for r in REASONS:
            ep = g.open.get(r)
            if basis[r]:
                started = ep is None
                if ep is None:
                    ep = g.open[r] = Episode(g.node, g.gpu, r, now)
                    g.episodes[r] += 1
                ep.basis |= basis[r]
                ep.samples += 1
                ep.loaded_samples += 1 if loaded or (loaded is None and at_cap) else 0
                ep.load_unknown = ep.load_unknown or (loaded is None and not at_cap)
                if ratio is not None:
                    ep.min_clock_ratio = ratio if ep.min_clock_ratio is None else min(ep.min_clock_ratio, ratio)
                if peak is not None:
                    ep.peak_temperature_c = peak if ep.peak_temperature_c is None else max(ep.peak_temperature_c, peak)
                ep.reached_limit = ep.reached_limit or (r == "thermal" and at_limit)
                if power is not None:
                    ep.max_power_w = power if ep.max_power_w is None else max(ep.max_power_w, power)
                if started:
                    self._report(ep, "started")
            elif ep is not None:
                self._close(g, ep, now, "telemetry")
        self._newest_ts = max(self._newest_ts, now)

    def _close(self, g: _Gpu, ep: Episode, end_ns: int, how: str) -> None:
        ep.end_ns = end_ns
        ep.ended_by = how
        del g.open[ep.reason]
        g.history.append(ep)
        while len(g.history) > self.max_episodes:
            old = g.history.popleft()
            g.kept_from_ns = max(g.kept_from_ns, old.end_ns or old.start_ns)
        self._report(ep, "ended")

    def _expire(self) -> None:
        """GPUs silent for ``stale_s`` (of the newest telemetry time) end their open episodes."""
        for g in self._gpus.values():
            if g.open and self._newest_ts - g.last_ts > self.stale_ns:
                for ep in list(g.open.values()):
                    self._close(g, ep, g.last_ts, "silence")

    def _report(self, ep: Episode, what: str) -> None:
        ts = ep.start_ns if what == "started" else (ep.end_ns or ep.start_ns)
        detail = ""
        if what == "ended":
            detail = f" after {(ep.end_ns - ep.start_ns) / 1e9:.3g} s" if ep.end_ns is not None else ""
            if ep.min_clock_ratio is not None:
                detail += f", clock down to {ep.min_clock_ratio:.0%} of its maximum"
            if ep.peak_temperature_c is not None and ep.reason == "thermal":
                detail += f", peak {ep.peak_temperature_c:.0f} C"
        summary = f"gpu {ep.gpu}: {ep.reason} throttling {what}{detail}"
        evidence = {"episode": ep.key, "state": "open" if what == "started" else "closed", **ep.to_dict()}
        self.emit(
            Finding(
                ts,
                ep.node,
                self.name,
                f"gpu {ep.gpu}",
                ep.severity(),
                0.9 if "vendor" in ep.basis else 0.7,
                summary,
                evidence,
            )
        )

    # --- iterations -> latency impact ----------------------------------------------------------

    def _kernels(self, b: pa.RecordBatch) -> None:
        for node, model, device in group(b.column("node"), b.column("model"), b.column("device")).keys:
            if model is None or device is None:
                continue
            devs = self._model_devices.get((node, model))
            if devs is None:
                if len(self._model_devices) >= self.max_models:
                    continue
                devs = self._model_devices[(node, model)] = set()
            if len(devs) < 64:
                devs.add(device)

    def _iterations(self, b: pa.RecordBatch) -> None:
        start = b.column("start_ns").to_pylist()
        end = b.column("end_ns").to_pylist()
        nodes = b.column("node").to_pylist()
        models = b.column("model").fill_null("unknown").to_pylist()
        traces = b.column("trace_id").to_pylist()
        for row in zip(nodes, models, start, end, traces, strict=True):
            self._pending.append(row)  # type: ignore[arg-type]
        while len(self._pending) > self.max_pending:
            self._pending.popleft()
            self._dropped["pending_overflow"] += 1

    def _devices_of(self, node: str, model: str) -> list[_Gpu]:
        devs = self._model_devices.get((node, model))
        gpus = [self._gpus[(node, d)] for d in sorted(devs or ()) if (node, d) in self._gpus]
        return gpus or [g for (n, _), g in self._gpus.items() if n == node]

    def _classify(self) -> None:
        """Score the pending iterations whose GPUs' telemetry covers their end; the others keep waiting."""
        if not self._pending:
            return
        waiting: deque[tuple[str, str, int, int, str | None]] = deque()
        ready: dict[tuple[str, str], list[tuple[int, int]]] = {}
        gpus_of: dict[tuple[str, str], list[_Gpu]] = {}
        for row in self._pending:
            key = (row[0], row[1])
            gpus = gpus_of.get(key)
            if gpus is None:
                gpus = gpus_of[key] = self._devices_of(*key)
            if gpus and min(g.last_ts for g in gpus) < row[3]:
                waiting.append(row)
            else:
                ready.setdefault(key, []).append((row[2], row[3]))
        self._pending = waiting
        for (node, model), rows in ready.items():
            imp = self._impact.get((node, model))
            if imp is None:
                if len(self._impact) >= self.max_models:
                    self._dropped["max_models"] += len(rows)
                    continue
                imp = self._impact[(node, model)] = _Impact(np.empty(self.reservoir), np.empty(self.reservoir))
            gpus = gpus_of[(node, model)]
            starts = np.array([r[0] for r in rows], dtype=np.float64)
            ends = np.array([r[1] for r in rows], dtype=np.float64)
            # no telemetry on the node, or older than what is kept of it: cannot tell
            kept_from = max((g.kept_from_ns for g in gpus), default=None)
            unknown = np.ones(len(rows), dtype=bool) if kept_from is None else starts < kept_from
            inside = np.zeros(len(rows), dtype=bool)
            for g in gpus:
                s, e = g.intervals()
                if s.size:
                    j = np.searchsorted(s, ends, side="left") - 1  # the last episode starting before the iteration ends
                    inside |= (j >= 0) & (e[np.maximum(j, 0)] > starts)
            lat = (ends - starts) / 1e9
            imp.unknown += int(unknown.sum())
            self._sample_into(imp, "inside", lat[inside & ~unknown])
            self._sample_into(imp, "outside", lat[~inside & ~unknown])
            self._maybe_estimate(node, model, imp)

    def _sample_into(self, imp: _Impact, side: str, values: np.ndarray) -> None:
        """Reservoir sampling (Algorithm R): every value seen has the same chance to be kept."""
        res = imp.inside if side == "inside" else imp.outside
        n = imp.n_inside if side == "inside" else imp.n_outside
        for x in values.tolist():
            if n < self.reservoir:
                res[n] = x
            else:
                j = int(self._rng.integers(0, n + 1))
                if j < self.reservoir:
                    res[j] = x
            n += 1
        if side == "inside":
            imp.n_inside = n
        else:
            imp.n_outside = n

    def _maybe_estimate(self, node: str, model: str, imp: _Impact) -> None:
        """Re-estimate when either side grew by 10 % (at least 10 values); report a newly significant impact."""
        last_in, last_out = imp.estimated_at
        grew = imp.n_inside >= max(last_in * 1.1, last_in + 10) or imp.n_outside >= max(last_out * 1.1, last_out + 10)
        if not grew or imp.n_inside < 2 or imp.n_outside < 2:
            return
        imp.estimated_at = (imp.n_inside, imp.n_outside)
        imp.estimate = self._estimate(imp)
        significant = (
            imp.n_inside >= self.min_samples
            and imp.n_outside >= self.min_samples
            and (imp.estimate["ci"][0] > 1.0 or imp.estimate["ci"][1] < 1.0)
        )
        if significant and not imp.significant:
            ratio = imp.estimate["ratio"]
            severity = "critical" if ratio >= 1.5 else ("warning" if ratio >= 1.05 else "info")
            lo, hi = imp.estimate["ci"]
            summary = (
                f"{model}: iterations during GPU throttling take x{ratio:.2f} the median latency of the others "
                f"(95 % CI {lo:.2f}-{hi:.2f}, {imp.n_inside} vs {imp.n_outside} iterations)"
            )
            evidence = {
                **imp.estimate,
                "iterations_inside": imp.n_inside,
                "iterations_outside": imp.n_outside,
                "gpus": [g.gpu for g in self._devices_of(node, model)],
            }
            self.emit(Finding(self._newest_ts, node, self.name, model, severity, 0.95, summary, evidence))
        imp.significant = significant

    def _estimate(self, imp: _Impact) -> dict[str, Any]:
        """Ratio of medians with a percentile bootstrap 95 % interval (seeded by the counts: reproducible)."""
        a = np.sort(imp.inside[: min(imp.n_inside, self.reservoir)])
        b = np.sort(imp.outside[: min(imp.n_outside, self.reservoir)])
        med_a, med_b = float(np.median(a)), float(np.median(b))
        rng = np.random.default_rng((self.seed, imp.n_inside, imp.n_outside))
        ra, rb = bootstrap_medians(a, self.bootstrap, rng), bootstrap_medians(b, self.bootstrap, rng)
        r = ra / np.where(rb > 0, rb, np.nan)
        lo, hi = np.nanpercentile(r, [2.5, 97.5]) if np.isfinite(r).any() else (np.nan, np.nan)
        return {
            "ratio": med_a / med_b if med_b > 0 else None,
            "ci": [float(lo), float(hi)],
            "median_inside_s": med_a,
            "median_outside_s": med_b,
        }

    # --- snapshot ------------------------------------------------------------------------------

    def snapshot(self) -> ThrottleResult:
        """Episodes, counters and impact (an immutable copy)."""
        gpus = []
        for (node, gpu), g in sorted(self._gpus.items()):
            now = g.last_ts
            gpus.append(
                {
                    "node": node,
                    "gpu": gpu,
                    "throttled": sorted(g.open),
                    "last_sample_ns": now,
                    "open": [ep.to_dict() for ep in g.open.values()],
                    "recent": [ep.to_dict() for ep in list(g.history)[-10:]],
                    "episodes_total": dict(g.episodes),
                    "throttled_seconds": dict(g.seconds),
                    "power_cap_w": g.value(POWER_LIMIT, "", now, self.stale_ns) or self.power_cap_w,
                }
            )
        impact = {}
        for key, imp in self._impact.items():
            est = imp.estimate or {}
            has = est.get("ratio") is not None
            impact[key] = {
                "ratio": est.get("ratio") if has else None,
                "ci": list(est["ci"]) if has else None,
                "median_inside_s": est.get("median_inside_s"),
                "median_outside_s": est.get("median_outside_s"),
                "significant": imp.significant,
                "enough": imp.n_inside >= self.min_samples and imp.n_outside >= self.min_samples,
                "iterations": {"inside": imp.n_inside, "outside": imp.n_outside, "unknown": imp.unknown},
                "gpus_from": "kernels" if self._model_devices.get(key) else "node",
            }
        settings = {
            "load_threshold": self.load_threshold,
            "clock_ratio": self.clock_ratio,
            "power_margin": self.power_margin,
            "power_cap_w": self.power_cap_w,
            "temperature_limits_c": dict(self.temperature_limits_c),
            "temperature_margin_c": self.temperature_margin_c,
            "pending_iterations": len(self._pending),
        }
        return ThrottleResult(tuple(gpus), impact, dict(self._dropped), settings)
