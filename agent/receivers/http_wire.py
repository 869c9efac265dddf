"""What the OTLP/HTTP port reads and writes: its paths, requests, replies, gzip bodies."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass

PATHS = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}
MAX_HEADER_BYTES = 64 * 1024  # request line and headers; an OTLP SDK sends well under 1 KiB

Count = Callable[[str, str], None]  # (signal, outcome)


@dataclass(slots=True)
class Request:
    """One request read whole: its signal, headers (lower-case names) and body."""

    signal: str
    headers: dict[str, str]
    body: bytes
    peer: str


def gunzip_bounded(body: bytes, limit: int) -> bytes | None:
    """Decompress a gzip body to at most ``limit`` bytes; None when it would expand past it (raises zlib.error)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(body, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        return None
    return out
