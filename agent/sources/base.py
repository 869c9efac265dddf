"""The source contract: read and normalise, publish Arrow batches, never block the bus unboundedly.

A source runs in its own thread (``run``), publishes batches of one of the event kinds through its
``SourceContext`` and returns when its input is exhausted (``finite`` sources: a replay, a fixed
number of workload cycles) or when ``ctx.stop`` is set. Bad input never escapes ``run`` as an
exception: it is counted (``aaco_source_errors_total{source,reason}``), logged once per file and
reason, and kept as a ``Problem`` the command line can report; a file whose reading raises anyway
is its own failure boundary (``ingest.file_failed``). What still escapes ``run`` is caught by the
agent's ``supervise.Supervisor``, which restarts the source with backoff.

Stopping has two stages: ``stop`` asks a source to read no more (it still publishes what it has,
waiting for room on the bus), ``abort`` tells it the shutdown deadline passed and publishing
gives up (counted as drops with reason ``shutdown``).
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pyarrow as pa

from aaco.contract.channel import MAX_BATCH_ROWS, BatchQueue
from aaco.contract.ledger import Ledger, Range
from aaco.contract.schemas import TIME_COLUMN, EventBatch, SchemaError, conform
from aaco.contract.stats import SOURCE_ERRORS, SOURCE_FILES, SOURCE_LAG, Stats

# Bad input as it is met. The commands that print every problem when they end (aaco run, aaco replay)
# quiet this logger so that none is said twice.
input_log = logging.getLogger("aaco.sources.input")


class Progress(Protocol):
    """Where long work reports progress (a rich progress bar on the command line, nothing in the daemon)."""

    def start(self, task: str, total: int | None) -> None:
        """A task begins; ``total`` steps if known."""

    def advance(self, task: str, steps: int = 1) -> None:
        """Steps of a task are done."""

    def finish(self, task: str) -> None:
        """A task is over."""


class NullProgress:
    """Progress that goes nowhere."""

    def start(self, task: str, total: int | None) -> None:
        """Ignore."""

    def advance(self, task: str, steps: int = 1) -> None:
        """Ignore."""

    def finish(self, task: str) -> None:
        """Ignore."""


@dataclass(frozen=True)
class Problem:
    """Bad input a source met: which source, which file, why, and what it did about it."""

    source: str
    subject: str
    reason: str
    message: str
    fatal: bool  # True when nothing could be read from the subject


@dataclass(frozen=True)
class SourceRecord:
    """What a source read: one file or capture, its format, how its clock was converted, how many events."""

    source: str
    subject: str
    format: str
    events: dict[str, int]
    clock: dict[str, Any] | None
    skipped: dict[str, int] = field(default_factory=dict)
    devices: dict[str, Any] = field(default_factory=dict)  # what the trace says about each device


class Journal:
    """Problems and records of every source, bounded, shared across reloads."""

    def __init__(self, stats: Stats, limit: int = 1000) -> None:
        self.stats = stats
        self.problems: deque[Problem] = deque(maxlen=limit)
        self.records: deque[SourceRecord] = deque(maxlen=limit)
        self._logged: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()

    def problem(self, p: Problem, count: int) -> None:
        """Count, keep, and log once per (source, subject, reason)."""
        if count:
            self.stats.inc(SOURCE_ERRORS, count, source=p.source, reason=p.reason)
        key = (p.source, p.subject, p.reason)
        with self._lock:
            first = key not in self._logged
            if first and len(self._logged) < 10_000:
                self._logged.add(key)
            self.problems.append(p)
        if first:
            input_log.warning("%s: %s: %s", p.source, p.subject, p.message)

    def record(self, rec: SourceRecord) -> None:
        """Remember what was read."""
        with self._lock:
            self.records.append(rec)
        self.stats.inc(SOURCE_FILES, 1, source=rec.source)

    def records_json(self) -> list[dict[str, Any]]:
        """The records as plain dicts (``sources.json``)."""
        with self._lock:
            return [asdict(r) for r in self.records]


@dataclass
class SourceContext:
    """What a running source gets from the agent."""

    node: str
    stats: Stats
    bus: BatchQueue
    journal: Journal
    stop: threading.Event = field(default_factory=threading.Event)
    abort: threading.Event = field(default_factory=threading.Event)
    progress: Progress = field(default_factory=NullProgress)
    ledger: Ledger = field(default_factory=Ledger)
    quarantine: Path | None = None  # where bad input is copied (DIR/quarantine/<source>/), None: not kept

    def publish(
        self,
        source: str,
        kind: str,
        batch: pa.RecordBatch | pa.Table,
        *,
        durable: bool,
        live: bool = False,
        range_: Range | None = None,
    ) -> bool:
        """Conform ``batch`` to ``kind`` and put it on the bus in chunks of at most ``MAX_BATCH_ROWS``.

        ``durable`` input (a file that can be re-read) waits for room; anything else is offered and
        dropped, counted, when the bus is full. Returns False if any chunk did not get on the bus.
        ``range_`` is the ledger range of the input these rows came from: each chunk is one piece
        of it, and a chunk the bus refuses fails it (the input is read again after a restart).

        ``live`` says what the data is, not where it comes from: rows happening now (telemetry,
        scheduler events, a capture window just taken, the new lines of a tailed growing file) set
        ``aaco_source_lag_seconds`` from their newest event. A whole file (a replay, a complete file
        picked up in a spool, a capture left by an earlier run) is not live, however recent: its
        age says when it was recorded, not how far behind the agent is.
        """
        try:
            full = conform(kind, batch)
        except SchemaError as exc:
            self.problem(source, kind, "schema", str(exc), fatal=False, count=batch.num_rows)
            if range_ is not None:
                range_.fail()
            return False
        ok = True
        ranges = (range_,) if range_ is not None else ()
        for offset in range(0, full.num_rows, MAX_BATCH_ROWS):
            item = EventBatch(kind, full.slice(offset, MAX_BATCH_ROWS), source, ranges)
            if range_ is not None:
                range_.add_pieces(1)
            sent = self.bus.put(item, stop=self.abort) if durable else self.bus.offer(item)
            if not sent and range_ is not None:
                range_.done()
                range_.fail()
            ok &= sent
        if live and full.num_rows:
            newest = int(full.column(TIME_COLUMN[kind]).to_numpy().max())
            self.stats.set(SOURCE_LAG, max(0.0, (time.time_ns() - newest) / 1e9), source=source)
        return ok

    def problem(self, source: str, subject: str, reason: str, message: str, *, fatal: bool, count: int = 0) -> None:
        """Record bad input: counted, logged once per (source, subject, reason), kept for reporting."""
        self.journal.problem(Problem(source, subject, reason, message, fatal), count)

    def record(self, rec: SourceRecord) -> None:
        """Remember what was read (``sources.json`` in the lake, the command line's summary)."""
        self.journal.record(rec)

    def sleep(self, seconds: float) -> bool:
        """Wait, waking early on stop; True if the agent is stopping."""
        return self.stop.wait(seconds)


class Source(ABC):
    """A running input. Subclasses set ``type`` and implement ``run``."""

    type: ClassVar[str]
    finite: bool = False  # ends on its own when its input is exhausted

    def __init__(self, name: str) -> None:
        self.name = name

    @abstractmethod
    def run(self, ctx: SourceContext) -> None:
        """Read until done or ``ctx.stop`` is set; never raise for bad input."""


SourceFactory = Callable[[Any, str], Source]
