"""One byte budget for what the agent holds on behalf of OTLP: requests being read, assembled or sent.

The OpenTelemetry Collector's ``memory_limiter`` refuses data once the process is over a soft limit;
here the bound is the bytes themselves, counted where they are held, so it holds whatever else the
process does. Holders:

- the receiver, for a request from admission (its ``Content-Length``) until it is handed on;
- the trace assembler, for application requests held while they wait for their links;
- each ``OtlpSender``, for the requests in its queue and the one in flight (retries included).

The receiver *admits* a request only with ``try_acquire`` (refused when it would pass the limit:
the client is told to back off); the agent's own data and hand-overs use ``acquire``, which never
refuses (the senders then drop their oldest requests until the budget is met again). What is counted
is what the data costs in memory: serialised requests their bytes, parsed ones an estimate of their
objects (the receiver's, docs/security.md, "Memory").

The agent's memory guard (``agent/memory_guard.py``) adds the process's own view, as the
Collector's ``memory_limiter`` does: over its soft limit the budget ``refuse``s every admission, over
the hard limit it also ``shed``s what the holders hold (each holder registered a way to).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Final

from aaco.contract.signals import define
from aaco.contract.stats import Stats

DEFAULT_BUDGET_BYTES: Final = 256 * 1024 * 1024

BUDGET_LIMIT: Final = define(
    "aaco.agent.memory.budget",
    "aaco_memory_budget_bytes",
    "gauge",
    "By",
    "The byte budget for OTLP data the agent holds (received, assembling, queued, in flight).",
)
BUDGET_HELD: Final = define(
    "aaco.agent.memory.held",
    "aaco_memory_held_bytes",
    "gauge",
    "By",
    "OTLP bytes the agent holds now, by holder (receiver, assembly, a sender's queue).",
    ("holder",),
)


class ByteBudget:
    """Bytes held under one limit, by holder; thread-safe and cheap (one lock, no allocation)."""

    def __init__(self, limit_bytes: int, stats: Stats) -> None:
        self.limit = limit_bytes
        self.stats = stats
        self._held: dict[str, int] = {}
        self._total = 0
        self._lock = threading.Lock()
        self._refusing: str | None = None
        self._shedders: list[tuple[int, Callable[[], None]]] = []
        stats.set(BUDGET_LIMIT, limit_bytes)

    @property
    def held(self) -> int:
        """Bytes held by every holder together."""
        return self._total

    def held_by(self, holder: str) -> int:
        """Bytes one holder holds."""
        return self._held.get(holder, 0)

    def over(self) -> bool:
        """True while more than the limit is held (the senders drop their oldest until it is not)."""
        return self._total > self.limit

    @property
    def refusing(self) -> str | None:
        """Why every admission is refused now (``memory_limit``), None when admissions follow the limit."""
        return self._refusing

    def refuse(self, reason: str | None) -> None:
        """Refuse every admission for ``reason`` from now on, or (None) admit again within the limit."""
        self._refusing = reason

    def add_shedder(self, shed: Callable[[], None], order: int = 0) -> None:
        """Register how a holder gives up what it holds (lower ``order`` first: hand-overs before drops)."""
        with self._lock:
            self._shedders.append((order, shed))
            self._shedders.sort(key=lambda entry: entry[0])

    def remove_shedder(self, shed: Callable[[], None]) -> None:
        """Forget a holder's way to shed (it shut down)."""
        with self._lock:
            self._shedders = [(o, s) for o, s in self._shedders if s != shed]

    def shed(self) -> None:
        """Have every holder give up what it holds (the process is over its hard memory limit)."""
        with self._lock:
            shedders = [shed for _, shed in self._shedders]
        for shed in shedders:
            shed()

    def try_acquire(self, holder: str, n: int) -> bool:
        """Take ``n`` bytes only if the total stays within the limit (admission of received data)."""
        with self._lock:
            if self._refusing is not None or self._total + n > self.limit:
                return False
            self._add(holder, n)
            return True

    def acquire(self, holder: str, n: int) -> None:
        """Take ``n`` bytes whatever is held (the agent's own data, and hand-overs between holders)."""
        with self._lock:
            self._add(holder, n)

    def release(self, holder: str, n: int) -> None:
        """Give back ``n`` bytes ``holder`` took (never below zero)."""
        with self._lock:
            self._add(holder, -min(n, self._held.get(holder, 0)))

    def move(self, src: str, dst: str, n: int) -> None:
        """Hand ``n`` bytes from one holder to another without passing through zero."""
        with self._lock:
            moved = min(n, self._held.get(src, 0))
            self._add(src, -moved)
            self._add(dst, n)

    def _add(self, holder: str, n: int) -> None:
        value = self._held.get(holder, 0) + n
        self._held[holder] = value
        self._total += n
        self.stats.set(BUDGET_HELD, value, holder=holder)
