"""The exporter contract (as OpenTelemetry's): a ``Flushing`` component that exports.

The lifecycle (``start``, ``force_flush``, ``shutdown`` idempotent, safe before ``start`` and bounded
by its deadline) is ``aaco.contract.component``'s. Exporters receive event batches (``export``) and
analyzer snapshots (``export_snapshot``); one that has no use for either accepts it and does
nothing. ``tick`` is the pipeline's periodic call while it is idle (time-based flushes).
"""

from __future__ import annotations

import enum
from abc import abstractmethod

from aaco.contract.component import Flushing
from aaco.contract.schemas import EventBatch
from aaco.contract.snapshot import AnalysisSnapshot


class ExportResult(enum.Enum):
    """Outcome of one export call."""

    SUCCESS = 0
    FAILURE = 1


class Exporter(Flushing):
    """Base of every exporter."""

    name: str = "exporter"
    durable: bool = False  # stores rows durably and marks their ledger ranges done itself (the lake)

    @abstractmethod
    def export(self, batch: EventBatch) -> ExportResult:
        """Ship (or buffer) a batch of events."""

    def export_snapshot(self, snapshot: AnalysisSnapshot) -> ExportResult:
        """Ship the latest analyzer snapshot; default: ignore."""
        return ExportResult.SUCCESS

    def tick(self) -> None:
        """Periodic work, called by the pipeline at least every few seconds; default: nothing."""

    @abstractmethod
    def force_flush(self, timeout_s: float) -> bool:
        """Write out everything buffered within ``timeout_s``; True if all of it went."""

    @abstractmethod
    def shutdown(self, timeout_s: float) -> None:
        """Flush and release everything within ``timeout_s``; idempotent, safe before start."""
