"""Holistic Trace Analysis 0.5.0's straggler analysis over the steps of a job's ranks.

``hta/analyzers/straggler_analysis.py`` ``get_potential_stragglers`` with the default
``hta/analyzers/straggler.py`` ``find_stragglers_with_late_start_comm_kernels``:

1. The steps: the ``ProfilerStep`` numbers of the ranks' windows but each window's last (HTA drops the
   GPU work launched once the last step started, and so the step). Every event of those steps on
   every rank gives ``t_min`` (the earliest start) and the latest end; the mean step time is
   ``(latest end - t_min) / steps`` (``_compute_normalized_start_time_of_significant_comm_kernels``).
2. Significant collectives: kernels whose name starts with ``ncclKernel``, on a stream > 0, in a
   step > 0, lasting at least 1 % of the mean step time; of each (rank, stream, step, name) the
   last one.
3. The (stream, name) whose duration (over the mean step time) varies most across ranks: the
   largest mean over steps of the standard deviation across ranks (pandas' ``std``, ddof 1).
4. Its normalised start, ``(start - t_min) / mean step time``, per rank and step; in each step the
   ranks at or above the k-th latest are stragglers there (``_get_top_k_stragglers_with_metric``).
5. Ranks by how many steps they straggled, most first; the first k are the stragglers. Where ranks
   tie, HTA's order is numpy's unstable sort's (it differs between CPUs); AACO puts lower ranks first.

AACO keeps, per (rank, step, stream, name), only the collectives no later one of at least the same
duration follows: the last one lasting at least any threshold is among them, so step 2 is exact for
whatever mean step time the other ranks make. AACO sees GPU work and the steps' own spans, not
HTA's other CPU operators: an operator that outlasts its step would lengthen HTA's mean step time.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

MIN_NORMALIZED_DURATION: Final = 0.01  # HTA's default min_normalized_duration
MAX_COLLECTIVES: Final = 256  # collectives kept per (rank, step, stream, name)


@dataclass
class StepData:
    """One step of one rank: its span and GPU work in whole microseconds, its collectives."""

    run: str
    start_us: int | None = None
    end_us: int | None = None
    duration_ns: int | None = None
    first_us: int | None = None  # the earliest start of its GPU work
    last_us: int | None = None  # the latest end of its GPU work
    collectives: dict[tuple[int, str], list[tuple[int, int, int]]] = field(default_factory=dict)
    bus: dict[str, tuple[float, int]] = field(default_factory=dict)  # op -> (bus bytes, ns) of its collectives
    critical: tuple[int, ...] | None = None  # its critical path: length and bounds in ns (analyzers/jobs_critical.py)

    def span(self, start_us: int, end_us: int, duration_ns: int) -> None:
        """The step's own span (its ``ProfilerStep``)."""
        self.start_us, self.end_us, self.duration_ns = start_us, end_us, duration_ns

    def work(self, first_us: int, last_us: int) -> None:
        """GPU work launched in the step."""
        self.first_us = first_us if self.first_us is None else min(self.first_us, first_us)
        self.last_us = last_us if self.last_us is None else max(self.last_us, last_us)

    def bus_time(self, op: str, bus_bytes: float, duration_ns: int) -> None:
        """A collective of ``op`` that moved ``bus_bytes`` (nccl-tests' S times its bus factor) in ``duration_ns``."""
        b, t = self.bus.get(op, (0.0, 0))
        self.bus[op] = (b + bus_bytes, t + duration_ns)

    def collective(self, stream: int, name: str, start_us: int, dur_us: int, seq: int) -> None:
        """Keep a collective unless a later one of at least its duration follows it (then it can never be the last)."""
        kept = self.collectives.setdefault((stream, name), [])
        new = (start_us, seq, dur_us)
        if any((s, q) > (start_us, seq) and d >= dur_us for s, q, d in kept):
            return
        kept[:] = [k for k in kept if not ((k[0], k[1]) < (start_us, seq) and k[2] <= dur_us)]
        kept.append(new)
        kept.sort()
        if len(kept) > MAX_COLLECTIVES:
            del kept[0]

    def last_collective(self, key: tuple[int, str], min_dur: float) -> tuple[int, int] | None:
        """(start, duration) of the last collective of ``key`` lasting at least ``min_dur``."""
        hits = [(s, q, d) for s, q, d in self.collectives.get(key, ()) if d >= min_dur]
        if not hits:
            return None
        s, _, d = max(hits)
        return s, d


