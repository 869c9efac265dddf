"""Unsigned 64-bit values of the rocprofiler-sdk family (rocprofv3 JSON and CSV, rocpd), read in full.

rocprofiler-sdk writes agent, queue and stream handles, hive ids, kernel and code-object ids,
correlation ids and timestamps as ``uint64``: values at or above 2^63 are ordinary on real GPUs.
The three parsers share one convention:

- A value is kept when it is an integer in [-2^63, 2^64): its 64 bits. Where events are joined
  or mapped (agent handle -> device, correlation id -> launch) the unsigned value is used, as a
  Python int in [0, 2^64) or a numpy ``uint64`` array (``U64_MASK`` folds a negative int onto the
  same bits). The ``kernels`` schema's ``int64`` columns (``correlation_id``, ``queue_id``,
  ``stream``, ...) store a value at or above 2^63 as the ``int64`` with the same 64 bits
  (``value - 2^64``), so equal ids stay equal and joins on the stored columns still work; read
  such a column back with ``.view(np.uint64)`` to see the unsigned id.
- A value that does not fit 64 bits at all (2^64 + 5, 2^80, ``1e999``) in a field a row needs is
  ``OUT_OF_RANGE``: the row is skipped and counted ``int_out_of_range``. A field no row needs
  (``hive_id``, code-object ids, anything unknown) is never converted, whatever it holds.
- Timestamps are raw CLOCK_BOOTTIME ``uint64`` ns. ``TimeWindow`` says which raw times convert,
  with the trace's clock offset, into epoch times inside 1990..2100 (``clock.in_epoch_range``);
  the others are counted ``time_out_of_range`` and left out. Raw times at or above 2^63 never
  pass (2^63 ns is 292 years of uptime), so a kept raw time is a non-negative ``int64``.

``NumberGuard`` protects ijson's C backend: without ``use_float`` it turns numbers into Python
ints and ``Decimal`` values, and an integer of more than 4300 digits or an exponent of 19 digits
crashes the whole process (a segmentation fault, not an exception) in ijson 3.6.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from decimal import Decimal
from typing import IO, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.contract.clock import EPOCH_CEIL_NS, EPOCH_FLOOR_NS

U64_MASK: Final = (1 << 64) - 1
INT64_MIN: Final = -(1 << 63)
TWO_63: Final = 1 << 63
# Digits of the largest Decimal exponent turned into an int (a uint64 has 20 digits).
_MAX_EXP_DIGITS = 20


class _OutOfRange:
    """The type of ``OUT_OF_RANGE``: an integer that does not fit 64 bits."""

    def __repr__(self) -> str:
        return "OUT_OF_RANGE"


OUT_OF_RANGE: Final = _OutOfRange()


def as_int(v: Any) -> int | _OutOfRange | None:
    """A JSON or SQLite value as a Python int (any size), ``OUT_OF_RANGE`` past 1e20, None if not a number.

    ``Decimal`` and float values (non-integers, exponents) are truncated toward zero, as C casts do;
    ``1e999`` is ``OUT_OF_RANGE`` without building a 1000-digit int. Strings are not numbers here.
    """
    if type(v) is int:
        return v
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return int(v)
    if isinstance(v, Decimal):
        if not v.is_finite():
            return None
        return OUT_OF_RANGE if v.adjusted() > _MAX_EXP_DIGITS else int(v)
    if isinstance(v, float):
        if math.isnan(v):
            return None
        return OUT_OF_RANGE if abs(v) >= 1e20 else int(v)
    return None


def u64(v: Any) -> int | _OutOfRange | None:
    """The unsigned 64-bit value of ``v`` (a negative int folds onto its bits), ``OUT_OF_RANGE``, or None."""
    i = as_int(v)
    if i is None or i is OUT_OF_RANGE:
        return i
    if INT64_MIN <= i <= U64_MASK:  # type: ignore[operator]
        return i & U64_MASK  # type: ignore[operator]
    return OUT_OF_RANGE


def u64_array(values: list[Any]) -> tuple[np.ndarray, np.ndarray | None]:
    """``uint64`` array of unsigned values or None (as ``u64`` gives them), and the mask of present ones.

    The mask is None when every value is present (the common case, one C-speed conversion).
    """
    try:
        return np.array(values, dtype=np.uint64), None
    except (TypeError, OverflowError):
        pass
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    return np.array([0 if v is None else v for v in values], dtype=np.uint64), valid


def int64_column(values: list[Any]) -> pa.Array:
    """An ``int64`` column of unsigned values or None: values at or above 2^63 keep their 64 bits."""
    arr, valid = u64_array(values)
    return pa.array(arr.view(np.int64), pa.int64(), mask=None if valid is None else ~valid)


def signed(v: int) -> int:
    """The int64 with the same 64 bits as the unsigned ``v`` (what the int64 columns store)."""
    return v - (1 << 64) if v >= TWO_63 else v


class TimeWindow:
    """Raw (BOOTTIME) times that convert with ``offset_ns`` into epoch times inside 1990..2100.

    ``lo <= start`` and ``end < hi`` (raw ns) is the whole test; both bounds lie in [0, 2^63].
    """

    def __init__(self, offset_ns: int) -> None:
        self.offset_ns = offset_ns
        self.lo = min(max(0, EPOCH_FLOOR_NS - offset_ns), TWO_63)
        self.hi = min(max(0, EPOCH_CEIL_NS - offset_ns), TWO_63)

    def contains(self, start: int, end: int) -> bool:
        """Whether a raw (start, end) pair, ``0 <= start <= end``, converts inside the epoch range."""
        return self.lo <= start and end < self.hi

    def reason(self, start: int | _OutOfRange | None, end: int | _OutOfRange | None) -> str | None:
        """Why a raw (start, end) pair of ``as_int`` values cannot be kept, or None if it can.

        ``missing_value``, ``int_out_of_range`` (beyond 64 bits), ``bad_time`` (negative, or end
        before start), ``time_out_of_range`` (converts outside 1990..2100), in that order.
        """
        if start is None or end is None:
            return "missing_value"
        if start is OUT_OF_RANGE or end is OUT_OF_RANGE:
            return "int_out_of_range"
        if not (INT64_MIN <= start <= U64_MASK and INT64_MIN <= end <= U64_MASK):  # type: ignore[operator]
            return "int_out_of_range"
        if start < 0 or end < start:  # type: ignore[operator]
            return "bad_time"
        if not (self.lo <= start and end < self.hi):  # type: ignore[operator]
            return "time_out_of_range"
        return None

    def mask(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """``contains`` over ``uint64`` arrays."""
        return (start >= np.uint64(self.lo)) & (end < np.uint64(self.hi))

    def keep(self, start: np.ndarray, end: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, Counter[str]]:
        """``reason`` over ``uint64`` arrays (``present``: both times given): the pairs kept, why the others not."""
        bad = present & (end < start)
        out = present & ~bad & ~self.mask(start, end)
        why = Counter(
            {"missing_value": int((~present).sum()), "bad_time": int(bad.sum()), "time_out_of_range": int(out.sum())}
        )
        return present & ~bad & ~out, +why


def u64_values(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A ``uint64`` column as numpy values (0 where null) and whether each is present."""
    return pc.fill_null(col, 0).to_numpy(), pc.is_valid(col).to_numpy()


