"""In-memory exporter doubles, for unit tests only (integration tests use the real exporters)."""

from __future__ import annotations

import threading

import pyarrow as pa

from aaco.contract.schemas import EventBatch
from aaco.contract.snapshot import AnalysisSnapshot
from aaco.exporters.base import Exporter, ExportResult


class InMemoryExporter(Exporter):
    """Keeps every batch and snapshot it is given; counts flushes and shutdowns."""

    name = "memory"

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[EventBatch] = []
        self.snapshots: list[AnalysisSnapshot] = []
        self.started = 0
        self.flushes = 0
        self.shutdowns = 0
        self.fail = fail
        self._lock = threading.Lock()

    def start(self) -> None:
        """Count the start."""
        self.started += 1

    def export(self, batch: EventBatch) -> ExportResult:
        """Keep the batch (or fail, when asked to)."""
        if self.fail:
            return ExportResult.FAILURE
        with self._lock:
            self.batches.append(batch)
        return ExportResult.SUCCESS

    def export_snapshot(self, snapshot: AnalysisSnapshot) -> ExportResult:
        """Keep the snapshot."""
        with self._lock:
            self.snapshots.append(snapshot)
        return ExportResult.SUCCESS

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Count the flush."""
        self.flushes += 1
        return True

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Count the shutdown."""
        self.shutdowns += 1

    def table(self, kind: str) -> pa.Table | None:
        """Every row of ``kind`` received, as one table (None if none)."""
        with self._lock:
            parts = [b.batch for b in self.batches if b.kind == kind]
        return pa.Table.from_batches(parts) if parts else None
