"""Vectorised CSV decoding that keeps the good rows around bad ones and says where the bad ones are.

The fast path is one ``pyarrow.csv.read_csv`` over a chunk of complete lines with every column
typed up front (no inference). It fails as a whole on a single bad row (a wrong column count, a
value that is not a number, invalid UTF-8), so only then the slow path runs:

1. split the chunk into lines (offsets kept) and set aside lines that cannot be rows at all: a
   repeated header (dropped silently), and, when the caller knows what the first column of every
   row starts with, anything else (binary junk, a line cut at its start);
2. bisect the remaining lines: parse a run of lines with pyarrow; when it fails, parse each half;
   a single line that fails is a bad row, with pyarrow's message as the reason. Good lines always
   go through pyarrow, so types are identical on both paths, and the work is about
   ``n * log2(bad rows)`` bytes parsed instead of a per-row Python loop.

Rows that parse but are wrong (a check of the caller, e.g. end before start) are removed with
``CsvChunk.reject``; the row-to-line map needed to report them is only built when that happens.

Integers beyond int64: the columns a caller names ``widen`` start as ``int64`` (the fast path)
and are widened when a value does not fit, before any slow path: to ``uint64`` for a value in
[2^63, 2^64) (rocprofiler-sdk's ids and handles), to ``decimal128(38, 0)`` for a negative value
in a ``uint64`` column or a value of up to 38 digits beyond that. pyarrow names the failing column
and value, so each widening costs one failed parse, once per reader (a widened type stays for
later chunks). ``u64.arrow_u64`` turns any of the three into 64-bit patterns; a value
longer than 38 digits makes its row a bad row counted ``int_out_of_range``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from aaco.agent.sources.traces.context import BadRow

_ARROW_REASONS = (
    (re.compile(r"Expected \d+ columns?, got \d+"), "column_count"),
    (re.compile(r"invalid value '[-+]?\d+'|Error converting '[-+]?\d+' to decimal"), "int_out_of_range"),
    (re.compile(r"invalid UTF8"), "bad_encoding"),
    (re.compile(r"conversion error"), "bad_value"),
)
SMALL_SEGMENT = 1  # a run of this many lines that still fails is reported line by line
U64 = pa.uint64()
WIDE = pa.decimal128(38, 0)
_CONTENT = re.compile(rb"[^\r\n]")
_INT_FAILURE = re.compile(
    r"In CSV column #(\d+): CSV conversion error to (int64|uint64): invalid value '([-+]?\d{1,38})'"
)


def arrow_reason(exc: Exception) -> str:
    """A short reason for a pyarrow CSV error (for counters: few distinct values)."""
    text = str(exc)
    for pattern, reason in _ARROW_REASONS:
        if pattern.search(text):
            return reason
    return "unparsable"


@dataclass
class CsvChunk:
    """Rows decoded from one chunk: the table, the bad rows, and a way back from rows to lines."""

    table: pa.Table
    bad_rows: list[BadRow] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    _row_lines: Callable[[], tuple[np.ndarray, list[bytes]]] | None = None

    def reject(self, mask: np.ndarray | pa.Array, reason: str) -> None:
        """Drop the rows where ``mask`` is true, reporting each as a bad row for ``reason``."""
        if isinstance(mask, pa.Array | pa.ChunkedArray):
            mask = np.asarray(pc.fill_null(mask, True).to_numpy(zero_copy_only=False), dtype=bool)
        if not mask.any():
            return
        idx = np.flatnonzero(mask)
        if self._row_lines is not None:
            offsets, lines = self._row_lines()
            self.bad_rows += [BadRow(int(offsets[i]), lines[i], reason) for i in idx]
        self.skipped[reason] += int(idx.size)
        keep = ~mask
        self.table = self.table.filter(pa.array(keep))
        if self._row_lines is not None:
            get = self._row_lines
            cache: list[tuple[np.ndarray, list[bytes]]] = []

            def remaining() -> tuple[np.ndarray, list[bytes]]:
                if not cache:
                    offs, lns = get()
                    cache.append((offs[keep], [ln for ln, k in zip(lns, keep, strict=True) if k]))
                return cache[0]

            self._row_lines = remaining


def count_rows(data: bytes) -> int:
    """How many non-empty lines ``data`` holds (what pyarrow reads as rows when nothing is damaged)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    nl = np.flatnonzero(arr == 10)
    ends = np.append(nl, arr.size) if (arr.size and arr[-1] != 10) else nl
    starts = np.empty_like(ends)
    if ends.size:
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    length = ends - starts
    has_cr = np.zeros(ends.size, dtype=bool)
    nonzero = length > 0
    has_cr[nonzero] = arr[ends[nonzero] - 1] == 13
    empty = (length == 0) | ((length == 1) & has_cr)
    return int(ends.size - np.count_nonzero(empty))


def split_lines(data: bytes, base_offset: int) -> tuple[list[bytes], np.ndarray]:
    """The lines of ``data`` (without the newline and a trailing carriage return) and their file offsets."""
    raw = data.split(b"\n")
    if raw and raw[-1] == b"":
        raw.pop()
    lens = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
    starts = np.zeros(len(raw), dtype=np.int64)
    if len(raw) > 1:
        np.cumsum(lens[:-1] + 1, out=starts[1:])
    lines = [ln[:-1] if ln.endswith(b"\r") else ln for ln in raw]
    return lines, starts + base_offset


