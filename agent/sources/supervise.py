"""Source supervision: a source thread that crashes is restarted with backoff, and reported while down.

Bad input never escapes a source (each file is its own failure boundary, ``ingest.file_failed``);
what still escapes ``Source.run`` is a bug or an environment the source cannot work in. The
supervisor records it (``aaco_source_errors_total{reason="crash"}``, or ``"error"`` for an
``AacoError``), counts the restart (``aaco_source_restarts_total``), waits (1 s, doubling, at most
60 s; back to 1 s once a run lasted longer than the cap) and runs the same ``Source`` again, so what
it already read stays read. While it waits it is *down*: ``/healthz`` and ``/readyz`` name it.

A finite source (a replay) that ends normally is done. One that keeps crashing is given up after
``FINITE_RESTARTS`` restarts (the agent that waits for its sources must end), and stays reported
as failed.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aaco.agent.sources.base import Source, SourceContext
from aaco.contract.errors import AacoError
from aaco.contract.stats import SOURCE_RESTARTS

log = logging.getLogger("aaco.sources.supervise")

BACKOFF_INITIAL_S = 1.0
BACKOFF_MAX_S = 60.0
FINITE_RESTARTS = 3


@dataclass
class Supervisor:
    """Runs one source in its thread (``run``) and restarts it when it crashes."""

    name: str
    source: Source
    ctx: SourceContext
    on_end: Callable[[], None] = lambda: None  # called once the thread is about to end
    initial_s: float = BACKOFF_INITIAL_S
    max_s: float = BACKOFF_MAX_S
    finite_restarts: int = FINITE_RESTARTS
    ended: threading.Event = field(default_factory=threading.Event)
    restarts: int = 0
    _down: str | None = None  # why the source is not running, while it is not
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def down(self) -> str | None:
        """Why the source is down (crashed, waiting to restart, or given up); None while it runs or ended well."""
        with self._lock:
            return self._down

    def run(self) -> None:
        """The thread's body: run the source until it ends, is stopped, or (finite) keeps crashing."""
        delay = self.initial_s
        try:
            while True:
                started = time.monotonic()
                try:
                    self.source.run(self.ctx)
                    return  # ended (finite: its input is exhausted) or stopped
                except Exception as exc:
                    if time.monotonic() - started > self.max_s:
                        delay = self.initial_s  # it ran well for a while: a new failure, not a loop
                    if not self._crashed(exc, delay):
                        return
                if self.ctx.stop.wait(delay):
                    return
                delay = min(self.max_s, delay * 2)
                self.restarts += 1
                self.ctx.stats.inc(SOURCE_RESTARTS, 1, source=self.name)
                self._set_down(None)
                log.info("source %s: restart %d", self.name, self.restarts)
        finally:
            self.ended.set()
            self.on_end()

    def _set_down(self, why: str | None) -> None:
        with self._lock:
            self._down = why

    def _crashed(self, exc: Exception, delay: float) -> bool:
        """Record and log an exception that escaped the source (the traceback once); True: restart it."""
        if isinstance(exc, AacoError):  # the user's to fix: said without a traceback
            why, trace = str(exc), None
            self.ctx.problem(self.name, exc.subject or self.name, "error", why, fatal=True, count=1)
        else:
            why, trace = f"{type(exc).__name__}: {exc}", exc if self.restarts == 0 else None
            self.ctx.problem(self.name, self.name, "crash", why, fatal=True, count=1)
        if self.ctx.stop.is_set():
            return False
        if self.source.finite and self.restarts >= self.finite_restarts:
            self._set_down(f"failed after {self.restarts + 1} crashes ({why}); not restarted")
            log.error("source %s %s", self.name, self.down(), exc_info=trace)
            return False
        self._set_down(f"crashed ({why}); restarting in {delay:.0f}s")
        log.error("source %s %s", self.name, self.down(), exc_info=trace)
        if trace is None:
            log.debug("source %s crashed", self.name, exc_info=exc)
        return True
