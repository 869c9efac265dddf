"""Traces recorded on another boot: an implausible CLOCK_BOOTTIME conversion, found and re-anchored.

rocprofv3 (CSV, JSON, rocpd) and rocprof v1/v2 stamp CLOCK_BOOTTIME, the time since the recording
machine booted. Converted with this host's offset (``boottime_offset``), a file recorded on another
boot, or another machine, lands wherever this host's boot puts it: days in the future, or days
before the file was even written. ``BootClockCheck`` looks at the first chunk that holds events:

- the probe is the file's own anchor (``ParsedTrace.anchor_raw_ns``: rocprofv3 metadata
  ``fini_time``, rocpd ``fini``, else the largest raw end the parser found), else the newest
  event of that chunk, converted with the host offset;
- it is implausible when it lies more than ``FUTURE_SLACK_NS`` (5 min, for coarse or skewed file
  times) after now or after the file's mtime (no event can follow the writing of its file), or
  more than ``PAST_WINDOW_NS`` (1 day) before the mtime (the file was finished long after its
  events: another boot). A same-boot file copied more than a day after it was recorded, without
  keeping its mtime, is re-anchored too: pass an explicit offset for it;
- then the probe is mapped to the file's mtime: ``file-anchor:<format>`` when the file carries an
  anchor, else ``file-mtime`` (the newest event of the first chunk taken as the file's end, which
  puts a long file's later chunks after its mtime: the parsers set an anchor where they can).

Every chunk's times shift by the same amount (kernels' start, end and launch times, iterations'
start and end), a row shifted out of 1990..2100 is counted ``time_out_of_range``, the chunks
record the new ``ClockOffset`` (``sources.json``), and the log says so once per file. An offset
the caller chose (any method but the host's ``boottime-bracket``, e.g. ``--clock-offset``) is
never second-guessed. Times parsers left out with the host offset (out of range there) stay out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import datetime, timezone

import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.registry import TRACE_FORMATS
from aaco.contract.clock import EPOCH_CEIL_NS, EPOCH_FLOOR_NS, INT64_MAX, ClockOffset, fits_int64

log = logging.getLogger("aaco.sources.clock")

HOST_METHOD = "boottime-bracket"  # the host's own offset: the one conversion that may be wrong for a file
FUTURE_SLACK_NS = 5 * 60 * 10**9
PAST_WINDOW_NS = 24 * 3600 * 10**9
ANCHOR_UNCERTAINTY_NS = 10 * 10**9  # a file is written within seconds of its anchor; mtime has its own grain
MAX_HELD = 16  # leading chunks without events held back until the decision (then: no events, no decision)
_KERNEL_TIMES = ("start_ns", "end_ns")
_LAUNCH_TIMES = ("launch_start_ns", "launch_end_ns")


def newest_event_ns(part: ParsedTrace) -> int | None:
    """The latest start or end time of the chunk's kernels and iterations (epoch ns), None without events."""
    found: list[int] = []
    for table in (part.kernels, part.iterations):
        if table.num_rows == 0:
            continue
        for col in _KERNEL_TIMES:
            if col in table.column_names:
                value = pc.max(table[col]).as_py()
                if value is not None:
                    found.append(int(value))
    return max(found) if found else None


def implausible(converted_ns: int, mtime_ns: int, now_ns: int) -> str | None:
    """Why a converted time cannot be right for a file with this mtime (see the module doc), or None."""
    if converted_ns > now_ns + FUTURE_SLACK_NS:
        return "after now"
    if mtime_ns > EPOCH_FLOOR_NS:
        if converted_ns > mtime_ns + FUTURE_SLACK_NS:
            return "after the file was last written"
        if converted_ns < mtime_ns - PAST_WINDOW_NS:
            return "more than a day before the file was last written"
    return None


def _iso(ns: int) -> str:
    try:
        return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="seconds")
    except (OverflowError, OSError, ValueError):
        return f"{ns} ns"