class CsvRowReader:
    """Reads chunks of complete CSV lines of one known header into typed Arrow tables."""

    def __init__(
        self,
        names: list[str],
        types: dict[str, pa.DataType],
        *,
        row_prefixes: tuple[bytes, ...] = (),
        header_line: bytes = b"",
        widen: tuple[str, ...] = (),
    ) -> None:
        self.names = names
        self.types = dict(types)
        self.row_prefixes = row_prefixes
        self.header_line = header_line.rstrip(b"\r\n")
        self.widen = frozenset(c for c in widen if c in types)
        self._read_opts = pacsv.ReadOptions(column_names=names, block_size=1 << 22)
        self._parse_opts = pacsv.ParseOptions(newlines_in_values=False)
        self._convert()

    def _convert(self) -> None:
        self._convert_opts = pacsv.ConvertOptions(
            column_types=self.types,
            include_columns=list(self.types),
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )

    def _widened(self, exc: Exception) -> bool:
        """Widen the column an integer did not fit (see the module doc); False if that is not the failure."""
        m = _INT_FAILURE.search(str(exc))
        if m is None:
            return False
        idx, typ, value = int(m.group(1)), m.group(2), int(m.group(3))
        name = self.names[idx] if idx < len(self.names) else None
        if name not in self.widen:
            return False
        self.types[name] = U64 if typ == "int64" and 0 <= value <= 0xFFFFFFFFFFFFFFFF else WIDE
        self._convert()
        return True

    def empty(self) -> pa.Table:
        """A table with the typed columns and no rows."""
        return pa.table({n: pa.array([], t) for n, t in self.types.items()})

    def _parse(self, data: bytes) -> pa.Table:
        return pacsv.read_csv(
            pa.BufferReader(data),
            read_options=self._read_opts,
            parse_options=self._parse_opts,
            convert_options=self._convert_opts,
        )

    def read(self, data: bytes, base_offset: int) -> CsvChunk:
        """Decode ``data`` (complete lines, no partial last line) found at ``base_offset`` in the file."""
        if _CONTENT.search(data) is None:  # only line ends (a search, not a stripped 8 MB copy)
            return CsvChunk(self.empty())
        while True:
            try:
                table = self._parse(data)
                break
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                if not self._widened(exc):  # at most two widenings per column in a reader's life
                    return self._read_slow(data, base_offset)
        lines = data.count(b"\n") + (0 if data.endswith(b"\n") else 1)  # one pass at memory speed
        if table.num_rows != lines and table.num_rows != count_rows(data):  # (empty lines) or joined lines
            return self._read_slow(data, base_offset)

        def row_lines() -> tuple[np.ndarray, list[bytes]]:
            lines, offsets = split_lines(data, base_offset)
            nonempty = [i for i, ln in enumerate(lines) if ln]
            return offsets[nonempty], [lines[i] for i in nonempty]

        return CsvChunk(table, _row_lines=row_lines)

    def _read_slow(self, data: bytes, base_offset: int) -> CsvChunk:
        lines, offsets = split_lines(data, base_offset)
        bad: list[BadRow] = []
        skipped: Counter[str] = Counter()
        candidates: list[int] = []
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            if self.header_line and line == self.header_line:
                continue  # a header written again (a restarted writer): not an event, not damage
            if self.row_prefixes and not line.startswith(self.row_prefixes):
                bad.append(BadRow(int(offsets[i]), line, "not_a_row"))
                skipped["not_a_row"] += 1
                continue
            candidates.append(i)
        while True:  # again after a widening, so that every piece has the final types (bounded: see _widened)
            types = dict(self.types)
            pieces: list[tuple[pa.Table, list[int]]] = []
            found: list[BadRow] = []
            counts: Counter[str] = Counter()
            self._bisect(lines, offsets, candidates, pieces, found, counts)
            if types == self.types:
                break
        bad += found
        skipped += counts
        if pieces:
            table = pa.concat_tables([p[0] for p in pieces]) if len(pieces) > 1 else pieces[0][0]
            row_idx = [i for p in pieces for i in p[1]]
        else:
            table, row_idx = self.empty(), []
        bad.sort(key=lambda b: b.offset)

        def row_lines() -> tuple[np.ndarray, list[bytes]]:
            return offsets[row_idx] if row_idx else np.zeros(0, np.int64), [lines[i] for i in row_idx]

        return CsvChunk(table, bad, skipped, row_lines)

    def _bisect(
        self,
        lines: list[bytes],
        offsets: np.ndarray,
        idx: list[int],
        pieces: list[tuple[pa.Table, list[int]]],
        bad: list[BadRow],
        skipped: Counter[str],
    ) -> None:
        # Iterative (an explicit stack) so that a chunk of many bad lines cannot exhaust recursion.
        stack = [idx] if idx else []
        done: list[tuple[int, pa.Table, list[int]]] = []
        while stack:
            part = stack.pop()
            try:
                table = self._parse(b"\n".join(lines[i] for i in part) + b"\n")
                reason = None if table.num_rows == len(part) else "line_break_in_row"
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                if self._widened(exc):
                    stack.append(part)
                    continue
                reason = arrow_reason(exc)
            if reason is None:
                done.append((part[0], table, part))
            elif len(part) <= SMALL_SEGMENT:
                # A row is a line: one that pyarrow reads as more or fewer rows (a quote left open,
                # a carriage return inside) is as damaged as one it cannot read.
                bad.append(BadRow(int(offsets[part[0]]), lines[part[0]], reason))
                skipped[reason] += 1
            else:
                mid = len(part) // 2
                stack.append(part[mid:])
                stack.append(part[:mid])
        done.sort(key=lambda d: d[0])
        pieces += [(t, rows) for _, t, rows in done]
