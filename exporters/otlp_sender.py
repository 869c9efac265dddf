"""A bounded, retrying OTLP request queue for one signal (traces, metrics or logs).

``enqueue`` never blocks. The queue is bounded twice: in items (spans, data points, log records:
``queue_max_items``) and in bytes, through the agent's one ``ByteBudget``: a queued request, and the
one in flight through all its retries, are held under the queue's label (``otlp``,
``forward:metrics``, ``forward:logs``); while the budget is over its limit the sender drops its own
oldest queued requests. Every drop is counted (``aaco_events_dropped_total{component, reason}``,
reasons ``queue_full`` and ``memory_budget``), so an upstream outage costs data at the old end,
never memory. A sender thread ships requests; failures are retried with exponential backoff up to
``retry_max_interval_s`` and jitter (the server's gRPC RetryInfo or HTTP Retry-After wins) for up to
``retry_max_elapsed_s``; a permanent error drops the request, counted (``rejected``, ``retries_exhausted``).

Shutdown keeps one deadline: ``close(deadline)`` stops taking requests and from then on caps every
send's timeout and every backoff by the time left; ``shutdown`` waits until the queue is sent or the
deadline passes, then counts what is left, the request in flight included, as dropped (``shutdown``)
and closes the transport, which cancels a gRPC call still in flight. An HTTP request in flight ends
by its own (capped) timeout on a daemon thread, its outcome no longer counted.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Final

from aaco.contract.budget import DEFAULT_BUDGET_BYTES, ByteBudget
from aaco.contract.component import Flushing
from aaco.contract.signals import define
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, EXPORT_ERRORS, QUEUE_CAPACITY, QUEUE_DEPTH, Stats
from aaco.exporters.otlp_settings import OtlpTarget
from aaco.exporters.otlp_transport import Transport, make_transport

log = logging.getLogger("aaco.exporters.otlp")
BACKOFF_INITIAL_S = 0.5

QUEUE_BYTES: Final = define(
    "aaco.agent.queue.bytes",
    "aaco_queue_bytes",
    "gauge",
    "By",
    "Encoded bytes waiting in an OTLP export queue (the request in flight not included).",
    ("queue",),
)


class OtlpSender(Flushing):
    """Ships encoded export requests to one target, in order, with retries; bounded in items and bytes."""

    def __init__(
        self,
        target: OtlpTarget,
        stats: Stats,
        component: str,
        queue_max_items: int,
        retry_max_elapsed_s: float,
        rejected: Callable[[bytes], int] = lambda _response: 0,
        transport: Transport | None = None,
        budget: ByteBudget | None = None,
    ) -> None:
        self.target = target
        self.stats = stats
        self.component = component
        self.queue_max_items = queue_max_items
        self.retry_max_elapsed_s = retry_max_elapsed_s
        self.budget = budget if budget is not None else ByteBudget(DEFAULT_BUDGET_BYTES, stats)
        self._rejected = rejected
        self._transport = transport
        self._queue: deque[tuple[bytes, int]] = deque()
        self.queued = 0
        self.queued_bytes = 0
        self._in_flight = 0  # items of the request being sent; 0 once settled (or given up by shutdown)
        self._in_flight_bytes = 0
        self._cond = threading.Condition()
        self._closing = False
        self._shut = False
        self._deadline: float | None = None  # monotonic; set by close()
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._outage_logged = False
        self.delivered = 0
        self._queue_label = component.removeprefix("exporter:")
        stats.set(QUEUE_CAPACITY, queue_max_items, queue=self._queue_label)
        self.budget.add_shedder(self.shed, order=1)

    def shed(self) -> None:
        """The process is over its memory limit: drop the older half of the queue (at least one request)."""
        with self._cond:
            target, dropped = self.queued_bytes // 2, False
            while self._queue and (self.queued_bytes > target or not dropped):
                self._drop_oldest("memory_limit")
                dropped = True
            self._gauges()

    def start(self) -> None:
        """Open the connection and start the sender thread."""
        if self._transport is None:
            self._transport = make_transport(self.target)
        self._thread = threading.Thread(target=self._run, name=f"aaco-{self._queue_label}", daemon=True)
        self._thread.start()

    @property
    def closing(self) -> bool:
        """True once shutdown began."""
        return self._closing

    @property
    def in_flight(self) -> int:
        """Items of the request being sent now (0 when none)."""
        return self._in_flight

    def enqueue(self, payload: bytes, n: int) -> None:
        """Queue one request of ``n`` items, dropping the oldest requests while either bound is passed."""
        with self._cond:
            if self._closing:
                self.stats.inc(EVENTS_DROPPED, n, component=self.component, reason="shutdown")
                return
            while self._queue and self.queued + n > self.queue_max_items:
                self._drop_oldest("queue_full")
            self.budget.acquire(self._queue_label, len(payload))
            self._queue.append((payload, n))
            self.queued += n
            self.queued_bytes += len(payload)
            while self._queue and self.budget.over():
                self._drop_oldest("memory_budget")
            self._gauges()
            self._cond.notify_all()

    def _drop_oldest(self, reason: str) -> None:
        payload, n = self._queue.popleft()
        self.queued -= n
        self.queued_bytes -= len(payload)
        self.budget.release(self._queue_label, len(payload))
        self.stats.inc(EVENTS_DROPPED, n, component=self.component, reason=reason)

    def _gauges(self) -> None:
        self.stats.set(QUEUE_DEPTH, self.queued, queue=self._queue_label)
        self.stats.set(QUEUE_BYTES, self.queued_bytes, queue=self._queue_label)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait(0.5)
                if not self._queue or self._abort.is_set():
                    return
                payload, n = self._queue.popleft()
                self.queued -= n
                self.queued_bytes -= len(payload)
                self._in_flight, self._in_flight_bytes = n, len(payload)
                self._gauges()
            ok, rejected, reason = self._deliver(payload, n)
            with self._cond:
                if self._in_flight:  # not given up by shutdown meanwhile
                    if ok:
                        self.stats.inc(EVENTS_EMITTED, n - rejected, component=self.component)
                        self.delivered += n - rejected
                    self.stats.inc(EVENTS_DROPPED, n if not ok else rejected, component=self.component, reason=reason)
                    self._settle()
                self._cond.notify_all()

    def _settle(self) -> None:
        """Release the request in flight (the caller holds the condition)."""
        self.budget.release(self._queue_label, self._in_flight_bytes)
        self._in_flight = self._in_flight_bytes = 0

    def _time_left(self, cap: float) -> float:
        """``cap``, or less once a shutdown deadline is set."""
        deadline = self._deadline
        return cap if deadline is None else min(cap, deadline - time.monotonic())

    def _deliver(self, payload: bytes, n: int) -> tuple[bool, int, str]:
        """Send with retries: (delivered, items the server rejected, why items were dropped)."""
        assert self._transport is not None
        started = time.monotonic()
        attempt = 0
        while True:
            timeout = self._time_left(self.target.timeout_s)
            if self._abort.is_set() or timeout <= 0:
                return False, 0, "shutdown"
            result = self._transport.send(payload, timeout)
            if result.ok:
                if self._outage_logged:
                    log.info("OTLP %s endpoint %s reachable again", self.target.signal, self.target.url)
                    self._outage_logged = False
                return True, min(n, self._rejected(result.response)), "rejected"
            self.stats.inc(EXPORT_ERRORS, 1, exporter=self._queue_label)
            if not self._outage_logged:
                log.warning(
                    "OTLP %s export to %s failed: %s%s",
                    self.target.signal,
                    self.target.url,
                    result.error,
                    "; retrying" if result.retryable else "",
                )
                self._outage_logged = True
            if not result.retryable:
                return False, 0, "rejected"
            delay = result.retry_after_s
            if delay is None:
                cap = self.target.retry_max_interval_s
                delay = min(cap, BACKOFF_INITIAL_S * 2**attempt) * random.uniform(0.8, 1.2)
            attempt += 1
            if time.monotonic() + delay - started > self.retry_max_elapsed_s:
                return False, 0, "retries_exhausted"
            self._abort.wait(max(0.0, self._time_left(delay)))

    def force_flush(self, timeout_s: float) -> bool:
        """Wait until everything queued was sent (or given up), up to ``timeout_s``."""
        if self._thread is None:
            return not self._queue
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._queue or self._in_flight) and time.monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            return not self._queue and not self._in_flight

    def close(self, deadline: float) -> None:
        """Take no more requests; send what is queued until the monotonic ``deadline`` (sends capped by it)."""
        with self._cond:
            self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
            self._closing = True
            self._cond.notify_all()

    def shutdown(self, timeout_s: float) -> None:
        """Send what is queued within ``timeout_s`` (or an earlier ``close`` deadline), drop the rest; idempotent."""
        self.close(time.monotonic() + timeout_s)
        with self._cond:
            if self._shut:
                return
            self._shut = True
        assert self._deadline is not None
        self.force_flush(max(0.0, self._deadline - time.monotonic()))
        self._abort.set()
        self.budget.remove_shedder(self.shed)
        with self._cond:
            left = self.queued + self._in_flight
            if left:
                self.stats.inc(EVENTS_DROPPED, left, component=self.component, reason="shutdown")
            self.budget.release(self._queue_label, self.queued_bytes)
            self._settle()
            self._queue.clear()
            self.queued = self.queued_bytes = 0
            self._gauges()
            self._cond.notify_all()
        if self._transport is not None:
            self._transport.close()  # cancels a gRPC call in flight
