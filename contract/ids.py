"""Deterministic trace and span IDs: a replay or a retry of the same input yields the same IDs.

An ID is a BLAKE2b digest of the parts that identify the thing (node, source identity, iteration
key), so the same iteration read twice lands in the same trace instead of a duplicate one. The
all-zero ID is invalid in OpenTelemetry; a digest that happens to be zero is replaced by 1.
"""

from __future__ import annotations

import hashlib


def _digest(parts: tuple[object, ...], size: int) -> str:
    h = hashlib.blake2b(digest_size=size, person=b"aaco-ids")
    for part in parts:
        h.update(str(part).encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
    out = h.hexdigest()
    return out if int(out, 16) else "0" * (2 * size - 1) + "1"


def trace_id(*parts: object) -> str:
    """A 16-byte trace ID (32 hex digits) derived from ``parts``."""
    return _digest(parts, 16)


def span_id(*parts: object) -> str:
    """An 8-byte span ID (16 hex digits) derived from ``parts``."""
    return _digest(parts, 8)
