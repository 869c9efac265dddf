"""Malformed trace and span ids: the spans and log records that carry them are dropped before forwarding.

An OpenTelemetry Collector upstream refuses a whole request for one bad id, so one bad span would
cost every good span beside it. A span needs a 16-byte trace id and an 8-byte span id, neither all
zero; its parent span id and its links' ids, when present, must have those lengths too. A log
record's ids are optional, but when set they must have the right lengths.

One pass over the items; the common all-good request is only read, never copied.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

TRACE_ID_BYTES = 16
SPAN_ID_BYTES = 8
_ZERO_TRACE = bytes(TRACE_ID_BYTES)
_ZERO_SPAN = bytes(SPAN_ID_BYTES)


def span_problem(span: Any) -> str | None:
    """Why a span cannot be forwarded (a reason label), or None when its ids are sound."""
    trace_id, span_id, parent = span.trace_id, span.span_id, span.parent_span_id
    if len(trace_id) != TRACE_ID_BYTES or trace_id == _ZERO_TRACE:
        return "bad_trace_id"
    if len(span_id) != SPAN_ID_BYTES or span_id == _ZERO_SPAN:
        return "bad_span_id"
    if parent and len(parent) != SPAN_ID_BYTES:
        return "bad_parent_span_id"
    for link in span.links:
        if len(link.trace_id) != TRACE_ID_BYTES or len(link.span_id) != SPAN_ID_BYTES:
            return "bad_link_id"
    return None


def log_problem(record: Any) -> str | None:
    """Why a log record cannot be forwarded, or None (its ids may be empty, never the wrong length)."""
    if record.trace_id and len(record.trace_id) != TRACE_ID_BYTES:
        return "bad_trace_id"
    if record.span_id and len(record.span_id) != SPAN_ID_BYTES:
        return "bad_span_id"
    return None


def _drop(items: Any, check: Any, reasons: Counter[str]) -> None:
    bad = []
    for i, item in enumerate(items):
        reason = check(item)
        if reason is not None:
            bad.append(i)
            reasons[reason] += 1
    for i in reversed(bad):
        del items[i]


def drop_malformed(signal: str, msg: Any) -> Counter[str]:
    """Remove the spans or log records with malformed ids from ``msg``; returns how many, by reason."""
    reasons: Counter[str] = Counter()
    if signal == "traces":
        for rs in msg.resource_spans:
            for ss in rs.scope_spans:
                _drop(ss.spans, span_problem, reasons)
    elif signal == "logs":
        for rl in msg.resource_logs:
            for sl in rl.scope_logs:
                _drop(sl.log_records, log_problem, reasons)
    return reasons
