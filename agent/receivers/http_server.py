"""The OTLP/HTTP port: HTTP/1.1 with bounded threads, connections, bytes and time.

Design. One acceptor thread runs a ``selectors`` loop that owns every connection while it costs no
work: the TLS handshake, the idle time between kept-alive requests, and the reading of a request
(headers, then body). Only a request read whole is handed to a bounded ``ThreadPoolExecutor``
(``max_workers``), which parses and forwards it and writes the small reply, then gives the
connection back to the loop. So a slow or silent client (slow loris: headers a byte at a time) holds
a socket and a few hundred bytes, never a thread, and the connection count is bounded
(``max_connections``: more are closed at once and counted). The request framing is h11's, a
well-kept HTTP/1.1 state machine (Content-Length and chunked bodies, keep-alive, pipelining, bounded
header size), rather than hand-written parsing.

What is checked before any body byte is read: a Content-Length that is present (411 without one,
unless chunked), numeric and not negative (400), not over ``max_message_bytes`` (413), and the bytes
admitted by the agent's byte budget (503 with Retry-After when it is full; chunked bodies reserve
``max_message_bytes``). A chunked body is read chunk by chunk up to the limit (413 beyond it). A
refused connection is answered and closed after a short lingering read, so the client sees the
answer rather than a reset. A request must arrive whole within ``read_timeout_s`` of its first byte
(408), an idle kept-alive connection is closed after ``idle_timeout_s``. Every refusal is counted in
``aaco_receiver_requests_total`` (by signal, ``unknown`` before the path is known) or, for whole
connections, ``aaco_receiver_connections_total``; a client that goes away is one debug line. On a
TLS port a connection's first bytes are peeked at before the handshake (within ``read_timeout_s``):
plain HTTP is answered 400 with the https URL (``contract/tls.py``), counted ``plaintext_http``.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from typing import Any

import h11

from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.agent.receivers.http_wire import (
    GONE,
    LINGER_S,
    MAX_HEADER_BYTES,
    PATHS,
    RECEIVER_CONNECTIONS,
    REFUSED_LINGER_MAX,
    Conn,
    Count,
    Reply,
    Request,
    plain_response,
    signal_of,
)
from aaco.contract.budget import ByteBudget
from aaco.contract.stats import Stats
from aaco.contract.tls import peek, plaintext_answer

log = logging.getLogger("aaco.receivers.otlp")


class HttpServer:
    """The OTLP/HTTP port (see the module docstring): ``bind``, ``start``, ``stop``."""

    def __init__(
        self,
        config: OtlpReceiverConfig,
        stats: Stats,
        budget: ByteBudget,
        handler: Callable[[Request], Reply],
        count: Count,
        tls: ssl.SSLContext | None,
    ) -> None:
        self.config = config
        self.stats = stats
        self.budget = budget
        self.handler = handler
        self.count = count
        self.tls = tls
        self.port = 0
        self._sel = selectors.DefaultSelector()
        self._conns: set[Conn] = set()  # every open connection, busy ones included; the loop thread's alone
        self._returned: deque[tuple[Conn, bool]] = deque()  # from the workers: (connection, keep it open)
        self._inflight: dict[futures.Future[None], Conn] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._listener: socket.socket | None = None
        self._pool = futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="aaco-otlp-http")
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self._warned_accept = False
        self._refused = 0  # connections refused for max_connections, answered and lingering

    # -- lifecycle ----------------------------------------------------------------------------------

    def bind(self) -> int:
        """Listen (raises OSError when the port is taken); returns the port."""
        cfg = self.config
        family = socket.AF_INET6 if ":" in cfg.address else socket.AF_INET
        self._listener = socket.create_server((cfg.address, cfg.http_port), family=family, backlog=cfg.backlog)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        return self.port

    def start(self) -> None:
        """Serve in the acceptor thread."""
        assert self._listener is not None, "bind() first"
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="aaco-otlp-http", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        """Stop accepting and reading; requests being handled get ``timeout_s`` to finish, then all is closed."""
        deadline = time.monotonic() + timeout_s
        self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
        for fut, conn in list(self._inflight.items()):
            if fut.cancel():  # never started: its bytes are given back here
                self._release(conn)
        futures.wait(list(self._inflight), timeout=max(0.0, deadline - time.monotonic()))
        self._pool.shutdown(wait=False)
        for conn in list(self._conns):
            self._close(conn)
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                sock.close()
        self._sel.close()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a wake-up is already pending, or the server is closed
            self._wake_w.send(b"\0")

    # -- the loop -----------------------------------------------------------------------------------

    def _run(self) -> None:
        cfg = self.config
        sweep_every = max(0.05, min(1.0, min(cfg.read_timeout_s, cfg.idle_timeout_s, LINGER_S) / 4))
        next_sweep = time.monotonic() + sweep_every
        while not self._stopping:
            for key, _ in self._sel.select(max(0.0, next_sweep - time.monotonic())):
                if key.data is None:
                    self._accept()
                elif key.data == "wake":
                    self._take_back()
                else:
                    self._ready(key.data)
            now = time.monotonic()
            if now >= next_sweep:
                self._sweep(now)
                next_sweep = now + sweep_every

    def _ready(self, conn: Conn) -> None:
        try:
            if conn.phase == "sniff":
                self._sniff(conn)
            elif conn.phase == "handshake":
                self._handshake(conn)
            elif conn.phase == "linger":
                self._discard(conn)
            else:
                self._read(conn)
        except Exception:  # a bug must cost one connection, never the loop
            log.exception("OTLP/HTTP: unexpected error on the connection from %s; closed", conn.peer)
            self._conn_count("error")
            self._close(conn)

    def _accept(self) -> None:
        assert self._listener is not None
        cfg = self.config
        for _ in range(64):  # a batch per wake-up, so a flood of connections cannot starve the others
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: stop accepting until the next sweep
                self._conn_count("accept_failed")
                (log.debug if self._warned_accept else log.warning)(
                    "OTLP/HTTP cannot accept a connection: %s (raise the open-files limit, or lower "
                    "receivers.otlp.max_connections)",
                    exc,
                )
                self._warned_accept = True
                self._sel.unregister(self._listener)
                self._accepting = False
                return
            sock.setblocking(False)
            now = time.monotonic()
            http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
            peer = f"{addr[0]}:{addr[1]}"
            if len(self._conns) - self._refused >= cfg.max_connections:
                self._conn_count("too_many_connections")
                if self.tls is not None or self._refused >= REFUSED_LINGER_MAX:
                    sock.close()  # no answer a TLS client could read, or too many being answered already
                    continue
                refused = Conn(sock, peer, http, "linger", now, refused=True)
                self._refused += 1
                self._conns.add(refused)
                self._sel.register(sock, selectors.EVENT_READ, refused)
                self._send_now(sock, plain_response(503, "too many connections\n", (("Retry-After", "1"),)))
                self._linger(refused)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:  # its first bytes are peeked at (_sniff) before the handshake
                conn = Conn(sock, peer, http, "sniff", now + cfg.read_timeout_s)
            else:
                conn = Conn(sock, peer, http, "idle", now + cfg.idle_timeout_s)
            self._conns.add(conn)
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            self._conn_count("accepted")

    def _sniff(self, conn: Conn) -> None:
        """On a TLS port: answer plain HTTP with a hint (counted ``plaintext_http``), else begin the handshake."""
        try:
            first = peek(conn.sock)
        except BlockingIOError:
            return
        except GONE as exc:
            self._gone(conn, exc)
            return
        answer = plaintext_answer(first, conn.sock.getsockname())
        if answer is not None:
            self._conn_count("plaintext_http")
            log.debug("OTLP/HTTP: %s sent plain HTTP to the TLS port; answered 400", conn.peer)
            self._send_now(conn.sock, answer)
            self._linger(conn)
            return
        assert self.tls is not None
        self._sel.unregister(conn.sock)  # wrapping takes the socket's descriptor over
        conn.sock = self.tls.wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
        conn.phase = "handshake"
        self._sel.register(conn.sock, selectors.EVENT_READ, conn)
        self._handshake(conn)

    def _handshake(self, conn: Conn) -> None:
        try:
            conn.sock.do_handshake()
        except ssl.SSLWantReadError:
            self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
            return
        except ssl.SSLWantWriteError:
            self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)
            return
        except GONE as exc:
            self._conn_count("tls_failed")
            log.debug("OTLP/HTTP: TLS handshake with %s failed: %s", conn.peer, exc)
            self._close(conn)
            return
        conn.phase, conn.deadline = "idle", time.monotonic() + self.config.idle_timeout_s
        self._sel.modify(conn.sock, selectors.EVENT_READ, conn)
        self._read(conn)  # the first request may have come with the handshake's last flight

    def _read(self, conn: Conn) -> None:
        while True:
            try:
                data = conn.sock.recv(65536)
            except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                return
            except GONE as exc:
                self._gone(conn, exc)
                return
            if not data:  # the client closed: mid-request it went away, between requests it is done
                if conn.phase in ("head", "body"):
                    self._gone(conn, "closed")
                else:
                    self._close(conn)
                return
            if conn.phase == "idle":
                conn.phase, conn.deadline = "head", time.monotonic() + self.config.read_timeout_s
            if conn.phase == "head" and len(conn.head) < 256:
                conn.head += data[: 256 - len(conn.head)]
            conn.http.receive_data(data)
            if not self._advance(conn):
                return
            if not (isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending()):
                return  # TLS may hold decrypted bytes the selector cannot see: read them now

    def _advance(self, conn: Conn) -> bool:
        """Take h11's events; False once the connection is handed over or closed."""
        while True:
            try:
                event = conn.http.next_event()
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                outcome = "bad_length" if "Content-Length" in str(exc) else "malformed"
                if status == 431:
                    outcome = "headers_too_large"
                conn.signal = signal_of(bytes(conn.head))
                self._refuse(conn, status, outcome, f"bad request: {exc}\n")
                return False
            if event is h11.NEED_DATA:
                return True
            if isinstance(event, h11.Request):
                if not self._begin(conn, event):
                    return False
            elif isinstance(event, h11.Data):
                conn.size += len(event.data)
                if conn.size > self.config.max_message_bytes:
                    self._refuse(conn, 413, "too_large", "request too large\n")
                    return False
                conn.chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                self._hand_over(conn)
                return False
            else:  # ConnectionClosed (or PAUSED, which cannot happen while the loop owns the connection)
                self._close(conn)
                return False

    def _begin(self, conn: Conn, req: h11.Request) -> bool:
        """Admit a request on its headers alone, before any body byte is read."""
        signal = PATHS.get(req.target.split(b"?", 1)[0].decode("latin-1"))
        conn.signal = signal or "unknown"
        if signal is None:
            self._refuse(conn, 404, "not_found", "unknown path; use /v1/traces, /v1/metrics or /v1/logs\n")
            return False
        if req.method != b"POST":
            self._refuse(conn, 405, "not_allowed", "use POST\n", (("Allow", "POST"),))
            return False
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in req.headers}
        limit = self.config.max_message_bytes
        if "transfer-encoding" in headers:  # h11 accepts chunked only (501 otherwise)
            reserve = limit
        elif "content-length" not in headers:
            self._refuse(conn, 411, "length_required", "Content-Length required\n")
            return False
        else:
            reserve = int(headers["content-length"])  # digits only: h11 refused anything else
            if reserve > limit:
                self._refuse(conn, 413, "too_large", "request too large\n")
                return False
        if not self.budget.try_acquire("receiver", reserve):
            self._refuse(
                conn, 503, "over_budget", "the agent holds too much data; retry later\n", (("Retry-After", "1"),)
            )
            return False
        conn.reserved, conn.headers, conn.phase, conn.chunks, conn.size = reserve, headers, "body", [], 0
        if conn.http.they_are_waiting_for_100_continue:
            self._send_now(conn.sock, conn.http.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        return True

    def _hand_over(self, conn: Conn) -> None:
        conn.phase = "busy"
        self._sel.unregister(conn.sock)
        fut = self._pool.submit(self._serve, conn)
        self._inflight[fut] = conn
        fut.add_done_callback(self._inflight_done)

    def _inflight_done(self, fut: futures.Future[None]) -> None:
        self._inflight.pop(fut, None)

    def _take_back(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        now = time.monotonic()
        while self._returned:
            conn, keep = self._returned.popleft()
            if not keep:
                self._close(conn)
                continue
            pipelined = conn.http.trailing_data[0]
            conn.head = bytearray(pipelined[:256])
            conn.signal, conn.headers = "unknown", {}
            if pipelined:
                conn.phase, conn.deadline = "head", now + self.config.read_timeout_s
            else:
                conn.phase, conn.deadline = "idle", now + self.config.idle_timeout_s
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            if self._advance(conn):
                self._read(conn)

    def _sweep(self, now: float) -> None:
        if not self._accepting and self._listener is not None:
            self._sel.register(self._listener, selectors.EVENT_READ, None)
            self._accepting = True
        for conn in [c for c in self._conns if c.phase != "busy" and c.deadline <= now]:
            if conn.phase in ("head", "body"):
                name = conn.signal if conn.signal != "unknown" else signal_of(bytes(conn.head))
                self.count(name, "timeout")
                self._send_now(conn.sock, plain_response(408, "request not received in time\n"))
            elif conn.phase == "idle":
                self._conn_count("idle_timeout")
            elif conn.phase in ("sniff", "handshake"):
                self._conn_count("timeout")
            self._close(conn)

    # -- a worker -----------------------------------------------------------------------------------

    def _serve(self, conn: Conn) -> None:
        request = Request(conn.signal, conn.headers, b"".join(conn.chunks), conn.peer)
        conn.chunks = []
        try:
            reply = self.handler(request)
        except Exception:  # a bug: answered 500, counted, logged with its traceback
            log.exception("OTLP/HTTP: unexpected error handling a %s request from %s", conn.signal, conn.peer)
            self.count(conn.signal, "error")
            reply = Reply(500, b"internal error\n")
        finally:
            self._release(conn)
        del request
        self._returned.append((conn, self._write(conn, reply)))
        self._wake()

    def _write(self, conn: Conn, reply: Reply) -> bool:
        """Send the reply (blocking, within read_timeout_s); True when the connection may serve another request."""
        headers = [("Content-Type", reply.content_type), ("Content-Length", str(len(reply.body))), *reply.headers]
        data = conn.http.send(h11.Response(status_code=reply.status, headers=headers)) or b""
        data += conn.http.send(h11.Data(data=reply.body)) or b""
        data += conn.http.send(h11.EndOfMessage()) or b""
        try:
            conn.sock.settimeout(self.config.read_timeout_s)
            conn.sock.sendall(data)
            conn.sock.setblocking(False)
        except GONE as exc:
            self._conn_count("client_gone")
            log.debug("OTLP/HTTP client %s went away before its reply: %s", conn.peer, exc)
            return False
        if conn.http.our_state is not h11.DONE or conn.http.their_state is not h11.DONE:
            return False
        conn.http.start_next_cycle()
        return True

    # -- helpers ------------------------------------------------------------------------------------

    def _refuse(
        self, conn: Conn, status: int, outcome: str, text: str, extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        """Answer a refusal, count it and close the connection after a lingering read."""
        self.count(conn.signal, outcome)
        self._release(conn)
        self._send_now(conn.sock, plain_response(status, text, extra))
        conn.chunks = []
        self._linger(conn)

    def _linger(self, conn: Conn) -> None:
        """Close for writing and read what still comes for a short while (see ``_discard``)."""
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.phase, conn.deadline = "linger", time.monotonic() + min(LINGER_S, self.config.read_timeout_s)

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

    def _gone(self, conn: Conn, why: object) -> None:
        if conn.phase in ("head", "body"):
            self.count(conn.signal if conn.signal != "unknown" else signal_of(bytes(conn.head)), "client_gone")
        else:
            self._conn_count("client_gone")
        log.debug("OTLP/HTTP client %s went away: %s", conn.peer, why)
        self._close(conn)

    def _close(self, conn: Conn) -> None:
        self._release(conn)
        with contextlib.suppress(KeyError, ValueError):  # busy (handed to a worker) or already unregistered
            self._sel.unregister(conn.sock)
        conn.sock.close()
        if conn in self._conns and conn.refused:
            self._refused -= 1
        self._conns.discard(conn)

    def _release(self, conn: Conn) -> None:
        if conn.reserved:
            self.budget.release("receiver", conn.reserved)
            conn.reserved = 0

    def _send_now(self, sock: Any, data: bytes) -> None:
        """Best-effort write of a short answer on a non-blocking socket (it fits a fresh socket buffer)."""
        try:
            sock.send(data)
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError, *GONE):
            pass

    def _conn_count(self, outcome: str) -> None:
        self.stats.inc(RECEIVER_CONNECTIONS, 1, outcome=outcome)
