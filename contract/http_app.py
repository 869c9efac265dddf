"""What a port served by ``http_loop.LoopServer`` sees: limits, lanes, heads, verdicts, replies, the ``App``.

A request's head is put to the app, whose verdict is to refuse it, answer it at once, or give it work
in a lane; the app then handles it there and replies.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol

from aaco.contract.signals import define

ANSWER_BODY = 64 * 1024  # the most body a request answered at once (``Answer``) may carry (read and dropped)


@dataclass(frozen=True, slots=True)
class Limits:
    """What one port allows."""

    max_connections: int
    max_connections_per_peer: int
    read_timeout_s: float
    idle_timeout_s: float
    max_header_bytes: int = 64 * 1024
    backlog: int = 128


@dataclass(frozen=True, slots=True)
class Lane:
    """A pool of ``workers`` threads; at most ``queue`` requests wait for one (more are answered 503)."""

    workers: int
    queue: int


@dataclass(slots=True)
class Head:
    """A request's head: method, path, query string, headers (lower-case names), the peer's ``host:port``."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    peer: str


@dataclass(slots=True)
class Reply:
    """An answer."""

    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Refuse:
    """Answer ``status`` with ``text``, count ``outcome``, close the connection."""

    status: int
    outcome: str
    text: str
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer now, from the loop, and keep the connection (a reply that costs nothing to make)."""

    reply: Reply


@dataclass(frozen=True, slots=True)
class Work:
    """Read the body (at most ``max_body`` bytes), then handle the request in ``lane``.

    ``reserved``: bytes the app took from its budget for the request, given back through
    ``App.release`` whatever becomes of it.
    """

    lane: str
    max_body: int = 0
    reserved: int = 0


class App(Protocol):
    """What a port does with its requests (see the module docstring)."""

    def label(self, path: str | None) -> str:
        """The name a request on ``path`` (None: not known) is counted under."""

    def admit(self, head: Head) -> Refuse | Answer | Work:
        """Decide on a request from its head (in the loop thread: no blocking)."""

    def handle(self, head: Head, body: bytes, lane: str) -> Reply:
        """Handle a request read whole (in a thread of its lane)."""

    def release(self, reserved: int) -> None:
        """Give back what ``Work.reserved`` took."""

    def count(self, label: str, outcome: str) -> None:
        """A request refused (or failed) by outcome."""

    def count_connection(self, outcome: str) -> None:
        """A connection accepted, or ended by outcome."""

    def tls(self) -> ssl.SSLContext | None:
        """The TLS context for a new connection (None: plain HTTP)."""

    def check_peer(self, sock: ssl.SSLSocket) -> str | None:
        """After a handshake: why this client is refused (an outcome), or None."""


def plain_response(status: int, text: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A complete ``Connection: close`` response, for answers sent outside h11's state (refusals)."""
    body = text.encode()
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n",
        "Content-Type: text/plain; charset=utf-8\r\n",
        f"Content-Length: {len(body)}\r\n",
    ]
    lines += [f"{k}: {v}\r\n" for k, v in extra] + ["Connection: close\r\n\r\n"]
    return "".join(lines).encode("latin-1") + body


HTTP_CONNECTIONS = define(
    "aaco.http.connections",
    "aaco_http_connections",
    "counter",
    "{connection}",
    "Connections to the agent's HTTP ports (port: metrics, otlp_http) by outcome: accepted; evicted (holding no "
    "work, closed to make room for a new connection at max_connections or max_connections_per_peer); "
    "too_many_connections and too_many_from_peer (refused: every connection at the bound was being served); "
    "idle_timeout; timeout (TLS handshake or first bytes not in time); tls_failed; client_cert (no or unverified "
    "client certificate); client_san (not in client_allowed_sans); plaintext_http (plain HTTP sent to the TLS port: "
    "answered 400 with the https URL); client_gone; accept_failed; error (a bug: see the log).",
    ("port", "outcome"),
)
