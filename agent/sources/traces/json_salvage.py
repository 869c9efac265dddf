"""A Chrome-trace JSON document (ONNX Runtime, Kineto, rocprof v1), kept event by event when it is damaged.

``load_json`` parses the document with orjson. When orjson refuses it (a cut, a flipped byte, or a
value orjson does not take: ``1e999``, ``NaN``, a lone surrogate, bytes that are not UTF-8),
``json_scan`` finds the events array (the document itself, or ``traceEvents``) and each event's
bytes, and the events are parsed in batches with orjson, a failing batch split in halves down to
the single events: an event orjson refuses is read by the standard library (non-finite numbers
become null, broken text is replaced), one neither reads is counted ``invalid_json`` and left
out, and the good events around it are kept. The rest of the document (Kineto's
``baseTimeNanoseconds``, rocprof's ``otherData``) is parsed with an empty events array in place.

A document that ends with brackets or a string still open was cut short: ``truncated_json``, the
events before the cut kept. Anything else is invalid JSON, reported as such with its byte offset,
never called truncated. A document nested deeper than ``max_json_depth`` ends where it passes the
limit (``json_too_deep``, the events before kept; found by the scan, never by a parser whose memory
grows with depth); with no event before that point it is refused (``JsonDepthError``).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from aaco.agent.sources.traces.context import BadRow
from aaco.agent.sources.traces.json_scan import JsonScanner, JsonTooDeepError
from aaco.agent.sources.traces.limits import Document, TraceLimitError, TraceLimits, json_depth_error
from aaco.contract.errors import TraceFormatError

SCAN_BLOCK = 16 << 20
BATCH_EVENTS = 4096  # events parsed by one orjson call
_TRACE_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*$')
_SNIPPET = 200


@dataclass
class LoadedJson:
    """The document (salvaged when damaged), and what was lost: counts by reason and the bad spots."""

    doc: Any
    skipped: Counter[str] = field(default_factory=Counter)
    bad_rows: list[BadRow] = field(default_factory=list)


def load_json(document: Document, path: Path, limits: TraceLimits) -> LoadedJson:
    """Parse a whole Chrome-trace JSON file's content (see the module doc)."""
    data = document.data
    try:
        if document.damage is None:
            return LoadedJson(orjson.loads(data))
        error = "the file is damaged"
    except orjson.JSONDecodeError as exc:
        error = describe_error(exc)
    try:
        out = _salvage(memoryview(data), path, limits, error)
    except TraceLimitError:
        raise
    except TraceFormatError as exc:
        if document.damage is None:
            raise
        raise TraceFormatError(f"{document.damage}: {exc.message}", subject=path) from None
    if document.damage is not None:
        out.skipped["damaged_gzip"] += 1
        out.bad_rows.append(BadRow(len(data), document.damage.encode(), "damaged_gzip"))
    return out


def describe_error(exc: orjson.JSONDecodeError) -> str:
    """The message of an orjson error with its byte offset (orjson counts characters)."""
    try:
        at = len(exc.doc[: exc.pos].encode("utf-8", "surrogatepass"))
    except (AttributeError, TypeError):
        at = exc.pos
    return f"invalid JSON at byte {at}: {exc.msg}"


def _salvage(data: memoryview, path: Path, limits: TraceLimits, error: str) -> LoadedJson:
    scanner = JsonScanner(limits.max_json_depth, keep=3)
    out = LoadedJson(None)
    try:
        for i in range(0, len(data), SCAN_BLOCK):
            scanner.feed(data[i : i + SCAN_BLOCK])
    except JsonTooDeepError as exc:  # the document ends there: the events before it are kept
        too_deep = json_depth_error(exc, path)
        data = data[: exc.offset]
        out.skipped[too_deep.reason] += 1
        out.bad_rows.append(BadRow(exc.offset, too_deep.message.encode(), too_deep.reason))
        error, cut = too_deep.message, True
    else:
        too_deep, cut = None, not scanner.complete
        if cut:
            out.skipped["truncated_json"] += 1
            out.bad_rows.append(BadRow(len(data), bytes(data[-_SNIPPET:]), "truncated_json"))
    b = scanner.brackets()
    top = _first_non_space(data)
    if top == ord("["):
        level, array_open = 1, 0
        found = b.pos.size > 0 and b.byte[0] == ord("[")
    elif top == ord("{"):
        level, array_open, found = 2, 0, False
        for i in np.flatnonzero((b.depth == 2) & (b.byte == ord("["))):
            at = int(b.pos[i])
            if _TRACE_EVENTS_KEY.search(bytes(data[max(0, at - 64) : at])):
                array_open, found = int(i), True
                break
    else:
        found = False
    if not found and too_deep is not None:
        raise too_deep
    if not found:
        raise TraceFormatError(_no_events(error, cut, len(data)), subject=path)
    events, array_end = _events(data, b.pos, b.depth, array_open, level, out)
    if not events and too_deep is not None:
        raise too_deep
    if not events:
        raise TraceFormatError(_no_events(error, cut, len(data)), subject=path)
    if level == 1:
        out.doc = events
        return out
    start = int(b.pos[array_open])
    head = bytes(data[:start]) + b"[]"
    rest = loads_lenient(head + bytes(data[array_end + 1 :])) if array_end is not None else _INVALID
    if not isinstance(rest, dict):  # the keys after the events are damaged or cut: keep the ones before
        if array_end is not None:
            out.skipped["invalid_json"] += 1
            out.bad_rows.append(
                BadRow(array_end + 1, bytes(data[array_end + 1 : array_end + 1 + _SNIPPET]), "invalid_json")
            )
        rest = loads_lenient(head + b"}")
        rest = rest if isinstance(rest, dict) else {}
    rest["traceEvents"] = events
    out.doc = rest
    return out


