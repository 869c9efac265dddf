"""Kineto's ``traceEvents`` read in bounded memory: the events handed out in batches as the file is read.

A Kineto trace is one JSON object whose ``traceEvents`` array holds nearly all of it; the other keys
(``baseTimeNanoseconds``, ``deviceProperties``, ``distributedInfo``, ``traceName``...) are small and
may come before or after the array. ``EventStream`` reads the file (``limits.open_trace``: gzip
streamed, sizes bounded) in blocks of ``BLOCK`` bytes:

1. the bytes before the array are kept (at most ``MAX_OUTSIDE`` bytes) and scanned (``json_scan``)
   until the ``[`` of ``"traceEvents":`` one level down;
2. each window of the array starts at an event boundary. Fast path: everything up to the window's
   last ``},{`` is parsed with one orjson call (``_fast``): exact, because ``[`` + those bytes +
   ``]`` parse only when that ``}`` closes an event outside any string; a ``},{`` inside a string
   or nested args leaves a string or bracket open and orjson refuses. A consumer that reads
   columns (``columns``, ``kineto_arrow``) is handed those bytes first; what it folds is not
   handed out again, and its windows grow by ``COLUMNS_BLOCK`` at a time. Otherwise (or on damage) the
   window is scanned (``json_scan``: quotes, escapes, nesting; a fresh scanner starts exact at a
   boundary: two levels down, outside any string), the events wholly inside it are parsed in
   batches of ``BATCH_EVENTS`` (``json_salvage``'s batch reader: a batch orjson refuses is split
   down to the event, read by the standard library or counted ``invalid_json``). The unfinished
   event at the window's end starts the next window;
3. the bytes after the array are kept (at most ``MAX_OUTSIDE``) and the keys outside the array are
   parsed once the file ends, with an empty array in its place: ``rest``.

Memory is the window (a block, ``COLUMNS_BLOCK`` for a columnar consumer, plus one unfinished event,
at most ``MAX_EVENT`` bytes), one window's parsed events (or columns), and the keys outside the
array, whatever the file's size. Boundaries are never taken
from the layout alone, so a string holding ``}, {`` or args nested in an event split nothing.
Hand-written over library parts (orjson per window, ``json_scan``'s vectorised scan) because the
streaming parser on hand (ijson) builds events in Python at a fraction of orjson's speed, and
orjson has no streaming mode.

The events are JSON trees: no cycles, each batch freed by reference counting once it is read. The
cyclic garbage collector would walk them again and again while they live (a window's ~10^5
containers survive into the older generations, whose collections walk every object of the
process): on the 1M-event trace of ``benchmarks/kineto_memory.py`` that was about a third of the
time of the read. The reader turns it off while a file's events are read (``gc_paused``) and back
on as it was; the cycles other threads make meanwhile are collected then.

Damage is what ``json_salvage`` makes of a whole document, counted and kept in ``skipped`` and
``bad_rows``: a cut ends the events there (``truncated_json``), a damaged gzip stream keeps what
came before (``damaged_gzip``), nesting past ``max_json_depth`` ends the document where it passes
it (``json_too_deep``), bytes between events that are not a comma and an event that cannot be read
are ``invalid_json`` (the others kept), an event over ``MAX_EVENT`` bytes ends the events there
(``invalid_json``). A damaged file with no event at all is refused (``TraceFormatError``).
"""

from __future__ import annotations

import gc
import re
import zlib
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from aaco.agent.sources.traces.context import BadRow
from aaco.agent.sources.traces.json_salvage import BATCH_EVENTS, LoadedJson, describe_error, loads_lenient, parse_batch
from aaco.agent.sources.traces.json_scan import Brackets, JsonScanner, JsonTooDeepError
from aaco.agent.sources.traces.limits import JsonDepthError, TraceLimits, json_depth_error, open_trace
from aaco.contract.errors import TraceFormatError

BLOCK = 2 << 20  # bytes read at once: a window's events are still in the CPU cache when read (8 MiB: ~25 % slower)
COLUMNS_BLOCK = 16 << 20  # read at once while the consumer reads columns: Arrow's threads and fixed costs want more
MAX_OUTSIDE = 64 << 20  # bytes kept before and after the events array
MAX_EVENT = 256 << 20  # the largest single event
NOT_KINETO = "a Kineto trace is a JSON object with a traceEvents list"
_KEY = re.compile(rb'"traceEvents"\s*:\s*$')
_OPEN, _OBJ = ord("["), ord("{")
_SPACE = b" \t\r\n"
_SNIPPET = 200