def undominated(keys: np.ndarray, start: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Rows that no later row of the same key (by start, then row order) with at least their duration follows.

    Only those can be a key's last collective lasting at least some threshold (``StepData.collective``
    keeps the same ones), so a batch's collectives are thinned before they are kept one by one.
    """
    if keys.size == 0:
        return np.zeros(0, dtype=bool)
    rows = np.arange(keys.size)
    order = np.lexsort((-rows, -start, keys))  # by key, latest first
    k, d = keys[order], dur[order]
    first = np.ones(k.size, dtype=bool)
    first[1:] = k[1:] != k[:-1]
    # a running maximum per key: each key's values lifted above every earlier key's
    lift = (np.cumsum(first) - 1) * (int(d.max()) - int(d.min()) + 1)
    running = np.maximum.accumulate(d + lift) - lift
    later = np.empty(k.size, np.int64)  # the longest later one of the same key
    later[1:] = running[:-1]
    later[first] = np.iinfo(np.int64).min
    out = np.empty(k.size, dtype=bool)
    out[order] = d > later
    return out


@dataclass(frozen=True)
class Stragglers:
    """HTA's answer for a job: the stragglers, and how it got there."""

    stragglers: tuple[int, ...]
    counts: Mapping[int, int]  # steps each rank straggled in
    steps: tuple[int, ...]
    stream: int
    kernel: str
    mean_step_us: float
    normalized_start: Mapping[tuple[int, int], float]  # (rank, step) -> metric

    def to_dict(self) -> dict[str, Any]:
        """JSON form (ranks as strings where they are keys)."""
        return {
            "stragglers": list(self.stragglers),
            "counts": {str(r): c for r, c in sorted(self.counts.items())},
            "steps": list(self.steps),
            "stream": self.stream,
            "kernel": self.kernel,
            "mean_step_us": self.mean_step_us,
            "normalized_start": [
                {"rank": r, "step": s, "value": v} for (r, s), v in sorted(self.normalized_start.items())
            ],
        }


def find_stragglers(ranks: Mapping[int, Mapping[int, StepData]], k: int = 2) -> Stragglers | None:
    """HTA's stragglers among ``ranks`` (rank -> its complete steps); None when HTA would find none or fail.

    None: no steps, no significant collective, or no (stream, name) seen on two ranks in a step
    (HTA raises there: its standard deviations are all undefined).
    """
    k = max(1, k)
    steps = sorted({n for by_step in ranks.values() for n in by_step})
    if not steps:
        return None
    starts = [v for s in _all(ranks) for v in (s.start_us, s.first_us) if v is not None]
    ends = [v for s in _all(ranks) for v in (s.end_us, s.last_us) if v is not None]
    if not starts or not ends:
        return None
    t_min = min(starts)
    mean_step = (max(ends) - t_min) / float(len(steps))
    min_dur = mean_step * MIN_NORMALIZED_DURATION
    last: dict[tuple[int, str], dict[int, dict[int, tuple[int, int]]]] = defaultdict(lambda: defaultdict(dict))
    for rank, by_step in ranks.items():
        for n, step in by_step.items():
            if n <= 0:
                continue
            for key in step.collectives:
                hit = step.last_collective(key, min_dur) if key[0] > 0 else None
                if hit is not None:
                    last[key][n][rank] = hit
    best = _most_varying(last, mean_step)
    if best is None:
        return None
    metric = {(r, n): (s - t_min) / mean_step for n, by_rank in last[best].items() for r, (s, _) in by_rank.items()}
    counts = {r: 0 for r, _ in metric}
    for n in sorted({n for _, n in metric}):
        values = sorted((v for (_, m), v in metric.items() if m == n), reverse=True)
        threshold = values[min(k, len(values)) - 1]
        for (r, m), v in metric.items():
            if m == n and v >= threshold:
                counts[r] += 1
    ordered = sorted(counts, key=lambda r: (-counts[r], r))
    return Stragglers(tuple(ordered[:k]), counts, tuple(steps), best[0], best[1], mean_step, metric)


def _all(ranks: Mapping[int, Mapping[int, StepData]]) -> list[StepData]:
    return [s for by_step in ranks.values() for s in by_step.values()]


def _most_varying(
    last: Mapping[tuple[int, str], Mapping[int, Mapping[int, tuple[int, int]]]], mean_step: float
) -> tuple[int, str] | None:
    """The (stream, name) with the largest mean over steps of the std across ranks of duration / mean step."""
    best, best_value = None, -math.inf
    for key in sorted(last):
        stds = [
            float(np.std([d / mean_step for _, d in by_rank.values()], ddof=1))
            for by_rank in last[key].values()
            if len(by_rank) > 1
        ]
        if stds and (value := sum(stds) / len(stds)) > best_value:
            best, best_value = key, value
    return best
