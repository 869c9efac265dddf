"""The exporter contract (as OpenTelemetry's): export, force_flush, shutdown.

``shutdown`` is idempotent, safe before ``start``, and bounded by the deadline it is given.
Exporters receive event batches (``export``) and analyzer snapshots (``export_snapshot``); one that
has no use for either accepts it and does nothing.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod

from aaco.contract.schemas import EventBatch
from aaco.contract.snapshot import AnalysisSnapshot


class ExportResult(enum.Enum):
    """Outcome of one export call."""

    SUCCESS = 0
    FAILURE = 1


class Exporter(ABC):
    """Base of every exporter."""

    name: str = "exporter"
    durable: bool = False  # stores rows durably and marks their ledger ranges done itself (the lake)

    def start(self) -> None:  # noqa: B027 - optional hook
        """Open what the exporter needs (servers, connections); default: nothing."""

    @abstractmethod
    def export(self, batch: EventBatch) -> ExportResult:
        """Ship (or buffer) a batch of events."""

    def export_snapshot(self, snapshot: AnalysisSnapshot) -> ExportResult:
        """Ship the latest analyzer snapshot; default: ignore."""
        return ExportResult.SUCCESS

    @abstractmethod
    def force_flush(self, timeout_s: float) -> bool:
        """Write out everything buffered within ``timeout_s``; True if all of it went."""

    @abstractmethod
    def shutdown(self, timeout_s: float) -> None:
        """Flush and release everything within ``timeout_s``; idempotent, safe before start."""
