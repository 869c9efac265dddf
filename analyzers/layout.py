"""The per-batch layout cache the telemetry and throttle analyzers share.

A telemetry source sends the same rows sample after sample (same GPUs, metrics and attributes; only
times and values move). What an analyzer derives from a batch's identity columns (series keys, rows
per GPU) is kept with those columns, and a batch whose identity columns equal the last one's reuses it
instead of reading them again. The comparison is one vectorised ``RecordBatch.equals``.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

import pyarrow as pa

T = TypeVar("T")


class LayoutCache(Generic[T]):
    """What was derived from the last batch laid out as ``columns`` (and tagged ``tag``)."""

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self._last: tuple[Hashable, pa.RecordBatch, T] | None = None

    def layout(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The identity columns of ``batch``."""
        return batch.select(self.columns)

    def get(self, layout: pa.RecordBatch, tag: Hashable = None) -> T | None:
        """The value kept for this layout and tag, None when the last batch was laid out otherwise."""
        last = self._last
        if last is None or last[0] != tag or not last[1].equals(layout):
            return None
        return last[2]

    def put(self, layout: pa.RecordBatch, value: T, tag: Hashable = None) -> None:
        """Keep ``value`` for this layout and tag."""
        self._last = (tag, layout, value)

    def clear(self) -> None:
        """Forget the last layout (its value no longer holds)."""
        self._last = None
