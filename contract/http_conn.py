"""A connection of ``http_loop.LoopServer``: its state, and the writes that never wait."""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import h11

from aaco.contract.http_app import App, Head, Limits, Reply, Work

GONE = (ConnectionError, TimeoutError, ssl.SSLError, OSError)
LINGER_S = 2.0  # how long a refused connection is read (and discarded) before it is closed
EVICTION_ORDER = {"linger": 0, "head": 1, "sniff": 2, "handshake": 2, "body": 2, "idle": 3, "new": 4}


@dataclass(eq=False, slots=True)
class Conn:
    """A connection and the request it is reading (owned by the loop thread, or by one worker while busy)."""

    sock: Any  # socket.socket or ssl.SSLSocket
    ip: str
    peer: str
    http: h11.Connection
    phase: str  # sniff (TLS: first bytes not yet seen), handshake, new (no byte yet), head, body, busy, idle, linger
    deadline: float
    since: float  # when it was accepted (the oldest is evicted first)
    head: bytearray = field(default_factory=bytearray)
    request: Head | None = None
    work: Work | None = None
    chunks: list[bytes] = field(default_factory=list)
    size: int = 0
    answer: Reply | None = None  # an ``Answer``, written by the loop once the request's body has been read


def framed(conn: Conn, reply: Reply) -> bytes | None:
    """The reply as bytes on the wire (h11 frames it for this request); None when h11 will not."""
    headers = [("Content-Type", reply.content_type), ("Content-Length", str(len(reply.body))), *reply.headers]
    try:
        data = conn.http.send(h11.Response(status_code=reply.status, headers=headers)) or b""
        data += conn.http.send(h11.Data(data=reply.body)) or b""
        return data + (conn.http.send(h11.EndOfMessage()) or b"")
    except h11.LocalProtocolError:
        return None


def send_now(sock: Any, data: bytes) -> None:
    """Best-effort write of a short answer on a non-blocking socket (it fits a fresh socket buffer)."""
    try:
        sock.send(data)
    except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError, *GONE):
        pass


class ConnectionSet:
    """The open connections of a port, by peer, and how each ends (closed, evicted, or lingered out)."""

    app: App
    limits: Limits

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._conns: set[Conn] = set()  # every open connection, busy ones included
        self._per_peer: Counter[str] = Counter()

    def _evict(self, ip: str | None) -> bool:
        """Close a connection holding no work (of ``ip``, or of anyone); False when there is none.

        The first to go: one lingering after a refusal, then one stalled in the middle of a request's
        head (a well-behaved client sends its head at once), then one handshaking or reading a body,
        then one idle between requests, last one accepted and not read yet; the oldest first within each.
        """
        idle = [c for c in self._conns if c.phase != "busy" and (ip is None or c.ip == ip)]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: (EVICTION_ORDER.get(c.phase, 3), c.since))
        if oldest.phase != "linger":
            self.app.count_connection("evicted")
        self._close(oldest)
        return True

    def _linger(self, conn: Conn) -> None:
        """Close for writing and read what still comes for a short while (see ``_discard``)."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.phase, conn.deadline = "linger", time.monotonic() + min(LINGER_S, self.limits.read_timeout_s)

    def _discard(self, conn: Conn) -> None:
        """Read and drop what a refused client still sends, so that closing does not reset its answer away."""
        try:
            while conn.sock.recv(65536):
                pass
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except GONE:
            pass
        self._close(conn)

    def _close(self, conn: Conn) -> None:
        self._release(conn)
        with contextlib.suppress(KeyError, ValueError):  # busy (handed to a worker) or already unregistered
            self._sel.unregister(conn.sock)
        conn.sock.close()
        if conn in self._conns:
            self._conns.discard(conn)
            self._per_peer[conn.ip] -= 1
            if self._per_peer[conn.ip] <= 0:
                del self._per_peer[conn.ip]

    def _release(self, conn: Conn) -> None:
        if conn.work is not None and conn.work.reserved:
            self.app.release(conn.work.reserved)
            conn.work = Work(conn.work.lane, conn.work.max_body, 0)
