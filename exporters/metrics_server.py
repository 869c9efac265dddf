"""The HTTP(S) server under ``/metrics``: a bounded pool of workers, TLS in the worker, a deadline per connection.

The standard library's WSGI server with one change of model: ``socketserver``'s ThreadingMixIn starts a
thread per connection without limit and knows no deadline, so this server hands each accepted connection
to a pool of ``workers`` threads (one more connection is closed and counted as busy), does the TLS
handshake there (a slow client never holds up the accept loop; plain HTTP sent to the TLS port is
answered 400 with the https URL instead, ``contract/tls.py``), and cuts any connection still open
``timeout_s`` after it was accepted (a socket timeout alone lets a client that sends a byte now and then
hold a worker for ever). Hand-written on ``wsgiref`` because the agent carries no WSGI server dependency and
the pieces are small.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from aaco.contract.tls import peek, plaintext_answer
from aaco.exporters.web_config import WebConfigWatcher, allowed_san

log = logging.getLogger("aaco.exporters.prometheus")

# OpenSSL's reasons for a handshake that failed on the client's certificate (none given, or not verified).
CLIENT_CERT_REASONS = frozenset(
    {"PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED", "TLSV13_ALERT_CERTIFICATE_REQUIRED"}
)
LINGER_S = 2.0  # how long a client answered with the plain-HTTP hint is read before its connection is closed


@dataclass
class _Conn:
    sock: socket.socket
    deadline: float
    cut: bool = False


class QuietHandler(WSGIRequestHandler):
    """The request handler: no request log, ``HTTPS`` set in the environ for a TLS connection."""

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged (scrapes every few seconds would flood the log)."""

    def get_environ(self) -> dict[str, Any]:
        """The environ of wsgiref, with ``HTTPS=on`` over TLS (so ``wsgi.url_scheme`` is https)."""
        env = super().get_environ()
        if isinstance(self.request, ssl.SSLSocket):
            env["HTTPS"] = "on"
        return env


class PoolServer(WSGIServer):
    """A WSGI server serving each connection in a bounded pool, over TLS when the web-config file says so."""

    allow_reuse_address = True
    request_queue_size = 128  # the listen backlog (socketserver's default is 5)

    def __init__(
        self,
        address: tuple[str, int],
        *,
        workers: int,
        timeout_s: float,
        web: WebConfigWatcher | None,
        refused: Callable[[str], None],
    ) -> None:
        super().__init__(address, QuietHandler)
        self._slots = threading.BoundedSemaphore(workers)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="aaco-metrics")
        self._timeout_s = timeout_s
        self._web = web
        self._refused = refused
        self._active: dict[int, _Conn] = {}  # by worker thread: each serves one connection at a time
        self._active_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        """In the accept loop: hand the connection to a free worker, or close it (busy)."""
        if not self._slots.acquire(blocking=False):
            self._refused("busy")
            self.shutdown_request(request)
            return
        try:
            self._pool.submit(self._serve, request, client_address)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._slots.release()
            self.shutdown_request(request)

    def _track(self, sock: socket.socket, deadline: float) -> None:
        with self._active_lock:
            self._active[threading.get_ident()] = _Conn(sock, deadline)

    def _serve(self, sock: socket.socket, client_address: Any) -> None:
        conn: socket.socket = sock
        deadline = time.monotonic() + self._timeout_s
        try:
            self._track(sock, deadline)
            sock.settimeout(self._timeout_s)
            state = self._web.current() if self._web is not None and self._web.tls else None
            if state is not None and state.context is not None:
                if self._plaintext(sock):
                    return
                tls = self._handshake(state.context, sock, deadline, state.config.tls_server_config)
                if tls is None:
                    return
                conn = tls
            self.finish_request(conn, client_address)
        except TimeoutError:
            self._refuse_unless_cut("timeout")
        except OSError as exc:
            log.debug("metrics connection from %s ended: %s", client_address[0], exc)
        except Exception:
            log.exception("metrics connection from %s failed", client_address[0])
        finally:
            with self._active_lock:
                self._active.pop(threading.get_ident(), None)
            self.shutdown_request(conn)
            self._slots.release()

    def _plaintext(self, sock: socket.socket) -> bool:
        """Answer plain HTTP sent to the TLS port with a 400 naming the https URL (counted); True when it was."""
        first = peek(sock)  # within the connection's timeout, as the handshake would wait
        answer = plaintext_answer(first, sock.getsockname())
        if answer is None:
            return False
        self._refused("plaintext_http")
        sock.recv(len(first))  # the peeked request, read so that closing does not reset the answer away
        sock.sendall(answer)
        with contextlib.suppress(OSError):  # read what more the client sends until it closes, within its time
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(min(LINGER_S, self._timeout_s))
            while sock.recv(65536):
                pass
        return True

    def _handshake(
        self, context: ssl.SSLContext, sock: socket.socket, deadline: float, tls: Any
    ) -> ssl.SSLSocket | None:
        """The TLS handshake (within the deadline), then the SAN check; None (counted) when either fails."""
        conn = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        self._track(conn, deadline)
        try:
            conn.do_handshake()
        except ssl.SSLError as exc:
            reason = "client_cert" if exc.reason in CLIENT_CERT_REASONS else "tls_handshake"
            self._refuse_unless_cut(reason)
            log.debug("metrics TLS handshake refused (%s): %s", reason, exc)
            self.shutdown_request(conn)
            return None
        except TimeoutError:
            self._refuse_unless_cut("timeout")
            self.shutdown_request(conn)
            return None
        except OSError as exc:
            self._refuse_unless_cut("tls_handshake")
            log.debug("metrics TLS handshake failed: %s", exc)
            self.shutdown_request(conn)
            return None
        sans = tls.client_allowed_sans if tls is not None else []
        if sans and not allowed_san(conn.getpeercert() or {}, sans):
            self._refused("client_san")
            log.info("metrics client certificate refused: none of its SANs is in client_allowed_sans")
            self.shutdown_request(conn)
            return None
        return conn

    def _refuse_unless_cut(self, reason: str) -> None:
        """Count a failure of this worker's connection, unless the deadline cut it (counted as timeout then)."""
        with self._active_lock:
            entry = self._active.get(threading.get_ident())
            if entry is not None and entry.cut:
                return
            if entry is not None:
                entry.cut = True
        self._refused(reason)

    def service_actions(self) -> None:
        """In the accept loop (every half second): cut the connections past their deadline."""
        now = time.monotonic()
        with self._active_lock:
            for entry in self._active.values():
                if not entry.cut and entry.deadline <= now:
                    entry.cut = True
                    self._refused("timeout")
                    _cut(entry.sock)

    def close_all(self) -> None:
        """After the accept loop stopped: cut every open connection and let the workers end."""
        with self._active_lock:
            for entry in self._active.values():
                entry.cut = True
                _cut(entry.sock)
        self._pool.shutdown(wait=False)


class PoolServerV6(PoolServer):
    """The same on an IPv6 address."""

    address_family = socket.AF_INET6


def _cut(sock: socket.socket) -> None:
    """Shut a socket down under the thread blocked on it (the plain socket's call, also for an SSLSocket)."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
