"""What the OTLP/HTTP port reads and writes: requests, replies, a connection's state, refusals, gzip bodies."""

from __future__ import annotations

import re
import ssl
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import h11

from aaco.contract.signals import define

RECEIVER_CONNECTIONS = define(
    "aaco.receiver.connections",
    "aaco_receiver_connections",
    "counter",
    "{connection}",
    "Connections to the OTLP/HTTP port by outcome: accepted, too_many_connections (closed at once), "
    "idle_timeout, timeout (TLS handshake), tls_failed, plaintext_http (plain HTTP sent to the TLS port: answered "
    "400 with the https URL), client_gone (reset between requests), accept_failed.",
    ("outcome",),
)

PATHS = {"/v1/traces": "traces", "/v1/metrics": "metrics", "/v1/logs": "logs"}
MAX_HEADER_BYTES = 64 * 1024  # request line and headers; an OTLP SDK sends well under 1 KiB
REFUSED_LINGER_MAX = 64  # connections refused for max_connections that are answered (the rest are just closed)
LINGER_S = 2.0  # how long a refused connection is read (and discarded) before it is closed
_REQUEST_LINE = re.compile(rb"[A-Z]+ ([^ ?\r\n]+)")
GONE = (ConnectionError, TimeoutError, ssl.SSLError, OSError)

Count = Callable[[str, str], None]  # (signal, outcome)


@dataclass(slots=True)
class Request:
    """One request read whole: its signal, headers (lower-case names) and body."""

    signal: str
    headers: dict[str, str]
    body: bytes
    peer: str


@dataclass(slots=True)
class Reply:
    """What the handler answers."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(eq=False, slots=True)
class Conn:
    """A connection and the request it is reading (owned by the loop thread, or by one worker while busy)."""

    sock: Any  # socket.socket or ssl.SSLSocket
    peer: str
    http: h11.Connection
    phase: str  # sniff (TLS: first bytes not yet seen), handshake, idle, head, body, busy, linger
    deadline: float
    head: bytearray = field(default_factory=bytearray)  # the head's first bytes, to name the signal of a refusal
    signal: str = "unknown"
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    reserved: int = 0
    refused: bool = False  # over max_connections: answered 503, not counted against the limit


def gunzip_bounded(body: bytes, limit: int) -> bytes | None:
    """Decompress a gzip body to at most ``limit`` bytes; None when it would expand past it (raises zlib.error)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    out = d.decompress(body, limit + 1)
    if len(out) > limit or d.unconsumed_tail:
        return None
    return out


def signal_of(head: bytes) -> str:
    """The signal a request's first bytes name (``unknown`` when they name none)."""
    m = _REQUEST_LINE.match(head)
    return PATHS.get(m.group(1).decode("latin-1"), "unknown") if m else "unknown"


def plain_response(status: int, text: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A complete ``Connection: close`` response, for answers sent outside h11's state (refusals)."""
    body = text.encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n",
        "Content-Type: text/plain\r\n",
        f"Content-Length: {len(body)}\r\n",
    ]
    lines += [f"{k}: {v}\r\n" for k, v in extra] + ["Connection: close\r\n\r\n"]
    return "".join(lines).encode("latin-1") + body
