"""A bounded, retrying OTLP request queue for one signal (traces, metrics or logs).

``enqueue`` never blocks: the queue is bounded in items (spans, data points, log records) and, when
full, drops the oldest requests, counted (``aaco_events_dropped_total{component, reason="queue_full"}``),
so an upstream outage costs data at the old end, never memory. A sender thread ships requests;
failures are retried with exponential backoff and jitter (the server's gRPC RetryInfo or HTTP
Retry-After wins) for up to ``retry_max_elapsed_s``; a permanent error drops the request, counted.
``shutdown`` flushes within its deadline and counts what is left as dropped (reason ``shutdown``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable

from aaco.agent.pipeline.stats import EVENTS_DROPPED, EVENTS_EMITTED, EXPORT_ERRORS, QUEUE_CAPACITY, QUEUE_DEPTH, Stats

from .otlp_settings import OtlpTarget
from .otlp_transport import Transport, make_transport

log = logging.getLogger("aaco.exporters.otlp")
BACKOFF_INITIAL_S = 0.5
BACKOFF_MAX_S = 16.0


class OtlpSender:
    """Ships encoded export requests to one target, in order, with retries; bounded."""

    def __init__(
        self,
        target: OtlpTarget,
        stats: Stats,
        component: str,
        queue_max_items: int,
        retry_max_elapsed_s: float,
        rejected: Callable[[bytes], int] = lambda _response: 0,
        transport: Transport | None = None,
    ) -> None:
        self.target = target
        self.stats = stats
        self.component = component
        self.queue_max_items = queue_max_items
        self.retry_max_elapsed_s = retry_max_elapsed_s
        self._rejected = rejected
        self._transport = transport
        self._queue: deque[tuple[bytes, int]] = deque()
        self.queued = 0
        self._in_flight = 0
        self._cond = threading.Condition()
        self._closing = False
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._outage_logged = False
        self.delivered = 0
        self._queue_label = component.removeprefix("exporter:")
        stats.set(QUEUE_CAPACITY, queue_max_items, queue=self._queue_label)

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

    def enqueue(self, payload: bytes, n: int) -> None:
        """Queue one request of ``n`` items, dropping the oldest requests if the queue would overflow."""
        with self._cond:
            if self._closing:
                self.stats.inc(EVENTS_DROPPED, n, component=self.component, reason="shutdown")
                return
            while self._queue and self.queued + n > self.queue_max_items:
                _, old = self._queue.popleft()
                self.queued -= old
                self.stats.inc(EVENTS_DROPPED, old, component=self.component, reason="queue_full")
            self._queue.append((payload, n))
            self.queued += n
            self.stats.set(QUEUE_DEPTH, self.queued, queue=self._queue_label)
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait(0.5)
                if not self._queue:
                    return
                payload, n = self._queue.popleft()
                self.queued -= n
                self._in_flight = n
                self.stats.set(QUEUE_DEPTH, self.queued, queue=self._queue_label)
            try:
                self._deliver(payload, n)
            finally:
                with self._cond:
                    self._in_flight = 0
                    self._cond.notify_all()

    def _deliver(self, payload: bytes, n: int) -> None:
        assert self._transport is not None
        started = time.monotonic()
        attempt = 0
        while True:
            if self._abort.is_set():
                self.stats.inc(EVENTS_DROPPED, n, component=self.component, reason="shutdown")
                return
            result = self._transport.send(payload, self.target.timeout_s)
            if result.ok:
                rejected = min(n, self._rejected(result.response))
                if rejected:
                    self.stats.inc(EVENTS_DROPPED, rejected, component=self.component, reason="rejected")
                self.stats.inc(EVENTS_EMITTED, n - rejected, component=self.component)
                self.delivered += n - rejected
                if self._outage_logged:
                    log.info("OTLP %s endpoint %s reachable again", self.target.signal, self.target.url)
                    self._outage_logged = False
                return
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
                self.stats.inc(EVENTS_DROPPED, n, component=self.component, reason="rejected")
                return
            delay = result.retry_after_s
            if delay is None:
                delay = min(BACKOFF_MAX_S, BACKOFF_INITIAL_S * 2**attempt) * random.uniform(0.8, 1.2)
            attempt += 1
            if time.monotonic() + delay - started > self.retry_max_elapsed_s:
                self.stats.inc(EVENTS_DROPPED, n, component=self.component, reason="retries_exhausted")
                return
            self._abort.wait(delay)

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued was sent (or given up), up to ``timeout_s``."""
        if self._thread is None:
            return True
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while (self._queue or self._in_flight) and time.monotonic() < deadline:
                self._cond.wait(min(0.1, max(0.0, deadline - time.monotonic())))
            return not self._queue and not self._in_flight

    def shutdown(self, timeout_s: float) -> None:
        """Flush within ``timeout_s``, then drop (counted) what is left; idempotent."""
        with self._cond:
            if self._closing:
                return
        deadline = time.monotonic() + timeout_s
        self.flush(max(0.0, deadline - time.monotonic()))
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._abort.set()
        if self._thread is not None:
            self._thread.join(max(0.1, deadline - time.monotonic()))
        with self._cond:
            if self.queued:
                self.stats.inc(EVENTS_DROPPED, self.queued, component=self.component, reason="shutdown")
            self._queue.clear()
            self.queued = 0
        if self._transport is not None:
            self._transport.close()
