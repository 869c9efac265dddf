"""Numbers, names and times of Chrome-trace JSON (Kineto, and the rocprof v1 and ONNX Runtime profiles of its shape).

A JSON number can be anything: orjson gives integers in [2**63, 2**64) as Python ints and larger
ones as floats (``1.2e24``), strings hold numbers in rocprof v1, and a damaged file holds NaN-like
text or megabyte names. These helpers read one value each and never raise on bad input:

- ``need_int`` for an integer the event needs (an id it is linked by, its pid, device, stream):
  ``None`` when absent or not a number, ``IntOutOfRangeError`` raised when it does not fit int64, so the
  caller counts the event as ``int_out_of_range`` and leaves it out.
- ``opt_int`` for an integer the event can do without (an op link, grid, bytes): ``None`` when it
  does not fit, counted as ``int_out_of_range`` (the value, not the event, is left out).
- ``num`` for times: a finite float, or ``None`` (``bad_time`` for the caller).
- ``name_ok`` for names: at most ``MAX_NAME_BYTES`` of valid UTF-8.
- ``int_column`` reads a CSV column of decimal text as int64 the same way, vectorised.
- ``span_ns`` converts microsecond times to epoch nanoseconds vectorised and keeps only events that
  land in 1990..2100 (``pipeline.clock.in_epoch_range``): others are ``time_out_of_range``, never
  stored as 1970 or wrapped around int64.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.context import MAX_NAME_BYTES
from aaco.contract.clock import EPOCH_CEIL_NS, EPOCH_FLOOR_NS, fits_int64, in_epoch_range, us_to_ns

INT_OUT_OF_RANGE = "int_out_of_range"
TIME_OUT_OF_RANGE = "time_out_of_range"
NAME_TOO_LONG = "name_too_long"
# Margin around the epoch range for the float pre-check in span_ns: wide enough that float rounding
# never rejects a time inside, narrow enough that the exact int64 arithmetic after it cannot overflow.
_MARGIN_NS = 10**15


class IntOutOfRangeError(ValueError):
    """An integer the event needs does not fit int64."""


def _as_int(v: Any) -> int | None:
    """The integer a JSON value holds (int, integral-or-not float, numeric string), or None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if math.isfinite(v) else None
    if isinstance(v, str):
        s = v.strip()
        try:
            return int(s)
        except ValueError:  # also a string of more digits than int() accepts
            try:
                f = float(s)
            except ValueError:
                return None
            return int(f) if math.isfinite(f) else None
    return None


def need_int(v: Any) -> int | None:
    """An integer the event needs: None when absent or not a number; raises ``IntOutOfRangeError`` beyond int64."""
    n = _as_int(v)
    if n is not None and not fits_int64(n):
        raise IntOutOfRangeError(n)
    return n


def opt_int(v: Any, skipped: Counter[str]) -> int | None:
    """An integer the event can do without: None when absent, not a number, or beyond int64 (counted)."""
    n = _as_int(v)
    if n is not None and not fits_int64(n):
        skipped[INT_OUT_OF_RANGE] += 1
        return None
    return n


def num(v: Any) -> float | None:
    """A time or duration as a finite float; None for a bool, a non-number, NaN or infinity."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int | float):
        try:
            f = float(v)
        except OverflowError:  # an integer beyond any double (only a salvaged document holds one)
            return None
    elif isinstance(v, str):
        try:
            f = float(v)
        except ValueError:
            return None
    else:
        return None
    return f if math.isfinite(f) else None


def name_ok(name: str) -> bool:
    """Whether ``name`` is at most ``MAX_NAME_BYTES`` bytes of valid UTF-8 (no lone surrogates)."""
    if len(name) * 4 <= MAX_NAME_BYTES:  # the common case: short enough whatever its characters
        return name.isascii() or _utf8(name) is not None
    encoded = _utf8(name)
    return encoded is not None and len(encoded) <= MAX_NAME_BYTES


def _utf8(name: str) -> bytes | None:
    try:
        return name.encode("utf-8")
    except UnicodeEncodeError:
        return None


def name_reason(name: str) -> str:
    """Why ``name_ok`` refused ``name``: too long, or not encodable (a lone surrogate)."""
    return "bad_name" if _utf8(name) is None else NAME_TOO_LONG


def span_ns(ts_us: np.ndarray, dur_us: np.ndarray, offset_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Epoch (start, end) ns of events at ``ts_us`` lasting ``dur_us`` after ``offset_ns``, and which land in range.

    The mask is of the events whose start and end lie inside 1990..2100; outside it, start and end are 0.

    The duration is converted on its own, so ``end - start`` is the duration exactly as the trace
    states it, whatever the rounding of a large ``ts``.
    """
    ts = np.asarray(ts_us, dtype=np.float64)
    dur = np.asarray(dur_us, dtype=np.float64)
    n = ts.size
    start = np.zeros(n, dtype=np.int64)
    end = np.zeros(n, dtype=np.int64)
    if not n:
        return start, end, np.zeros(0, dtype=bool)
    with np.errstate(over="ignore", invalid="ignore"):
        approx = float(offset_ns) + ts * 1000.0
        approx_end = approx + dur * 1000.0
    ok = (
        np.isfinite(approx_end)
        & (dur >= 0)
        & (approx > EPOCH_FLOOR_NS - _MARGIN_NS)
        & (approx_end < EPOCH_CEIL_NS + _MARGIN_NS)
    )
    if ok.any():
        s = offset_ns + us_to_ns(ts[ok])
        start[ok] = s
        end[ok] = s + us_to_ns(dur[ok])
    ok &= in_epoch_range(start) & in_epoch_range(end)
    start[~ok] = 0
    end[~ok] = 0
    return start, end, ok


_INT64_MAX_DIGITS = str((1 << 63) - 1)


def int_column(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Decimal text (a CSV column read as strings) as int64, vectorised: (values, valid, beyond int64, not a number).

    An empty cell is none of the three masks (a missing value); values are 0 where not valid. pyarrow's
    own cast would fail the whole column on one value beyond int64, so the range is checked on the
    digits first (same-length digit strings compare like their numbers).
    """
    text = pc.utf8_trim_whitespace(col)
    text = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    n = len(text)
    is_int = bool_mask(pc.match_substring_regex(text, r"^[+-]?[0-9]+$"))
    empty = bool_mask(pc.equal(pc.utf8_length(text), 0))
    digits = pc.replace_substring_regex(text, r"^[+-]?0*", "")
    length = np.asarray(pc.utf8_length(digits).to_numpy(zero_copy_only=False))
    small = bool_mask(pc.less_equal(digits, _INT64_MAX_DIGITS))
    negative_min = bool_mask(pc.equal(text, "-9223372036854775808"))
    fits = (length < 19) | ((length == 19) & small) | negative_min
    valid = is_int & fits
    values = np.zeros(n, dtype=np.int64)
    if valid.any():
        clean = pc.replace_substring_regex(text, r"^\+", "")
        values = np.asarray(
            pc.cast(pc.if_else(pa.array(valid), clean, "0"), pa.int64()).to_numpy(zero_copy_only=False), np.int64
        )
    return values, valid, is_int & ~fits, ~is_int & ~empty


def bool_mask(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean Arrow array as a numpy mask, null as False."""
    return np.asarray(pc.fill_null(arr, False).to_numpy(zero_copy_only=False), dtype=bool)
