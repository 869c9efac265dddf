"""What sources publish into: a bounded queue of event batches (the agent's ``pipeline.bus.Bus``)."""

from __future__ import annotations

import threading
from typing import Protocol

from aaco.contract.schemas import EventBatch

MAX_BATCH_ROWS = 65_536  # rows per published batch; larger tables are published in chunks


class BatchQueue(Protocol):
    """A bounded queue of ``EventBatch``: ``offer`` never waits, ``put`` waits for room (see ``Bus``)."""

    def offer(self, item: EventBatch) -> bool:
        """Enqueue without waiting; False (a counted drop) when full or closed."""
        ...

    def put(self, item: EventBatch, stop: threading.Event | None = None, timeout_s: float | None = None) -> bool:
        """Enqueue, waiting for room until ``timeout_s`` or ``stop``; False (a counted drop) on giving up."""
        ...