class BootClockCheck:
    """Per file: decide on the first chunk with events, then shift every chunk (see the module doc)."""

    def __init__(self, tf: TraceFile, ctx: TraceContext, now_ns: int | None = None) -> None:
        self.tf = tf
        self.host = ctx.clock
        self.enabled = tf.format in TRACE_FORMATS.boottime and ctx.clock.method == HOST_METHOD
        self.now_ns = now_ns if now_ns is not None else time.time_ns()
        self.clock: ClockOffset | None = None  # the re-anchored offset, once decided
        self._anchor_raw: int | None = None

    def apply(self, parts: Iterator[ParsedTrace]) -> Iterator[ParsedTrace]:
        """``parts`` with their times re-anchored when the host's conversion is implausible."""
        if not self.enabled:
            yield from parts
            return
        held: list[ParsedTrace] = []
        decided = False
        for i, part in enumerate(parts):
            if i == 0:
                self._anchor_raw = part.anchor_raw_ns
            if not decided:
                newest = newest_event_ns(part)
                if newest is None and len(held) < MAX_HELD:
                    held.append(part)
                    continue
                self._decide(newest)
                decided = True
                for h in held:
                    yield self._shift(h)
                held = []
            yield self._shift(part)
        yield from held

    def _decide(self, newest: int | None) -> None:
        anchor = self._anchor_raw
        if anchor is not None and not (anchor > 0 and fits_int64(anchor + self.host.offset_ns)):
            anchor = None
        probe = anchor + self.host.offset_ns if anchor is not None else newest
        mtime = self.tf.mtime_ns
        if probe is None or mtime <= EPOCH_FLOOR_NS:
            return
        why = implausible(probe, mtime, self.now_ns)
        if why is None:
            return
        if anchor is not None:
            offset, method = mtime - anchor, f"file-anchor:{self.tf.format}"
        else:
            offset, method = mtime - (probe - self.host.offset_ns), "file-mtime"
        if not fits_int64(offset) or not fits_int64(offset - self.host.offset_ns):
            return
        self.clock = ClockOffset(offset, ANCHOR_UNCERTAINTY_NS, method)
        log.warning(
            "%s: its CLOCK_BOOTTIME times convert to %s with this host's clock, %s (%s): recorded on another "
            "boot; re-anchored to the file's mtime %s (%s, offset %d ns; --clock-offset overrides)",
            self.tf.path,
            _iso(probe),
            why,
            "the file's anchor" if anchor is not None else "its newest event",
            _iso(mtime),
            method,
            offset,
        )

    def _shift(self, part: ParsedTrace) -> ParsedTrace:
        if self.clock is None:
            return part
        delta = self.clock.offset_ns - part.clock.offset_ns
        part.clock = self.clock
        if delta:
            part.kernels, lost_k = shift_times(part.kernels, delta, _KERNEL_TIMES, _LAUNCH_TIMES)
            part.iterations, lost_i = shift_times(part.iterations, delta, _KERNEL_TIMES, ())
            if lost_k + lost_i:
                part.skipped["time_out_of_range"] += lost_k + lost_i
        return part


def shift_times(
    table: pa.Table, delta: int, required: tuple[str, ...], optional: tuple[str, ...]
) -> tuple[pa.Table, int]:
    """``table`` with ``delta`` added to its time columns, and how many rows that put outside 1990..2100.

    Such rows (a ``required`` time out of range) are left out; an ``optional`` time out of range
    becomes null. Bounds are checked before adding, so nothing wraps.
    """
    if table.num_rows == 0 or not delta:
        return table, 0
    lo = pa.scalar(max(EPOCH_FLOOR_NS - delta, -INT64_MAX - 1), pa.int64())
    hi = pa.scalar(min(EPOCH_CEIL_NS - delta, INT64_MAX), pa.int64())

    def in_range(arr: pa.ChunkedArray) -> pa.ChunkedArray:
        return pc.and_(pc.greater_equal(arr, lo), pc.less(arr, hi))

    keep = None
    for col in required:
        if col in table.column_names:
            ok = pc.fill_null(in_range(table[col]), True)
            keep = ok if keep is None else pc.and_(keep, ok)
    lost = 0
    if keep is not None:
        lost = table.num_rows - pc.sum(keep).as_py()
        if lost:
            table = table.filter(keep)
    step = pa.scalar(delta, pa.int64())
    for col in (*required, *optional):
        if col not in table.column_names:
            continue
        i = table.schema.get_field_index(col)
        arr = table.column(i)
        moved = pc.if_else(in_range(arr), pc.add(arr, step), pa.scalar(None, arr.type))
        table = table.set_column(i, col, moved.cast(arr.type))
    return table, int(lost)
