"""Launch overhead as Holistic Trace Analysis measures it, derived afresh from the kernels' launch calls.

For every GPU event whose CPU launch call is known (``launch_start_ns``/``launch_end_ns``, joined by
correlation id in the sources), with ``cpu`` the launch call's duration and ``gpu`` the event's:

- **launch delay** = event start - launch call end, clipped at 0 (HTA ``launch_delay``): how long
  the work waited in the queue after the CPU handed it over;
- **short kernel**: ``gpu < cpu`` and ``cpu <= runtime_outlier_us`` (HTA's short GPU kernels: the
  GPU finished faster than the CPU took to launch it);
- **runtime outlier**: ``cpu > runtime_outlier_us`` (HTA ``runtime_cutoff``, default 50 us);
- **launch delay outlier**: delay > ``delay_outlier_us`` (HTA ``launch_delay_cutoff``, 100 us).

HTA reads them from one trace file per rank; here they are folded in streaming per (node, model),
per (device, stream) and per recent iteration, with bounded state. Launch-delay quantiles come
from a log-spaced histogram (bins 5 % wide, so a quantile is within 5 % of the exact one); the
Prometheus histogram keeps coarse fixed buckets for ``histogram_quantile``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.analyzers.grouping import group
from aaco.contract.signals import HistogramValue, PointBuilder, define

LAUNCH_DELAY_BUCKETS: Final = (
    1e-6,
    2.5e-6,
    5e-6,
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    1e-2,
    1e-1,
)
LAUNCH_DELAY = define(
    "aaco.launch.delay",
    "aaco_kernel_launch_delay_seconds",
    "histogram",
    "s",
    "GPU event start minus the end of its CPU launch call (clipped at 0), as HTA defines launch delay.",
    ("node", "model"),
    LAUNCH_DELAY_BUCKETS,
)
LAUNCH_CPU = define(
    "aaco.launch.cpu_time",
    "aaco_kernel_launch_cpu_seconds",
    "counter",
    "s",
    "CPU time spent in kernel launch calls (cudaLaunchKernel, hipLaunchKernel, ...).",
    ("node", "model"),
)
SHORT_KERNELS = define(
    "aaco.launch.short_kernels",
    "aaco_short_kernels",
    "counter",
    "{kernel}",
    "GPU events shorter than their CPU launch call (HTA short kernels).",
    ("node", "model"),
)
RUNTIME_OUTLIERS = define(
    "aaco.launch.runtime_outliers",
    "aaco_launch_runtime_outliers",
    "counter",
    "{call}",
    "Launch calls longer than the runtime outlier cutoff (HTA runtime_cutoff, 50 us by default).",
    ("node", "model"),
)
DELAY_OUTLIERS = define(
    "aaco.launch.delay_outliers",
    "aaco_launch_delay_outliers",
    "counter",
    "{kernel}",
    "GPU events whose launch delay exceeds the cutoff (HTA launch_delay_cutoff, 100 us by default).",
    ("node", "model"),
)

# Quantile histogram: bin 1 holds delays under 100 ns, then bins 5 % wide up to 10 s, then overflow
# (bin b holds [edge b-1, edge b); bin 0 stays empty).
_GROWTH: Final = 1.05
_EDGES_NS: Final = np.concatenate(([0.0], 100.0 * _GROWTH ** np.arange(0, 379)))
_PROM_EDGES_NS: Final = np.array(LAUNCH_DELAY_BUCKETS) * 1e9
# Statistics folded per group, in this order (kernels counts every event; the rest only launched ones).
_STATS: Final = ("kernels", "launched", "cpu_ns", "delay_ns", "short", "runtime_outliers", "delay_outliers")


def _new_stats() -> np.ndarray:
    return np.zeros(len(_STATS), np.int64)


def _stats_dict(v: np.ndarray) -> dict[str, Any]:
    d = dict(zip(_STATS, (int(x) for x in v), strict=True))
    launched = d["launched"]
    return {
        "kernels": d["kernels"],
        "launched": launched,
        "launch_cpu_s": d["cpu_ns"] / 1e9,
        "mean_launch_us": d["cpu_ns"] / launched / 1000 if launched else None,
        "mean_delay_us": d["delay_ns"] / launched / 1000 if launched else None,
        "short_kernels": d["short"],
        "runtime_outliers": d["runtime_outliers"],
        "delay_outliers": d["delay_outliers"],
    }


@dataclass
class _Group:
    stats: np.ndarray = field(default_factory=_new_stats)
    delay_max_ns: int = 0
    fine: np.ndarray = field(default_factory=lambda: np.zeros(_EDGES_NS.size + 1, np.int64))
    prom: np.ndarray = field(default_factory=lambda: np.zeros(_PROM_EDGES_NS.size + 1, np.int64))
    streams: dict[tuple[str, int], np.ndarray] = field(default_factory=dict)
    streams_dropped: int = 0
    iterations: OrderedDict[tuple[str, int], np.ndarray] = field(default_factory=OrderedDict)


@dataclass(frozen=True)
class _Rows:
    """Per-row measures: ``flags`` bits launched, short, runtime outlier, delay outlier; ns values."""

    flags: np.ndarray
    cpu: np.ndarray
    delay: np.ndarray

    def select(self, sel: np.ndarray) -> _Rows:
        return _Rows(self.flags[sel], self.cpu[sel], self.delay[sel])

    def per_group(self, index: np.ndarray, k: int) -> np.ndarray:
        """``_STATS`` summed per group (shape (len(_STATS), k)).

        The four flags are counted with one unweighted bincount over (group, flags) pairs: one
        pass instead of one weighted pass per flag.
        """
        by_flags = np.bincount(index * 16 + self.flags, minlength=16 * k).reshape(k, 16)
        out = np.empty((len(_STATS), k), np.int64)
        out[0] = by_flags.sum(axis=1)
        for row, bit in ((1, 0), (4, 1), (5, 2), (6, 3)):
            out[row] = by_flags[:, _WITH_BIT[bit]].sum(axis=1)
        out[2] = np.bincount(index, weights=self.cpu, minlength=k)
        out[3] = np.bincount(index, weights=self.delay, minlength=k)
        return out


_WITH_BIT: Final = [np.array([f for f in range(16) if f >> bit & 1]) for bit in range(4)]


class LaunchOverhead:
    """Streaming HTA launch measures per (node, model), stream and recent iteration (pure, bounded)."""

    def __init__(
        self,
        runtime_outlier_us: float = 50.0,
        delay_outlier_us: float = 100.0,
        max_groups: int = 256,
        max_streams: int = 64,
        recent_iterations: int = 32,
    ) -> None:
        self.runtime_outlier_us = runtime_outlier_us
        self.delay_outlier_us = delay_outlier_us
        self._rt_ns = runtime_outlier_us * 1000
        self._dl_ns = delay_outlier_us * 1000
        self._max_groups = max_groups
        self._max_streams = max_streams
        self._recent = recent_iterations
        self._groups: dict[tuple[str, str], _Group] = {}

    def update(self, table: pa.Table, model: pa.ChunkedArray | pa.Array) -> None:
        """Fold a conformed kernels table in (``model`` with nulls filled)."""
        start = table["start_ns"].to_numpy()
        gpu = table["end_ns"].to_numpy() - start
        l_start, l_end = table["launch_start_ns"], table["launch_end_ns"]
        launched = (pc.is_valid(l_start).to_numpy(zero_copy_only=False)) & pc.is_valid(l_end).to_numpy(
            zero_copy_only=False
        )
        cpu = np.where(launched, pc.subtract(l_end, l_start).fill_null(0).to_numpy(zero_copy_only=False), 0)
        delay = np.where(launched, np.maximum(start - l_end.fill_null(0).to_numpy(zero_copy_only=False), 0), 0)
        rows = _Rows(
            launched.astype(np.int64)
            | (launched & (gpu < cpu) & (cpu <= self._rt_ns)) << 1
            | (launched & (cpu > self._rt_ns)) << 2
            | (launched & (delay > self._dl_ns)) << 3,
            cpu,
            delay,
        )
        groups = group(table["node"], model)
        for g_idx, key in enumerate(groups.keys):
            g = self._groups.get(key)
            if g is None:
                if len(self._groups) >= self._max_groups:
                    continue
                g = self._groups[key] = _Group()
            sel = groups.mask(g_idx)
            part_rows = rows if isinstance(sel, slice) else rows.select(sel)
            part = table if isinstance(sel, slice) else table.filter(pa.array(sel))
            g.stats += part_rows.per_group(np.zeros(part.num_rows, np.int64), 1)[:, 0]
            d = part_rows.delay[(part_rows.flags & 1).astype(bool)]
            if d.size:
                g.delay_max_ns = max(g.delay_max_ns, int(d.max()))
                g.fine += np.bincount(_fine_bins(d), minlength=g.fine.size)
                g.prom += np.bincount(np.searchsorted(_PROM_EDGES_NS, d, side="left"), minlength=g.prom.size)
            self._fold_streams(g, part, part_rows)
            self._fold_iterations(g, part, part_rows)

    def _fold_streams(self, g: _Group, t: pa.Table, rows: _Rows) -> None:
        groups = group(t["device"], t["stream"])
        sums = rows.per_group(groups.index, len(groups.keys))
        for i, key in enumerate(groups.keys):
            acc = g.streams.get(key)
            if acc is None:
                if len(g.streams) >= self._max_streams:
                    g.streams_dropped += 1
                    continue
                acc = g.streams[key] = _new_stats()
            acc += sums[:, i]

    def _fold_iterations(self, g: _Group, t: pa.Table, rows: _Rows) -> None:
        if t["iteration"].null_count == t.num_rows:
            return
        groups = group(t["run_id"], t["iteration"])
        sums = rows.per_group(groups.index, len(groups.keys))
        for i, key in enumerate(groups.keys):
            if key[1] is None:
                continue
            acc = g.iterations.get(key)
            if acc is None:
                acc = g.iterations[key] = _new_stats()
                while len(g.iterations) > self._recent:
                    g.iterations.popitem(last=False)
            acc += sums[:, i]

    def result(self, key: tuple[str, str]) -> dict[str, Any] | None:
        """The measures of one (node, model), or None when none of its events had a known launch."""
        g = self._groups.get(key)
        if g is None or g.stats[1] == 0:
            return None
        out = _stats_dict(g.stats)
        out["delay_quantiles_us"] = _quantiles(g.fine, (0.5, 0.9, 0.99))
        out["max_delay_us"] = g.delay_max_ns / 1000
        out["streams"] = [
            {"device": dev, "stream": stream, **_stats_dict(v)}
            for (dev, stream), v in sorted(g.streams.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0))
        ]
        out["streams_dropped"] = g.streams_dropped
        out["recent_iterations"] = [
            {"run_id": run, "iteration": it, **_stats_dict(v)} for (run, it), v in g.iterations.items()
        ]
        return out

    def points(self, pb: PointBuilder) -> None:
        """Add the launch delay histogram and the launch counters to ``pb``."""
        for (node, model), g in self._groups.items():
            if g.stats[1] == 0:
                continue
            d = _stats_dict(g.stats)
            pb.add(LAUNCH_CPU, d["launch_cpu_s"], node=node, model=model)
            pb.add(SHORT_KERNELS, float(d["short_kernels"]), node=node, model=model)
            pb.add(RUNTIME_OUTLIERS, float(d["runtime_outliers"]), node=node, model=model)
            pb.add(DELAY_OUTLIERS, float(d["delay_outliers"]), node=node, model=model)
            pb.add(
                LAUNCH_DELAY,
                HistogramValue(
                    LAUNCH_DELAY_BUCKETS,
                    tuple(int(c) for c in np.cumsum(g.prom[:-1])),
                    int(g.stats[1]),
                    int(g.stats[3]) / 1e9,
                ),
                node=node,
                model=model,
            )


def _fine_bins(delay_ns: np.ndarray) -> np.ndarray:
    """The quantile-histogram bin of each delay, by logarithm (a search over 380 edges costs 5x more)."""
    with np.errstate(divide="ignore"):
        b = np.floor(np.log(np.maximum(delay_ns, 1) / 100.0) / np.log(_GROWTH)).astype(np.int64) + 2
    return np.clip(np.where(delay_ns < 100, 1, b), 1, _EDGES_NS.size)


def _quantiles(counts: np.ndarray, qs: tuple[float, ...]) -> dict[str, float | None]:
    """Quantiles (us) from the log-spaced histogram: the geometric middle of the bin holding each."""
    total = int(counts.sum())
    out: dict[str, float | None] = {}
    cum = np.cumsum(counts)
    for q in qs:
        label = f"p{round(q * 100)}"
        if total == 0:
            out[label] = None
            continue
        # Bin b holds [edge b-1, edge b): bin 1 is under 100 ns, the last bin is 10 s and beyond.
        b = int(np.searchsorted(cum, q * total, side="left"))
        if b <= 1:
            out[label] = 0.05
        elif b >= _EDGES_NS.size:
            out[label] = float(_EDGES_NS[-1]) / 1000
        else:
            out[label] = float(np.sqrt(_EDGES_NS[b - 1] * _EDGES_NS[b])) / 1000
    return out