# --- the guard in front of ijson's C backend -----------------------------------------------------

_NUM_CHARS = b"0123456789.eE+-"
# A run of number characters longer than this is rewritten whatever it holds (bounds the carry).
MAX_NUMBER_BYTES = 1024
# Digits in a row that make a number dangerous: below Python's smallest int_max_str_digits (640).
MAX_DIGITS = 600
MAX_EXPONENT_DIGITS = 15
# Digits (and the point) fold to "0", exponent letters and signs to "e": a long exponent, signed
# or not, then reads "e000..." (so does a long negative number: a false alarm, checked in full).
_FOLD = bytes.maketrans(b"0123456789.eE+-", b"00000000000eeee")
_LONG_DIGITS = b"0" * (MAX_DIGITS + 1)
_LONG_EXPONENT = b"e" + b"0" * (MAX_EXPONENT_DIGITS + 1)
_TOKEN = re.compile(rb"[-+.0-9eE]{%d,}" % (MAX_EXPONENT_DIGITS + 2))
_DANGER = re.compile(rb"[0-9]{%d}|[eE][-+]?[0-9]{%d}" % (MAX_DIGITS + 1, MAX_EXPONENT_DIGITS + 1))


def _replacement(token: bytes) -> bytes:
    """Same length, never a quote or backslash: ``1e999`` (out of every range) padded with spaces."""
    return (b"-1e999" if token.startswith(b"-") else b"1e999").ljust(len(token), b" ")


def _defuse(data: bytes) -> bytes:
    """``data`` with every dangerous run of number characters rewritten (same length)."""
    folded = data.translate(_FOLD)
    if _LONG_DIGITS not in folded and _LONG_EXPONENT not in folded:
        return data  # the common case: one translate and two C searches per block

    def fix(m: re.Match[bytes]) -> bytes:
        tok = m.group(0)
        return _replacement(tok) if len(tok) > MAX_NUMBER_BYTES or _DANGER.search(tok) else tok

    return _TOKEN.sub(fix, data)


