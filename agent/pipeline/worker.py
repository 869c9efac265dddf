"""The pipeline's consumer side: bus -> correlator -> analyzers and exporters, snapshots on a timer.

One worker thread calls ``step`` in a loop. An analyzer or exporter that raises is a bug, not bad
input; it is logged once with its traceback and counted, and the pipeline goes on without losing
the batch for the others.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from aaco.agent.pipeline.bus import Bus
from aaco.agent.pipeline.correlator import Correlator
from aaco.analyzers.base import Analyzer, DerivedAnalyzer
from aaco.contract.ledger import Ledger
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.signals import define
from aaco.contract.snapshot import AnalysisSnapshot, Finding
from aaco.contract.stats import EVENTS_DROPPED, EXPORT_ERRORS, Stats
from aaco.exporters.base import Exporter, ExportResult

log = logging.getLogger("aaco.pipeline")

IDLE_SNAPSHOT_GAP_S = 0.25
# The longest the worker sleeps on an empty bus before its periodic work (exporter ticks): each
# wake-up costs CPU (10 Hz is 0.1 % of a core), so it wakes only when something is due.
MAX_IDLE_WAIT_S = 0.5
MIN_IDLE_WAIT_S = 0.01

FINDINGS = define(
    "aaco.findings",
    "aaco_findings",
    "counter",
    "{finding}",
    "Findings the analyzers reached (drift, throttling, bottleneck, ...), by analyzer and severity.",
    ("analyzer", "severity"),
)
ANALYZER_ERRORS = define(
    "aaco.agent.analyzer.errors",
    "aaco_analyzer_errors",
    "counter",
    "{error}",
    "Batches an analyzer failed on (a bug: see the agent's log).",
    ("analyzer",),
)


class Pipeline:
    """Consumes the bus; owns the correlator, analyzers and exporters while it runs."""

    def __init__(
        self,
        bus: Bus,
        correlator: Correlator,
        analyzers: Sequence[Analyzer],
        exporters: Sequence[Exporter],
        stats: Stats,
        node: str,
        snapshot_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        ledger: Ledger | None = None,
    ) -> None:
        self.bus = bus
        self.correlator = correlator
        self.analyzers = list(analyzers)
        self.exporters = list(exporters)
        self.stats = stats
        self.node = node
        self.ledger = ledger
        self.snapshot_interval_s = snapshot_interval_s
        self._clock = clock
        self._last_snapshot = clock()
        self._dirty = True
        self._failed: set[str] = set()
        self.heartbeat = clock()
        self.steps = 0
        self.recent_findings: deque[Finding] = deque(maxlen=100)

    def step(self, timeout_s: float = 0.1) -> bool:
        """Process at most one batch (waiting up to ``timeout_s``) and the periodic work; True if one came."""
        item = self.bus.get(timeout_s)
        if item is not None:
            for out in self.correlator.process(item):
                self.dispatch(out)
        else:
            for out in self.correlator.expire():
                self.dispatch(out)
        self.periodic()
        self.heartbeat = self._clock()
        self.steps += 1
        return item is not None

    def idle_wait(self) -> float:
        """How long the next ``step`` may wait for a batch: until a held kernel or a snapshot is due.

        At most ``MAX_IDLE_WAIT_S`` (exporters' ticks run at least that often), at least
        ``MIN_IDLE_WAIT_S`` (work that is due but waits on something else never spins).
        """
        wait = MAX_IDLE_WAIT_S
        release = self.correlator.release_in()
        if release is not None:
            wait = min(wait, release)
        if self._dirty:
            idle_gap = max(IDLE_SNAPSHOT_GAP_S, self.snapshot_interval_s / 2)
            wait = min(wait, self._last_snapshot + idle_gap - self._clock())
        return max(MIN_IDLE_WAIT_S, wait)

    def periodic(self) -> None:
        """Timed work: lake flushes, and a snapshot when new data came in.

        The snapshot is taken when the interval passed, or once the bus is idle and half the interval
        passed (so the results of a finished burst show soon, without a snapshot per batch; a steady
        trickle such as 1 Hz telemetry does not make one every second: each writes analysis.json).
        """
        for exp in self.exporters:
            exp.tick()
        if not self._dirty:
            return
        since = self._clock() - self._last_snapshot
        idle_gap = max(IDLE_SNAPSHOT_GAP_S, self.snapshot_interval_s / 2)
        if since >= self.snapshot_interval_s or (since >= idle_gap and self.bus.depth == 0):
            self.publish_snapshot()

    def dispatch(self, item: EventBatch) -> None:
        """Feed one correlated batch to the analyzers that take its kind, then to every exporter."""
        self._dirty = True
        for analyzer in self.analyzers:
            if item.kind in analyzer.kinds:
                try:
                    analyzer.update(item)
                except Exception:
                    self._bug(f"analyzer {analyzer.name}", analyzer.name)
                    self.stats.inc(ANALYZER_ERRORS, 1, analyzer=analyzer.name)
        for exp in self.exporters:
            try:
                if exp.export(item) is ExportResult.FAILURE:
                    self.stats.inc(EXPORT_ERRORS, 1, exporter=exp.name)
            except Exception:
                self._bug(f"exporter {exp.name}", exp.name)
                self.stats.inc(EXPORT_ERRORS, 1, exporter=exp.name)
        if item.ranges and self.ledger is not None and not any(e.durable for e in self.exporters):
            # No exporter stores rows durably: the pieces are done once dispatched (nothing to resume).
            self.ledger.apply(list(item.ranges))

    def _bug(self, what: str, key: str) -> None:
        if key not in self._failed:
            self._failed.add(key)
            log.exception("%s failed on a batch (logged once; further failures are only counted)", what)

    def snapshot(self) -> AnalysisSnapshot:
        """Every analyzer's current result."""
        results = {}
        derived = [a for a in self.analyzers if isinstance(a, DerivedAnalyzer)]
        for a in self.analyzers:
            if a in derived:
                continue
            try:
                results[a.name] = a.snapshot()
            except Exception:
                self._bug(f"analyzer {a.name} snapshot", f"{a.name}.snapshot")
                self.stats.inc(ANALYZER_ERRORS, 1, analyzer=a.name)
        for a in derived:  # after the others: they conclude from the others' results
            try:
                results[a.name] = a.derive(dict(results))
            except Exception:
                self._bug(f"analyzer {a.name} derive", f"{a.name}.derive")
                self.stats.inc(ANALYZER_ERRORS, 1, analyzer=a.name)
        return AnalysisSnapshot(time.time_ns(), self.node, results, tuple(self.recent_findings))

    def _findings(self) -> None:
        """Store the findings the analyzers reached since the last snapshot (as a ``findings`` batch)."""
        found: list[Finding] = []
        for a in self.analyzers:
            found += a.drain_findings()
            if dropped := a.drain_dropped_findings():
                self.stats.inc(EVENTS_DROPPED, dropped, component=f"analyzer.{a.name}", reason="findings_overflow")
        if not found:
            return
        for f in found:
            self.stats.inc(FINDINGS, 1, analyzer=f.analyzer, severity=f.severity)
        self.recent_findings.extend(found)
        table = conform(
            "findings",
            {
                "ts_ns": [f.ts_ns for f in found],
                "node": [f.node for f in found],
                "analyzer": [f.analyzer for f in found],
                "subject": [f.subject for f in found],
                "severity": [f.severity for f in found],
                "confidence": [float(f.confidence) for f in found],
                "summary": [f.summary for f in found],
                "evidence_json": [json.dumps(dict(f.evidence), default=str, sort_keys=True) for f in found],
                "trace_id": [f.trace_id for f in found],
            },
        )
        self.dispatch(EventBatch("findings", table, "analyzers"))

    def publish_snapshot(self) -> AnalysisSnapshot:
        """Compute a snapshot and hand it to every exporter.

        Findings are stored after the snapshot is computed, so those that derived analyzers reach
        while deriving it are part of it (and of the final snapshot, not lost at shutdown).
        """
        snap = self.snapshot()
        self._findings()
        snap = dataclasses.replace(snap, findings=tuple(self.recent_findings))
        for exp in self.exporters:
            try:
                if exp.export_snapshot(snap) is ExportResult.FAILURE:
                    self.stats.inc(EXPORT_ERRORS, 1, exporter=exp.name)
            except Exception:
                self._bug(f"exporter {exp.name} snapshot", f"{exp.name}.snapshot")
                self.stats.inc(EXPORT_ERRORS, 1, exporter=exp.name)
        self._last_snapshot = self._clock()
        self._dirty = False
        return snap

    def drain(self, deadline: float) -> bool:
        """Process what is queued until empty or ``deadline`` (monotonic); True if the bus emptied."""
        while self._clock() < deadline:
            if not self.step(0.0) and self.bus.depth == 0:
                return True
        return self.bus.depth == 0

    def finish(self) -> AnalysisSnapshot:
        """Release held kernels and publish the final snapshot."""
        for out in self.correlator.flush():
            self.dispatch(out)
        return self.publish_snapshot()
