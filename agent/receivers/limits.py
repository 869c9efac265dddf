"""Per-item limits on what a request may carry, and what a parsed request costs in memory.

**Limits.** As the OpenTelemetry SDKs bound what one span records (``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``,
``OTEL_SPAN_EVENT_COUNT_LIMIT``, ``OTEL_SPAN_LINK_COUNT_LIMIT``, ``OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT``,
``OTEL_LINK_ATTRIBUTE_COUNT_LIMIT``, 128 each by default), the receiver keeps at most that many of
a span's attributes, events and links, of an event's or a link's attributes and of a log record's
attributes; the rest are dropped, the item's ``dropped_*_count`` raised as OTLP says, and counted. A
request that lost anything is copied afresh (serialised and parsed again), because protobuf's arena
keeps the memory of removed elements until the whole message is freed.

**Cost.** A parsed protobuf request is Python and upb objects: measured on the receiver's shapes, 4
to 9 times its serialised size (9 for one span of 155,000 small attributes, 4 for thousands of
one-attribute spans). ``parsed_cost`` bounds it from the serialised size and the counts of items and
attributes (within 1.2 to 1.8 times the measured cost, ``tests/unit/test_receiver_limits.py``);
``PARSE_FACTOR`` times the serialised size is what a request is allowed while it is being parsed,
before its counts are known.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Final

PARSE_FACTOR: Final = 10  # the most a request's parse costs, in times its serialised size (measured: 9.2)
BYTES_PER_ATTRIBUTE: Final = 100  # a parsed KeyValue (measured: 68 to 90)
BYTES_PER_ITEM: Final = 250  # a parsed span, event, link or log record beside its attributes (measured: ~200)


@dataclass(frozen=True, slots=True)
class ItemLimits:
    """How much of each kind one item may carry."""

    attributes_per_span: int = 128
    events_per_span: int = 128
    links_per_span: int = 128
    attributes_per_event: int = 128
    attributes_per_link: int = 128
    attributes_per_log_record: int = 128


def _cut(field: Any, limit: int) -> int:
    """Keep the first ``limit`` elements of a repeated field; how many were removed."""
    excess = len(field) - limit
    if excess <= 0:
        return 0
    del field[limit:]
    return excess


def _span(span: Any, lim: ItemLimits, dropped: Counter[str]) -> tuple[int, int]:
    """Apply the limits to one span; (attributes, items) it holds afterwards."""
    n = _cut(span.attributes, lim.attributes_per_span)
    if n:
        span.dropped_attributes_count += n
        dropped["span_attributes"] += n
    n = _cut(span.events, lim.events_per_span)
    if n:
        span.dropped_events_count += n
        dropped["span_events"] += n
    n = _cut(span.links, lim.links_per_span)
    if n:
        span.dropped_links_count += n
        dropped["span_links"] += n
    attrs, items = len(span.attributes), 1 + len(span.events) + len(span.links)
    for kind, children, limit in (
        ("event_attributes", span.events, lim.attributes_per_event),
        ("link_attributes", span.links, lim.attributes_per_link),
    ):
        for child in children:
            n = _cut(child.attributes, limit)
            if n:
                child.dropped_attributes_count += n
                dropped[kind] += n
            attrs += len(child.attributes)
    return attrs, items


def apply(signal: str, msg: Any, lim: ItemLimits) -> tuple[Any, Counter[str], int]:
    """Hold ``msg`` to ``lim``: (the message, copied afresh when it lost anything; what was dropped; its cost).

    The cost is ``parsed_cost`` of what is kept. Metrics requests are not limited (their data points
    carry few attributes), only costed.
    """
    dropped: Counter[str] = Counter()
    attrs = items = 0
    if signal == "traces":
        for rs in msg.resource_spans:
            attrs += len(rs.resource.attributes)
            for ss in rs.scope_spans:
                for span in ss.spans:
                    a, i = _span(span, lim, dropped)
                    attrs, items = attrs + a, items + i
    elif signal == "logs":
        for rl in msg.resource_logs:
            attrs += len(rl.resource.attributes)
            for sl in rl.scope_logs:
                for record in sl.log_records:
                    n = _cut(record.attributes, lim.attributes_per_log_record)
                    if n:
                        record.dropped_attributes_count += n
                        dropped["log_record_attributes"] += n
                    attrs, items = attrs + len(record.attributes), items + 1
    else:
        return msg, dropped, PARSE_FACTOR * msg.ByteSize()
    if dropped:
        msg = type(msg).FromString(msg.SerializeToString())  # a fresh arena: the removed elements' memory goes
    return msg, dropped, parsed_cost(msg.ByteSize(), attrs, items)


def parsed_cost(serialised: int, attributes: int, items: int) -> int:
    """A bound on the memory of a parsed request of ``serialised`` bytes, ``attributes`` and ``items``."""
    return 2 * serialised + BYTES_PER_ATTRIBUTE * attributes + BYTES_PER_ITEM * items
