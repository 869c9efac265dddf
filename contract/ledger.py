"""Exactly-once bookkeeping for durable inputs (trace files): which byte ranges are safely in the lake.

A source that reads a file registers each chunk it publishes as a ``Range`` [start, end) of that
file. Every event batch derived from the chunk carries the range; each such batch is a *piece*
(iterations and kernels of one chunk are two pieces; the correlator splitting a batch adds pieces).
A piece is done when its rows are durable — written in a lake commit — and a range is complete
when the source sealed it (published all its pieces) and every piece is done. A file's committed
offset is the end of the contiguous run of complete ranges from its start: after a restart the
source resumes there, so nothing is lost, and the lake's commit protocol (exporters/lake.py)
writes the new offsets together with the parts that hold the rows, so nothing is read twice.

A range whose piece could not be published (the bus refused it at shutdown) is *failed*: the
committed offset never passes it, and the next run reads it again.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any


@dataclass(eq=False)
class Range:
    """One published chunk [start, end) of one durable input (identified by ``key``)."""

    ledger: Ledger
    key: str
    start: int
    end: int
    pieces: int = 0
    sealed: bool = False
    failed: bool = False

    @property
    def complete(self) -> bool:
        """Sealed, not failed, every piece durable."""
        return self.sealed and not self.failed and self.pieces == 0

    def add_pieces(self, n: int = 1) -> None:
        """``n`` more batches carry this range."""
        self.ledger._change(self, n)

    def done(self) -> None:
        """One piece is durable."""
        self.ledger._change(self, -1)

    def seal(self) -> None:
        """The source published every piece of this range."""
        with self.ledger._lock:
            self.sealed = True

    def fail(self) -> None:
        """A piece could not be published: the range must be read again after a restart."""
        with self.ledger._lock:
            self.failed = True


@dataclass
class _Input:
    committed: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    ranges: list[Range] = field(default_factory=list)  # registered, not yet folded into `committed`


class Ledger:
    """Tracks ranges per input and the committed offset of each (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inputs: dict[str, _Input] = {}

    # -- sources ------------------------------------------------------------------------------------

    def load(self, offsets: dict[str, dict[str, Any]]) -> None:
        """Committed offsets recovered from the lake's checkpoints (at start, before sources run)."""
        with self._lock:
            for key, entry in offsets.items():
                self._inputs[key] = _Input(int(entry.get("offset", 0)), dict(entry.get("meta", {})))

    def committed(self, key: str) -> tuple[int, dict[str, Any]] | None:
        """(offset, meta) committed for an input, or None if it was never seen."""
        with self._lock:
            inp = self._inputs.get(key)
            return (inp.committed, dict(inp.meta)) if inp is not None else None

    def register(self, key: str, start: int, end: int, meta: dict[str, Any] | None = None) -> Range:
        """Open a range of ``key``; ``meta`` (file identity) is stored with the checkpoint."""
        with self._lock:
            inp = self._inputs.setdefault(key, _Input(committed=start))
            if meta:
                inp.meta.update(meta)
            r = Range(self, key, start, end)
            inp.ranges.append(r)
            return r

    def reset(self, key: str, meta: dict[str, Any] | None = None) -> None:
        """The input was truncated or replaced: start over from offset 0 with new identity ``meta``."""
        with self._lock:
            self._inputs[key] = _Input(0, dict(meta or {}))

    def forget(self, key: str) -> None:
        """Drop an input (its file is gone and fully committed)."""
        with self._lock:
            self._inputs.pop(key, None)

    def keys(self) -> list[str]:
        """Every input known."""
        with self._lock:
            return list(self._inputs)

    def pending(self, key: str) -> int:
        """Ranges of ``key`` not yet folded into its committed offset."""
        with self._lock:
            inp = self._inputs.get(key)
            return len(inp.ranges) if inp else 0

    # -- pipeline and lake --------------------------------------------------------------------------

    def _change(self, r: Range, n: int) -> None:
        with self._lock:
            r.pieces += n

    @staticmethod
    def _advance(inp: _Input, extra_done: dict[int, int] | None = None, limit: int | None = None) -> tuple[int, int]:
        """(new committed offset, ranges consumed) for an input, counting ``extra_done`` pieces as done.

        ``limit``: no range that ends past it is consumed.
        """
        offset, used = inp.committed, 0
        for r in sorted(inp.ranges, key=lambda x: x.start):
            pieces = r.pieces - (extra_done or {}).get(id(r), 0)
            if r.start > offset or not r.sealed or r.failed or pieces > 0 or (limit is not None and r.end > limit):
                break
            offset = max(offset, r.end)
            used += 1
        return offset, used

    def foldable(self) -> bool:
        """Whether some input has a complete range not yet folded (a commit would move its offset).

        A range with no pieces (a file that gave no rows, or one given up as bad) completes without
        any batch reaching the lake: this lets the lake commit its offset all the same.
        """
        with self._lock:
            return any(self._advance(inp)[1] for inp in self._inputs.values())

    def preview(self, done: list[Range]) -> dict[str, dict[str, Any]]:
        """The offsets that would be committed if the pieces in ``done`` (one entry per piece) were durable.

        Only inputs whose offset moves or that complete a range are returned: ``{key: {"offset", "meta"}}``.
        """
        counts: dict[int, int] = {}
        for r in done:
            counts[id(r)] = counts.get(id(r), 0) + 1
        out: dict[str, dict[str, Any]] = {}
        with self._lock:
            for key in {r.key for r in done} | set(self._inputs):
                inp = self._inputs.get(key)
                if inp is None:
                    continue
                offset, used = self._advance(inp, counts)
                if offset != inp.committed or used:  # an empty range moves no offset but brings its meta
                    out[key] = {"offset": offset, "meta": dict(inp.meta)}
        return out

    def apply(self, done: list[Range], upto: dict[str, dict[str, Any]] | None = None) -> None:
        """Mark the pieces in ``done`` durable and fold complete ranges into the committed offsets.

        ``upto`` (a ``preview``): fold no further than it said, so that what was written from it is what
        the ledger holds (ranges that completed since fold at the next commit).
        """
        with self._lock:
            for r in done:
                r.pieces -= 1
            for key, inp in self._inputs.items():
                if upto is not None and key not in upto:
                    continue
                offset, used = self._advance(inp, limit=None if upto is None else int(upto[key]["offset"]))
                if used:
                    ranges = sorted(inp.ranges, key=lambda x: x.start)
                    inp.ranges = ranges[used:]
                    inp.committed = offset

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Every input's committed offset and meta (what the lake persists)."""
        with self._lock:
            return {k: {"offset": v.committed, "meta": dict(v.meta)} for k, v in self._inputs.items()}
