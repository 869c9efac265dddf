"""Protobuf wire encoding of the OTLP messages AACO sends (spans, resources, attributes).

Why by hand: a GPU node produces kernels by the hundred thousand per second of capture, and the
cost of exporting them is the agent's cost. Building one protobuf (or SDK) object per kernel spends
most of that time in per-field Python calls; here a span is a handful of ``bytes`` joined, and the
parts that repeat — attribute key/value pairs such as ``gpu.device.id=0``, kernel names — are
encoded once and cached (bounded). The layout follows opentelemetry-proto
(``opentelemetry/proto/trace/v1/trace.proto``, ``common/v1/common.proto``); the tests decode every
message with the official generated classes, so a wrong byte fails there.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Final

# wire types
VARINT: Final = 0
I64: Final = 1
LEN: Final = 2
I32: Final = 5

_pack_q = struct.Struct("<Q").pack
_pack_d = struct.Struct("<d").pack


def varint(n: int) -> bytes:
    """Unsigned LEB128 (negative int64 values as their 10-byte two's complement, as protobuf does)."""
    if n < 0:
        n += 1 << 64
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def utf8(text: str) -> bytes:
    """``text`` as UTF-8 (a lone surrogate, which protobuf strings cannot hold, as ``?``)."""
    return text.encode("utf-8", "replace")


def read_varint(data: bytes, i: int) -> tuple[int, int]:
    """The varint at ``data[i:]`` and the offset after it (``ValueError`` if it runs off the end)."""
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7


def tag(field: int, wire: int) -> bytes:
    """A field key."""
    return varint((field << 3) | wire)


def length_delimited(field: int, payload: bytes) -> bytes:
    """A LEN field: key, length, payload."""
    return tag(field, LEN) + varint(len(payload)) + payload


def fixed64(field: int, value: int) -> bytes:
    """A fixed64 field (times in ns)."""
    return tag(field, I64) + _pack_q(value)


def varint_field(field: int, value: int) -> bytes:
    """A varint field."""
    return tag(field, VARINT) + varint(value)


INT64_MIN: Final = -(1 << 63)
INT64_MAX: Final = (1 << 63) - 1


# AnyValue: string_value=1, bool_value=2, int_value=3, double_value=4, bytes_value=7; KeyValue: key=1, value=2
def any_value(value: object) -> bytes:
    """An encoded ``AnyValue`` for str, bool, int, float, bytes (anything else, and ints past int64, as a string)."""
    if isinstance(value, bool):
        return varint_field(2, int(value))
    if isinstance(value, int) and INT64_MIN <= value <= INT64_MAX:
        return varint_field(3, value)
    if isinstance(value, float):
        return tag(4, I64) + _pack_d(value)
    if isinstance(value, bytes):
        return length_delimited(7, value)
    return length_delimited(1, utf8(str(value)))


def key_value(key: str, value: object) -> bytes:
    """An encoded ``KeyValue`` (without the enclosing field key)."""
    return length_delimited(1, utf8(key)) + length_delimited(2, any_value(value))


class AttributeCache:
    """Encoded ``attributes`` fields (field 9 of Span, as a whole LEN field), cached per (key, value).

    Bounded: past ``limit`` entries values are encoded each time instead of cached, so a stream of
    unique values (correlation IDs) costs CPU, never memory.
    """

    def __init__(self, field: int = 9, limit: int = 100_000) -> None:
        self._field = field
        self._limit = limit
        self._cache: dict[tuple[str, object], bytes] = {}

    def get(self, key: str, value: object) -> bytes:
        """The encoded attribute field for ``key=value``."""
        k = (key, value)
        hit = self._cache.get(k)
        if hit is not None:
            return hit
        enc = length_delimited(self._field, key_value(key, value))
        if len(self._cache) < self._limit:
            self._cache[k] = enc
        return enc


def attributes(field: int, attrs: Mapping[str, object]) -> bytes:
    """Encoded repeated ``KeyValue`` fields of ``attrs`` (None values left out)."""
    return b"".join(length_delimited(field, key_value(k, v)) for k, v in attrs.items() if v is not None)


def resource(attrs: Mapping[str, object]) -> bytes:
    """An encoded ``Resource`` message (attributes = field 1)."""
    return attributes(1, attrs)


def scope(name: str, version: str) -> bytes:
    """An encoded ``InstrumentationScope`` (name=1, version=2)."""
    return length_delimited(1, utf8(name)) + length_delimited(2, utf8(version))


_SPAN_FIELD: Final = [tag(2, LEN) + varint(n) for n in range(4096)]  # ScopeSpans.spans = 2


def export_trace_request(resource_attrs: bytes, scope_bytes: bytes, spans: Iterable[bytes]) -> bytes:
    """An ``ExportTraceServiceRequest`` holding one ResourceSpans with one ScopeSpans of ``spans``.

    ``spans`` are encoded Span messages (without their field key).
    """
    parts = [length_delimited(1, scope_bytes)]
    for s in spans:  # the field key and length of a span, from a table for the usual sizes
        n = len(s)
        parts.append(_SPAN_FIELD[n] if n < len(_SPAN_FIELD) else tag(2, LEN) + varint(n))
        parts.append(s)
    scope_spans = b"".join(parts)
    resource_spans = length_delimited(1, resource_attrs) + length_delimited(2, scope_spans)
    return length_delimited(1, resource_spans)