class NumberGuard:
    """A read-only binary stream over ``raw`` in which numbers ijson cannot convert safely are ``1e999``.

    A run of number characters holding more than ``MAX_DIGITS`` digits in a row or an exponent
    of more than ``MAX_EXPONENT_DIGITS`` digits, or longer than ``MAX_NUMBER_BYTES``, becomes
    ``1e999`` (``-1e999``) padded with spaces to the same length: still valid JSON where it was
    a number, never a quote where it was inside a string, and every byte offset unchanged. The
    parsers read ``1e999`` as out of range (``as_int``). Blocks are checked with one
    ``bytes.translate`` and two substring searches, about 1 ms per MB.
    """

    BLOCK = 1 << 20

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._buf = b""
        self._off = 0
        self._served = 0
        self._carry = b""  # number characters at the end of the last block (the run may go on)
        self._killing = False  # inside a run already rewritten: its further characters become spaces
        self._eof = False

    def _fill(self) -> None:
        # read1: one step of the source at a time, so a gzip stream cut short still hands on every
        # byte decompressed before the cut (read(n) would drop the whole step with the error).
        read = getattr(self._raw, "read1", self._raw.read)
        block = read(self.BLOCK)
        if not block:
            self._eof = True
            self._buf, self._off = _defuse(self._carry), 0
            self._carry = b""
            return
        head = b""
        if self._killing:
            rest = block.lstrip(_NUM_CHARS)
            head = b" " * (len(block) - len(rest))
            self._killing = not rest
            block = rest
        data = self._carry + block
        body = data.rstrip(_NUM_CHARS)
        tail = data[len(body) :]
        if len(tail) > MAX_NUMBER_BYTES:  # a run this long is rewritten now, and the rest of it as it comes
            self._carry, self._killing = b"", True
            out = _defuse(body) + _replacement(tail)
        else:
            self._carry = tail
            out = _defuse(body)
        self._buf, self._off = head + out, 0

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left when ``n`` < 0); b"" at the end."""
        while self._off >= len(self._buf) and not self._eof:
            self._fill()
        if n < 0:
            parts = [self._buf[self._off :]]
            while not self._eof:
                self._fill()
                parts.append(self._buf)
            self._buf, self._off = b"", 0
            out = b"".join(parts)
        else:
            out = self._buf[self._off : self._off + n]
            self._off += len(out)
        self._served += len(out)
        return out

    def tell(self) -> int:
        """Bytes handed out so far: the offset in the (decompressed) file."""
        return self._served


# --- Arrow columns -------------------------------------------------------------------------------


class U64Column:
    """An integer column read as 64-bit patterns (from ``int64``, ``uint64`` or ``decimal128`` CSV types).

    ``bits`` (int64, 0 where not valid) are the 64 bits of each value; ``valid`` marks present
    values that fit 64 bits; ``over`` present values that do not; ``negative`` values below zero
    as written (a uint64 column has none). ``unsigned`` views the bits as ``uint64``.
    """

    def __init__(self, col: pa.Array | pa.ChunkedArray) -> None:
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        self.source = col
        n = len(col)
        present = np.ones(n, dtype=bool) if not col.null_count else ~np.asarray(col.is_null(), dtype=bool)
        t = col.type
        self.over = np.zeros(n, dtype=bool)
        if pa.types.is_integer(t):
            raw = np.asarray((col.fill_null(0) if col.null_count else col).to_numpy(zero_copy_only=False))
            self.bits = raw.view(np.int64) if raw.dtype == np.uint64 else raw.astype(np.int64, copy=False)
            self.negative = self.bits < 0 if pa.types.is_signed_integer(t) else np.zeros(n, dtype=bool)
        elif pa.types.is_decimal(t):  # rare: a column that mixes negatives with values past int64
            self.bits = np.zeros(n, dtype=np.int64)
            self.negative = np.zeros(n, dtype=bool)
            for k, v in enumerate(col.to_pylist()):
                if v is None:
                    continue
                x = int(v)
                if INT64_MIN <= x <= U64_MASK:
                    self.bits[k] = signed(x & U64_MASK)
                    self.negative[k] = x < 0
                else:
                    self.over[k] = True
            present &= ~self.over
        else:
            self.bits = np.zeros(n, dtype=np.int64)
            self.negative = np.zeros(n, dtype=bool)
            present[:] = False
        self.valid = present

    @property
    def unsigned(self) -> np.ndarray:
        """The values as ``uint64`` (for joins, maps and time windows)."""
        return self.bits.view(np.uint64)

    def arrow(self, keep: np.ndarray | None = None) -> pa.Array:
        """The ``int64`` column the kernels schema stores (same 64 bits), of the rows ``keep`` selects."""
        if self.source.type == pa.int64():  # the fast path: the column as pyarrow read it
            return self.source if keep is None else self.source.filter(pa.array(keep))
        bits, valid = (self.bits, self.valid) if keep is None else (self.bits[keep], self.valid[keep])
        return pa.array(bits, pa.int64(), mask=None if valid.all() else ~valid)