class EventStream:
    """One Kineto file's events, batch by batch (``batches``), then the keys outside them (``rest``).

    ``skipped`` and ``bad_rows`` hold the damage found (see the module doc), ``loaded()`` both as
    ``json_salvage`` reports them; complete once ``batches`` is exhausted.
    """

    def __init__(self, path: Path, limits: TraceLimits) -> None:
        self.path = path
        self.limits = limits
        self.rest: dict[str, Any] = {}
        self.skipped: Counter[str] = Counter()
        self.bad_rows: list[BadRow] = []
        self._fh: Any = None
        self._damage: str | None = None  # the gzip damage that ended the stream
        self._too_deep: JsonDepthError | None = None
        self._size = 0  # bytes read
        self._last = b""  # the last bytes read: the snippet of a cut
        self._first = bytearray()  # the first bytes: the message of a document with no event
        self._events = 0
        # The consumer's columnar reader: given a fast-path window's events (whole, commas between; the
        # window's own buffer, to leave as it was), it folds them and says how many, or None to have
        # them handed out as dicts (``kineto_arrow``).
        self.columns: Callable[[memoryview], int | None] | None = None

    def loaded(self) -> LoadedJson:
        """What was lost, as ``json_salvage`` reports it for a whole document."""
        return LoadedJson(self.rest, self.skipped, self.bad_rows)

    def batches(self) -> Iterator[list[Any]]:
        """The events in file order, a window's at a time (at most one window's); ``rest`` is set at the end."""
        with open_trace(self.path, self.limits, json_guard=False) as fh:
            self._fh = fh
            head, start, complete = self._head()
            if start is None:
                self._no_array(head, complete)
                return
            pending = bytes(head[start + 1 :])
            del head[start:]
            array_end, after, complete = yield from self._array(pending, start)
            tail = None
            if array_end is not None:
                tail, complete = self._tail(after, array_end)
            self._finish(head, array_end, tail, complete)

    # --- reading ---------------------------------------------------------------------------------

    def _read(self, size: int | None = None) -> bytes:
        """The next ``size`` bytes (``BLOCK``); b"" at the end, at damage kept in ``_damage``, past the depth limit."""
        if self._damage is not None or self._too_deep is not None:
            return b""
        try:
            block = self._fh.read(size or BLOCK)
        except (EOFError, zlib.error) as exc:
            self._damage = str(exc)
            return b""
        self._size += len(block)
        self._last = (self._last + block[-_SNIPPET:])[-_SNIPPET:]
        if len(self._first) < 1 << 20:
            self._first += block[: (1 << 20) - len(self._first)]
        return block

    def _feed(self, scanner: JsonScanner, block: bytes) -> bytes:
        """``block`` scanned, up to where it nests too deep (the document ends there)."""
        start = scanner.offset
        try:
            scanner.feed(block)
        except JsonTooDeepError as exc:
            if self._too_deep is None:  # a window scanned again meets it again: counted once
                err = self._too_deep = json_depth_error(exc, self.path)
                self.skipped[err.reason] += 1
                self.bad_rows.append(BadRow(exc.offset, err.message.encode(), err.reason))
            return block[: exc.offset - start]
        return block

    def _head(self) -> tuple[bytearray, int | None, bool]:
        """The bytes read until the events array's ``[`` (its offset; None: none) and whether the JSON closed."""
        scanner = JsonScanner(self.limits.max_json_depth, keep=2)
        head = bytearray()
        while len(head) <= MAX_OUTSIDE and (block := self._read()):
            head += self._feed(scanner, block)
            if bytes(head[:4096]).lstrip(_SPACE + b"\xef\xbb\xbf")[:1] not in (b"{", b""):
                raise ValueError(NOT_KINETO)
            at = _array_start(head, scanner.brackets())
            if at is not None:
                return head, at, False
        return head, None, scanner.complete and self._too_deep is None

    def _array(self, pending: bytes, start: int) -> Generator[list[Any], None, tuple[int | None, bytes, bool]]:
        """Hand out the events of the array opened at ``start``.

        Returns (where it closes or None, the bytes read after it, whether the document closed).
        """
        base, prev = start + 1, start  # the window's first byte; the last byte of the last event
        window = bytearray(pending)
        scanner: JsonScanner | None = None
        while True:
            if scanner is None:  # from an event boundary: the fast path, else a scan of the window
                cut = yield from self._fast(window, base, prev == start)
                if cut is not None:
                    prev = cut
                    del window[: cut + 1 - base]
                    base = cut + 1
                    if block := self._read(COLUMNS_BLOCK if self.columns is not None else None):
                        window += block
                        continue
                scanner = _scanner(self.limits, base)
                del window[len(self._feed(scanner, bytes(window))) :]
            starts, stops, array_end = _events(scanner.brackets())
            for lo in range(0, starts.size, BATCH_EVENTS):
                hi = min(lo + BATCH_EVENTS, starts.size)
                self._gap(window, base, prev, int(starts[lo]), prev == start)
                yield self._parse(window, base, starts - base, stops - base, lo, hi)
                prev = int(stops[hi - 1])
            if array_end is not None:
                self._gap(window, base, prev, array_end, True)
                return array_end, bytes(window[array_end + 1 - base :]), False
            if stops.size:  # the next window starts after the last whole event
                del window[: prev + 1 - base]
                base, scanner = prev + 1, None
                continue
            if len(window) > MAX_EVENT:  # an event this large is damage (an unclosed one): the events end
                self.skipped["invalid_json"] += 1
                self.bad_rows.append(BadRow(base, bytes(window[:_SNIPPET]), "invalid_json"))
                return None, b"", True
            if not (block := self._read()):
                return None, b"", self._too_deep is not None
            window += self._feed(scanner, block)

    def _fast(self, window: bytearray, base: int, first: bool) -> Generator[list[Any], None, int | None]:
        """The window's events up to its last ``},{`` in one orjson call; the file offset of their end.

        Exact, not a guess: the window starts at an event boundary, so ``[`` + the bytes + ``]`` parse
        only when the ``}`` closes an event outside any string (a ``},{`` inside a string or nested
        args leaves a string or bracket open: orjson refuses, and the caller scans the window).
        """
        end = _last_boundary(window)
        if end is None:
            return None
        head = bytes(window[:256])
        lead = len(head) - len(head.lstrip(_SPACE))
        if not first:  # after an event: its comma
            if window[lead : lead + 1] != b",":
                return None
            lead += 1
        with memoryview(window) as view, view[lead : end + 1] as raw:
            folded = self.columns(raw) if self.columns is not None else None
            if folded is not None:  # the consumer read them a column at a time: nothing to hand out
                self._events += folded
                return base + end
            try:
                events = orjson.loads(b"[" + raw + b"]")
            except orjson.JSONDecodeError:
                return None
        self._events += len(events)
        yield events
        return base + end

    def _parse(self, window: bytearray, base: int, starts: np.ndarray, stops: np.ndarray, lo: int, hi: int) -> list:
        """Events ``lo:hi`` of the window (``json_salvage``'s batch reader), bad rows at file offsets."""
        out = LoadedJson(None)
        events = parse_batch(memoryview(window), starts, stops, lo, hi, out)
        self.skipped.update(out.skipped)
        self.bad_rows += [r._replace(offset=r.offset + base) for r in out.bad_rows]
        self._events += len(events)
        return events

    def _gap(self, window: bytearray, base: int, prev: int, nxt: int, edge: bool) -> None:
        """The bytes between two events: a comma (nothing between an event and the array's bracket)."""
        gap = bytes(window[max(prev + 1 - base, 0) : nxt - base]).strip(_SPACE)
        if gap != (b"" if edge else b","):
            self.skipped["invalid_json"] += 1
            self.bad_rows.append(BadRow(prev + 1, gap[:_SNIPPET], "invalid_json"))

    def _tail(self, pending: bytes, array_end: int) -> tuple[bytearray | None, bool]:
        """The bytes after the events array (None past ``MAX_OUTSIDE``) and whether the document closed."""
        tail = bytearray()
        scanner = JsonScanner(self.limits.max_json_depth)
        scanner.depth, scanner.offset = 1, array_end + 1
        while pending:
            tail += self._feed(scanner, pending)
            if len(tail) > MAX_OUTSIDE:
                return None, True
            pending = self._read()
        return tail, scanner.complete and self._too_deep is None

    # --- the end ---------------------------------------------------------------------------------

    def _fail(self, message: str) -> TraceFormatError:
        if self._damage is not None:
            message = f"{self._damage}: {message}"
        return TraceFormatError(message, subject=self.path)

    def _cut(self, complete: bool) -> bool:
        """Count a cut document (``truncated_json``) unless the depth limit ended it."""
        if complete or self._too_deep is not None:
            return False
        self.skipped["truncated_json"] += 1
        self.bad_rows.append(BadRow(self._size, self._last, "truncated_json"))
        return True

    def _no_events_error(self, cut: bool) -> Exception:
        if self._too_deep is not None:
            return self._too_deep
        if cut:
            return self._fail(f"truncated JSON: no complete event before the cut at byte {self._size}")
        try:
            orjson.loads(self._first)
        except orjson.JSONDecodeError as exc:
            return self._fail(describe_error(exc))
        return self._fail("invalid JSON")

    def _no_array(self, head: bytearray, complete: bool) -> None:
        """A document with no events array found: not Kineto when it is whole JSON, else its damage."""
        if len(head) > MAX_OUTSIDE:
            raise self._fail(f"no traceEvents array in the first {MAX_OUTSIDE} bytes")
        cut = self._cut(complete)
        if not cut and self._damage is None and self._too_deep is None:
            try:
                orjson.loads(head)
            except orjson.JSONDecodeError:
                pass
            else:
                raise ValueError(NOT_KINETO)
        raise self._no_events_error(cut)

    def _finish(self, head: bytearray, array_end: int | None, tail: bytearray | None, complete: bool) -> None:
        """The keys outside the events, and the damage of the whole document (``json_salvage``'s rules)."""
        cut = self._cut(complete)
        rest = loads_lenient(bytes(head) + b"[]" + bytes(tail)) if tail is not None else None
        if not isinstance(rest, dict):  # the keys after the events are damaged or cut: keep the ones before
            if array_end is not None:
                self.skipped["invalid_json"] += 1
                self.bad_rows.append(BadRow(array_end + 1, bytes((tail or b"")[:_SNIPPET]), "invalid_json"))
            rest = loads_lenient(bytes(head) + b"[]}")
            rest = rest if isinstance(rest, dict) else {}
        if not self._events and (self.skipped or self._damage is not None):
            raise self._no_events_error(cut)
        if self._damage is not None:
            self.skipped["damaged_gzip"] += 1
            self.bad_rows.append(BadRow(self._size, self._damage.encode(), "damaged_gzip"))
        rest.pop("traceEvents", None)
        self.rest = rest


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while the events are read, then as it was (see the module doc)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _scanner(limits: TraceLimits, base: int) -> JsonScanner:
    """A scanner started at an event boundary of the events array: two levels down, outside any string."""
    scanner = JsonScanner(limits.max_json_depth, keep=3)
    scanner.depth, scanner.offset = 2, base
    return scanner


