"""Busy-time arithmetic the device and job analyzers share.

Two ways to fold GPU intervals into busy time. ``union_extend`` streams intervals in start order past
a frontier (the activity analyzer's device windows). ``merge_groups`` and ``overlap_sweep`` are
Holistic Trace Analysis 0.5.0's own (``hta/utils/utils.py`` ``merge_kernel_intervals``,
``hta/analyzers/communication_analysis.py`` ``get_comm_comp_overlap``), kept exactly, rounding quirks
included, for the job analyzer's per-rank figures. ``shares`` splits a window into the temporal
breakdown both report: compute, non-compute (busy without compute) and idle.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

_EMPTY = np.zeros(0, np.int64)


def union_extend(starts: np.ndarray, ends: np.ndarray, frontier: int) -> tuple[int, int]:
    """Busy time that intervals sorted by start add beyond ``frontier``; returns (added_ns, new_frontier)."""
    if starts.size == 0:
        return 0, frontier
    running = np.maximum.accumulate(ends)
    before = np.empty_like(running)
    before[0] = frontier
    before[1:] = np.maximum(running[:-1], frontier)
    added = np.clip(ends - np.maximum(starts, before), 0, None).sum()
    return int(added), int(max(frontier, running[-1]))


def merge_groups(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """HTA's ``merge_kernel_intervals``: (group starts, group ends), sorted by start.

    Sorted by start (stably), an interval opens a new group when it starts after every earlier end
    (``ts > end.shift().cummax()``); a group spans [its first start, its latest end]. For intervals
    with end >= start that is their union. An inverted interval (HTA rounds starts up and ends down
    to whole microseconds, so a sub-microsecond event can end before it starts) that stands alone
    is a group of negative length, as in HTA. Merging groups again with more intervals gives the
    groups of all of them, so windows can be merged as they grow.
    """
    if lo.size == 0:
        return _EMPTY, _EMPTY
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    opens = np.ones(lo.size, dtype=bool)
    opens[1:] = lo[1:] > np.maximum.accumulate(hi)[:-1]
    first = np.flatnonzero(opens)
    return lo[first], np.maximum.reduceat(hi, first)


def overlap_sweep(a_lo: np.ndarray, a_hi: np.ndarray, b_lo: np.ndarray, b_hi: np.ndarray) -> int:
    """HTA's communication/computation overlap: time during which both group sets run.

    HTA sweeps the group bounds in time order, +1/-1 at a's starts and ends and +2/-2 at b's, and
    adds up the time while the running sum is 3. Between two distinct times the sum is the same
    whichever order tied bounds take, so the result does not depend on HTA's unstable sort.
    """
    times = np.concatenate([a_lo, a_hi, b_lo, b_hi])
    if times.size == 0:
        return 0
    deltas = np.concatenate(
        [np.full(a_lo.size, 1), np.full(a_hi.size, -1), np.full(b_lo.size, 2), np.full(b_hi.size, -2)]
    )
    order = np.argsort(times, kind="stable")
    t, running = times[order], np.cumsum(deltas[order])
    return int((t[1:] - t[:-1])[running[:-1] == 3].sum())


class Shares(NamedTuple):
    """A window's temporal breakdown as shares of the window (0..1)."""

    active: float
    compute: float
    noncompute: float
    idle: float


def shares(span: int, busy: int, compute: int) -> Shares:
    """Split a window of ``span`` with ``busy`` time of any GPU work, ``compute`` of it compute kernels.

    idle = (span - busy) / span, compute = compute / span, non-compute = (busy - compute) / span:
    HTA's ``get_temporal_breakdown`` (``non_compute = kernel_time - compute - idle``), bounded to 0..1.
    """
    span = max(1, span)
    active = min(1.0, max(0.0, busy / span))
    comp = min(active, max(0.0, compute / span))
    return Shares(active, comp, active - comp, 1.0 - active)
