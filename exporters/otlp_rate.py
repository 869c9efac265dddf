"""The node-wide kernel span rate budget, on the agent's clock or on the kernels' own.

On the agent's clock (``rate_clock: wall``, a live node) it is a token bucket: ``rate`` spans a second
with a burst of one second's worth. On the kernels' own clock (``rate_clock: trace``, what ``aaco
replay`` uses) it is at most ``rate`` kernel spans per second of the kernels' start times (whole
Unix seconds), granted in the order the kernels arrive: the spans a replay sends depend on the trace
alone, not on how fast the machine reads it, and match what a live node would have sent of the same
work.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

NS_PER_S = 1_000_000_000
MAX_WINDOWS = 4096  # seconds of trace time whose counts are kept (the oldest are forgotten first)


class TokenBucket:
    """A rate limit in spans per second with a burst of one second's worth."""

    def __init__(self, rate: float, clock: Callable[[], float]) -> None:
        self.rate = rate
        self.tokens = rate
        self._clock = clock
        self._last = clock()

    def take(self, n: int) -> int:
        """Take up to ``n`` tokens; return how many were granted."""
        now = self._clock()
        self.tokens = min(self.rate, self.tokens + (now - self._last) * self.rate)
        self._last = now
        granted = int(min(n, self.tokens))
        self.tokens -= granted
        return granted


class TraceTimeBudget:
    """At most ``rate`` kernel spans per second of the kernels' own start times, first come first granted."""

    def __init__(self, rate: float, max_windows: int = MAX_WINDOWS) -> None:
        self.rate = max(1, int(rate))
        self.max_windows = max_windows
        self._used: dict[int, int] = {}  # Unix second -> spans granted in it

    def grant(self, start_ns: np.ndarray) -> np.ndarray:
        """Which of these kernels (in arrival order) may be sent: a boolean mask."""
        if start_ns.size == 0:
            return np.zeros(0, dtype=bool)
        second = start_ns // NS_PER_S
        order = np.argsort(second, kind="stable")  # each second's kernels, in arrival order
        ordered = second[order]
        windows, first, counts = np.unique(ordered, return_index=True, return_counts=True)
        used = np.array([self._used.get(int(w), 0) for w in windows], dtype=np.int64)
        rank = np.arange(ordered.size) - np.repeat(first, counts) + np.repeat(used, counts)
        granted = np.empty(ordered.size, dtype=bool)
        granted[order] = rank < self.rate
        for w, u, c in zip(windows.tolist(), used.tolist(), counts.tolist(), strict=True):
            self._used[w] = min(self.rate, u + c)
        if len(self._used) > self.max_windows:
            for w in sorted(self._used)[: len(self._used) - self.max_windows]:
                del self._used[w]
        return granted
