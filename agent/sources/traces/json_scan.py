"""The structure of a JSON byte stream, block by block: nesting depth and the top levels' brackets.

``JsonScanner.feed`` classifies every byte of a block with numpy (quotes, backslashes, newlines,
brackets), finds the quotes that open or close strings (a quote after an odd run of backslashes is
escaped), and keeps a running depth of the brackets outside strings. Work is linear in the input
and memory bounded by the block, whatever the nesting: a document nested deeper than the limit
stops the scan at the byte where it passes it, the brackets before it kept (ijson's prefix stack
and the standard library's recursion grow with depth; yajl and orjson stop at 1024 levels, this
stops sooner and says where).

A raw newline cannot occur inside a valid JSON string, so a newline ends any string the scan
thinks it is in: a damaged quote costs at most its line, not the rest of the document.

Hand-written because no library on hand reports structure without building the document; the
hot work is vectorised, Python runs once per block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_QUOTE, _BACKSLASH, _NEWLINE = ord('"'), ord("\\"), ord("\n")
_OPEN, _CLOSE = ord("{"), ord("}")


class JsonTooDeepError(Exception):
    """A document nested deeper than the scanner's limit, at ``offset`` (bytes from the start)."""

    def __init__(self, offset: int, limit: int) -> None:
        super().__init__(f"nested deeper than {limit} levels at byte {offset}")
        self.offset = offset
        self.limit = limit


@dataclass
class Brackets:
    """The brackets outside strings that open or close the top ``keep`` levels, in order."""

    pos: np.ndarray  # int64 byte offsets
    byte: np.ndarray  # uint8: the bracket itself
    depth: np.ndarray  # int64 depth after the bracket


class JsonScanner:
    """Running JSON depth over consecutive blocks (see the module doc); raises ``JsonTooDeepError``.

    With ``keep`` > 0 the brackets that open a level up to ``keep`` or close one back below it are
    kept (``brackets()``), which is what finding the events of a Chrome trace needs.
    """

    def __init__(self, max_depth: int, keep: int = 0) -> None:
        self.max_depth = max_depth
        self.keep = keep
        self.offset = 0  # bytes fed so far
        self.depth = 0
        self.in_string = False
        self._odd_backslashes = False  # the last block ended in an odd run of backslashes
        self._kept: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

    def feed(self, block: bytes | bytearray | memoryview) -> None:
        """Scan the next block of the stream."""
        a = np.frombuffer(block, dtype=np.uint8)
        base = self.offset
        self.offset += a.size
        if self._odd_backslashes:  # the carried backslash escapes this block's first byte
            a = np.concatenate((np.array([_BACKSLASH], np.uint8), a))
            base -= 1
        self._odd_backslashes = False
        qpos = np.flatnonzero(a == _QUOTE)
        backslash = a == _BACKSLASH
        if backslash.any():
            qpos = self._unescaped(qpos, np.flatnonzero(backslash), a.size)
        nlpos = np.flatnonzero(a == _NEWLINE)
        # String state: quotes toggle it, a newline resets it (see the module doc).
        start_parity = int(self.in_string)
        if nlpos.size:
            after_last_nl = qpos.size - int(np.searchsorted(qpos, nlpos[-1]))
            self.in_string = bool(after_last_nl & 1)
        else:
            self.in_string = bool((qpos.size + start_parity) & 1)
        folded = a | 0x20  # [ and ] fold onto { and }
        bpos = np.flatnonzero((folded == _OPEN) | (folded == _CLOSE))
        if bpos.size == 0:
            return
        quotes_before = np.searchsorted(qpos, bpos)
        if nlpos.size:
            line = np.searchsorted(nlpos, bpos) - 1
            line_start = np.searchsorted(qpos, nlpos[np.maximum(line, 0)])
            quotes_before -= np.where(line >= 0, line_start, -start_parity)
        else:
            quotes_before += start_parity
        bpos = bpos[(quotes_before & 1) == 0]
        opens = folded[bpos] == _OPEN
        step = np.where(opens, 1, -1)
        depth = self.depth + np.cumsum(step, dtype=np.int64)
        if depth.size == 0:
            return
        too_deep = None
        if int(depth.max()) > self.max_depth:
            first = int(np.argmax(depth > self.max_depth))
            too_deep = JsonTooDeepError(base + int(bpos[first]), self.max_depth)
            bpos, step, depth = bpos[:first], step[:first], depth[:first]  # what came before it is kept
        if depth.size:
            self.depth = int(depth[-1])
        if self.keep:
            sel = np.minimum(depth - step, depth) < self.keep
            if sel.any():
                self._kept.append((bpos[sel] + base, a[bpos[sel]], depth[sel]))
        if too_deep is not None:
            raise too_deep

    def _unescaped(self, qpos: np.ndarray, bspos: np.ndarray, size: int) -> np.ndarray:
        """The quotes not escaped by an odd run of backslashes; sets the carry for the next block."""
        breaks = np.flatnonzero(np.diff(bspos) != 1)
        starts = bspos[np.concatenate(([0], breaks + 1))]
        ends = bspos[np.concatenate((breaks, [bspos.size - 1]))]
        odd_run = (ends - starts) % 2 == 0
        self._odd_backslashes = bool(ends[-1] == size - 1 and odd_run[-1])
        run = np.minimum(np.searchsorted(ends, qpos - 1), ends.size - 1)
        escaped = (ends[run] == qpos - 1) & odd_run[run]
        return qpos[~escaped]

    def brackets(self) -> Brackets:
        """The kept brackets of everything fed so far."""
        if not self._kept:
            z = np.zeros(0, dtype=np.int64)
            return Brackets(z, np.zeros(0, dtype=np.uint8), z)
        return Brackets(
            np.concatenate([k[0] for k in self._kept]),
            np.concatenate([k[1] for k in self._kept]),
            np.concatenate([k[2] for k in self._kept]),
        )

    @property
    def complete(self) -> bool:
        """Whether every bracket and string opened so far is closed (a cut document is not)."""
        return self.depth <= 0 and not self.in_string
