"""The bounded bus between sources and the pipeline worker.

Capacity is bounded twice, in batches and in events (rows), so neither many small batches nor a
few huge ones can grow memory without limit. Two ways in:

- ``offer`` never blocks: live sources (telemetry, eBPF, the ORT workload) that cannot pause
  their producer call it, and a full bus counts a drop with reason ``queue_full``.
- ``put`` waits for room, up to a deadline or until the agent stops: sources that read durable
  input (trace files) use it, because they can pause reading without losing anything; if it gives
  up, the caller keeps its place (the file offset is not checkpointed) and the drop is counted with
  reason ``shutdown`` or ``timeout``.

A batch larger than the whole event capacity is admitted alone into an empty bus, so a source can
never deadlock on it; sources keep batches at or below ``MAX_BATCH_ROWS`` anyway.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from aaco.contract.schemas import EventBatch
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, EVENTS_RECEIVED, QUEUE_CAPACITY, QUEUE_DEPTH, Stats


class Bus:
    """A bounded FIFO of ``EventBatch`` with per-source drop counters."""

    def __init__(self, stats: Stats, max_batches: int = 1024, max_events: int = 1_000_000) -> None:
        if max_batches < 1 or max_events < 1:
            raise ValueError("bus capacity must be positive")
        self._stats = stats
        self._max_batches = max_batches
        self._max_events = max_events
        self._items: deque[EventBatch] = deque()
        self._events = 0
        self._closed = False
        self._cond = threading.Condition()
        stats.set(QUEUE_CAPACITY, max_events, queue="bus")
        stats.set(QUEUE_DEPTH, 0, queue="bus")

    @property
    def depth(self) -> int:
        """Events waiting."""
        with self._cond:
            return self._events

    @property
    def capacity(self) -> int:
        """Capacity in events."""
        return self._max_events

    def _fits(self, rows: int) -> bool:
        if not self._items:
            return True
        return len(self._items) < self._max_batches and self._events + rows <= self._max_events

    def _append(self, item: EventBatch) -> None:
        self._items.append(item)
        self._events += item.rows
        self._stats.inc(EVENTS_RECEIVED, item.rows, component="bus")
        self._stats.set(QUEUE_DEPTH, self._events, queue="bus")
        self._cond.notify_all()

    def _drop(self, item: EventBatch, reason: str) -> None:
        self._stats.inc(EVENTS_DROPPED, item.rows, component=f"source:{item.source}", reason=reason)

    def offer(self, item: EventBatch) -> bool:
        """Enqueue without waiting; on a full or closed bus count a drop and return False."""
        with self._cond:
            if self._closed:
                self._drop(item, "shutdown")
                return False
            if not self._fits(item.rows):
                self._drop(item, "queue_full")
                return False
            self._append(item)
            return True

    def put(self, item: EventBatch, stop: threading.Event | None = None, timeout_s: float | None = None) -> bool:
        """Enqueue, waiting for room until ``timeout_s`` passes or ``stop`` is set.

        Returns False (and counts the drop) when it gives up; the caller still holds the data.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while True:
                if self._closed or (stop is not None and stop.is_set()):
                    self._drop(item, "shutdown")
                    return False
                if self._fits(item.rows):
                    self._append(item)
                    return True
                wait = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
                if wait <= 0:
                    self._drop(item, "timeout")
                    return False
                self._cond.wait(wait)

    def get(self, timeout_s: float = 0.1) -> EventBatch | None:
        """Take the oldest batch, waiting up to ``timeout_s`` (not at all once closed); None if there is none."""
        with self._cond:
            if not self._items and not self._closed:
                self._cond.wait(timeout_s)
            if not self._items:
                return None
            item = self._items.popleft()
            self._events -= item.rows
            self._stats.inc(EVENTS_EMITTED, item.rows, component="bus")
            self._stats.set(QUEUE_DEPTH, self._events, queue="bus")
            self._cond.notify_all()
            return item

    def close(self) -> None:
        """Refuse new batches (counted as drops with reason ``shutdown``); queued ones can still be taken."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def reopen(self) -> None:
        """Accept batches again (after a configuration reload)."""
        with self._cond:
            self._closed = False