def _last_boundary(window: bytearray) -> int | None:
    """The offset of the ``}`` of the window's last ``},`` followed by an event's ``{`` (or the window's end)."""
    end = len(window)
    for _ in range(16):
        at = window.rfind(b"},", 0, end)
        if at < 0:
            return None
        if window[at + 2 : at + 258].lstrip(_SPACE)[:1] in (b"{", b""):
            return at
        end = at
    return None


def _array_start(head: bytearray, b: Brackets) -> int | None:
    """The offset of the ``[`` of ``"traceEvents":`` one level into the top object, if read yet."""
    for i in np.flatnonzero((b.depth == 2) & (b.byte == _OPEN)):
        at = int(b.pos[i])
        if _KEY.search(bytes(head[max(0, at - 64) : at])):
            return at
    return None


def _events(b: Brackets) -> tuple[np.ndarray, np.ndarray, int | None]:
    """The file offsets of the whole events' first and last bytes, and of the array's ``]`` if seen.

    An event opens a bracket to depth 3 and ends with the bracket back to 2; the array ends at the
    first bracket back to 1 (``json_salvage`` pairs them the same way).
    """
    closes = np.flatnonzero(b.depth <= 1)
    end = int(closes[0]) if closes.size else b.pos.size
    p, d = b.pos[:end], b.depth[:end]
    is_open = (b.byte[:end] | 0x20) == _OBJ
    starts, ends = p[(d == 3) & is_open], p[(d == 2) & ~is_open]
    at = np.searchsorted(ends, starts)
    whole = at < ends.size
    return starts[whole], ends[at[whole]], int(b.pos[end]) if closes.size else None