def _no_events(error: str, cut: bool, size: int) -> str:
    if cut:
        return f"truncated JSON: no complete event before the cut at byte {size}"
    return error


def _first_non_space(data: memoryview) -> int | None:
    head = bytes(data[:4096]).lstrip(b" \t\r\n\xef\xbb\xbf")
    return head[0] if head else None


def _events(
    data: memoryview, pos: np.ndarray, depth: np.ndarray, array_open: int, level: int, out: LoadedJson
) -> tuple[list[Any], int | None]:
    """The events of the array opened by bracket ``array_open`` (at depth ``level``), and where it closes.

    An event opens a bracket to ``level + 1`` and its end closes back to ``level``; the array ends
    at the first bracket back to ``level - 1`` (None: cut before it).
    """
    closes = np.flatnonzero(depth[array_open + 1 :] == level - 1)
    end_idx = array_open + 1 + int(closes[0]) if closes.size else pos.size
    array_end = int(pos[end_idx]) if closes.size else None
    p, d = pos[array_open + 1 : end_idx], depth[array_open + 1 : end_idx]
    is_open = _is_open(data, p)
    starts = p[(d == level + 1) & is_open]
    ends = p[(d == level) & ~is_open]
    at = np.searchsorted(ends, starts)
    starts = starts[at < ends.size]
    stops = ends[at[at < ends.size]]
    events: list[Any] = []
    for lo in range(0, starts.size, BATCH_EVENTS):
        events += parse_batch(data, starts, stops, lo, min(lo + BATCH_EVENTS, starts.size), out)
    return events, array_end


def _is_open(data: memoryview, p: np.ndarray) -> np.ndarray:
    a = np.frombuffer(data, dtype=np.uint8)
    return (a[p] | 0x20) == ord("{")


def parse_batch(
    data: memoryview, starts: np.ndarray, stops: np.ndarray, lo: int, hi: int, out: LoadedJson
) -> list[Any]:
    """Events ``lo:hi`` parsed with one orjson call, or split in halves where that fails."""
    s, e = int(starts[lo]), int(stops[hi - 1]) + 1
    if hi - lo > 1:
        try:
            got = orjson.loads(b"[" + bytes(data[s:e]) + b"]")
            if isinstance(got, list) and len(got) == hi - lo:
                return got
        except orjson.JSONDecodeError:
            pass
        mid = (lo + hi) // 2
        left = parse_batch(data, starts, stops, lo, mid, out)
        gap_at = int(stops[mid - 1]) + 1
        if bytes(data[gap_at : int(starts[mid])]).strip(b" \t\r\n") != b",":
            out.skipped["invalid_json"] += 1
            out.bad_rows.append(BadRow(gap_at, bytes(data[gap_at : gap_at + _SNIPPET]), "invalid_json"))
        return left + parse_batch(data, starts, stops, mid, hi, out)
    value = loads_lenient(bytes(data[s:e]))
    if value is _INVALID:
        out.skipped["invalid_json"] += 1
        out.bad_rows.append(BadRow(s, bytes(data[s : min(e, s + _SNIPPET)]), "invalid_json"))
        return []
    return [value]


_INVALID = object()


def loads_lenient(raw: bytes) -> Any:
    """orjson, else the standard library on the text with broken bytes replaced, else ``_INVALID``."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    try:
        return _clean(json.loads(raw.decode("utf-8", "replace")))
    except (ValueError, RecursionError):
        return _INVALID


def _clean(v: Any) -> Any:
    """A standard-library value made safe downstream: non-finite numbers null, lone surrogates replaced."""
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return v.encode("utf-8", "replace").decode("utf-8")
    if isinstance(v, list):
        return [_clean(x) for x in v]
    if isinstance(v, dict):
        return {_clean(k): _clean(x) for k, x in v.items()}
    return v
