"""An HTTP/1.1 server on one selector loop, bounded in connections, bytes, time and threads (h11 framing).

Shared by the OTLP/HTTP receiver and the ``/metrics`` port, each an ``http_app.App``: the loop owns every
connection while it costs no work (handshake, idle, reading), puts each request's head to the app
(refuse, answer now, or work in a lane: a small pool with a bounded queue) and, at a connection
bound, closes the oldest connection that holds no work. The design and its limits: docs/security.md,
"The HTTP ports".
"""

from __future__ import annotations

import contextlib
import logging
import re
import selectors
import socket
import ssl
import threading
import time
from collections import Counter, deque
from collections.abc import Mapping
from concurrent import futures

import h11

from aaco.contract.http_app import ANSWER_BODY, Answer, App, Head, Lane, Limits, Refuse, Reply, Work, plain_response
from aaco.contract.http_conn import GONE, LINGER_S, Conn, ConnectionSet, framed, send_now
from aaco.contract.tls import CLIENT_CERT_REASONS, peek, plaintext_answer

log = logging.getLogger("aaco.http")

# Connections accepted per wake-up: few, so that what the last ones sent is read before more are
# accepted, and a flood of connections neither starves the others nor evicts a new one unread.
ACCEPT_BATCH = 8
HEAD_KEPT = 256  # bytes of a request's start kept, to name it in a count when it never completes
_REQUEST_LINE = re.compile(rb"[A-Z]+ ([^ ?\r\n]+)")


class LoopServer(ConnectionSet):
    """One port (see the module docstring): ``bind``, ``start``, ``stop``."""

    def __init__(
        self,
        name: str,
        address: str,
        port: int,
        limits: Limits,
        lanes: Mapping[str, Lane],
        app: App,
        logger: logging.Logger | None = None,
    ) -> None:
        super().__init__()
        self.name = name
        self.log = logger or log
        self.address = address
        self.limits = limits
        self.app = app
        self.port = port
        self._lanes = dict(lanes)
        self._pools = {
            n: futures.ThreadPoolExecutor(lane.workers, thread_name_prefix=f"aaco-{name}-{n}")
            for n, lane in lanes.items()
        }
        self._queued: Counter[str] = Counter()  # requests handed to each lane and not finished (the loop's alone)
        self._returned: deque[tuple[Conn, bool]] = deque()  # from the workers: (connection, keep it open)
        self._inflight: dict[futures.Future[None], Conn] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._accepting = True
        self._warned_accept = False

    # -- lifecycle ----------------------------------------------------------------------------------

    def bind(self) -> int:
        """Listen (raises OSError when the address is taken); returns the port."""
        family = socket.AF_INET6 if ":" in self.address else socket.AF_INET
        self._listener = socket.create_server((self.address, self.port), family=family, backlog=self.limits.backlog)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        return self.port

    def start(self) -> None:
        """Serve in the loop thread."""
        assert self._listener is not None, "bind() first"
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name=f"aaco-{self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        """Stop accepting and reading; requests being handled get ``timeout_s`` to finish, then all is closed."""
        deadline = time.monotonic() + timeout_s
        self._stopping = True
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout_s)
        for fut, conn in list(self._inflight.items()):
            if fut.cancel():  # never started: what it reserved is given back here
                self._release(conn)
        futures.wait(list(self._inflight), timeout=max(0.0, deadline - time.monotonic()))
        for pool in self._pools.values():
            pool.shutdown(wait=False)
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
        lim = self.limits
        sweep_every = max(0.05, min(1.0, min(lim.read_timeout_s, lim.idle_timeout_s, LINGER_S) / 4))
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
        if conn not in self._conns:  # closed (evicted) by an earlier event of this round
            return
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
            self.log.exception("%s: unexpected error on the connection from %s; closed", self.name, conn.peer)
            self.app.count_connection("error")
            self._close(conn)

    def _accept(self) -> None:
        assert self._listener is not None
        for _ in range(ACCEPT_BATCH):
            try:
                sock, addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:  # out of file descriptors: stop accepting until the next sweep
                self.app.count_connection("accept_failed")
                (self.log.debug if self._warned_accept else self.log.warning)(
                    "%s cannot accept a connection: %s (raise the open-files limit, or lower its max_connections)",
                    self.name,
                    exc,
                )
                self._warned_accept = True
                self._sel.unregister(self._listener)
                self._accepting = False
                return
            self._admit_connection(sock, str(addr[0]), f"{addr[0]}:{addr[1]}")

    def _admit_connection(self, sock: socket.socket, ip: str, peer: str) -> None:
        """Make room (evicting the oldest connection without work) or refuse; else start reading it."""
        sock.setblocking(False)
        lim = self.limits
        if self._per_peer[ip] >= lim.max_connections_per_peer and not self._evict(ip):
            self._refuse_connection(sock, "too_many_from_peer")
            return
        if len(self._conns) >= lim.max_connections and not self._evict(None):
            self._refuse_connection(sock, "too_many_connections")
            return
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        now = time.monotonic()
        http = h11.Connection(h11.SERVER, max_incomplete_event_size=lim.max_header_bytes)
        if self.app.tls() is not None:  # its first bytes are peeked at (_sniff) before the handshake
            conn = Conn(sock, ip, peer, http, "sniff", now + lim.read_timeout_s, now)
        else:
            conn = Conn(sock, ip, peer, http, "new", now + lim.read_timeout_s, now)
        self._conns.add(conn)
        self._per_peer[ip] += 1
        self._sel.register(conn.sock, selectors.EVENT_READ, conn)
        self.app.count_connection("accepted")

    def _refuse_connection(self, sock: socket.socket, outcome: str) -> None:
        """Every connection at the bound is being served: a 503 (plain HTTP) or nothing (TLS), then close."""
        self.app.count_connection(outcome)
        if self.app.tls() is None:
            send_now(sock, plain_response(503, "too many connections\n", (("Retry-After", "1"),)))
        with contextlib.suppress(OSError):
            sock.close()

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
            self.app.count_connection("plaintext_http")
            send_now(conn.sock, answer)
            self._linger(conn)
            return
        context = self.app.tls()
        if context is None:  # TLS turned off since it was accepted (cannot happen: TLS is set at start)
            self._close(conn)
            return
        self._sel.unregister(conn.sock)  # wrapping takes the socket's descriptor over
        conn.sock = context.wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
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
        except ssl.SSLError as exc:
            self.app.count_connection("client_cert" if exc.reason in CLIENT_CERT_REASONS else "tls_failed")
            self.log.debug("%s: TLS handshake with %s failed: %s", self.name, conn.peer, exc)
            self._close(conn)
            return
        except GONE as exc:
            self.app.count_connection("tls_failed")
            self.log.debug("%s: TLS handshake with %s failed: %s", self.name, conn.peer, exc)
            self._close(conn)
            return
        refused = self.app.check_peer(conn.sock)
        if refused is not None:
            self.app.count_connection(refused)
            self._close(conn)
            return
        conn.phase, conn.deadline = "new", time.monotonic() + self.limits.read_timeout_s
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
            if conn.phase in ("new", "idle"):
                conn.phase, conn.deadline = "head", time.monotonic() + self.limits.read_timeout_s
            if conn.phase == "head" and len(conn.head) < HEAD_KEPT:
                conn.head += data[: HEAD_KEPT - len(conn.head)]
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
                self._refuse(conn, Refuse(status, outcome, f"bad request: {exc}\n"))
                return False
            if event is h11.NEED_DATA:
                return True
            if isinstance(event, h11.Request):
                if not self._begin(conn, event):
                    return False
            elif isinstance(event, h11.Data):
                conn.size += len(event.data)
                if conn.work is None or conn.size > conn.work.max_body:
                    self._refuse(conn, Refuse(413, "too_large", "request too large\n"))
                    return False
                if conn.answer is None:
                    conn.chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                if conn.answer is None:
                    self._hand_over(conn)
                    return False
                if not self._answer_now(conn, conn.answer):
                    return False
            else:  # ConnectionClosed (or PAUSED, which cannot happen while the loop owns the connection)
                self._close(conn)
                return False

    def _begin(self, conn: Conn, req: h11.Request) -> bool:
        """Put a request's head to the app, before any body byte is read."""
        path, _, query = req.target.decode("latin-1").partition("?")
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in req.headers}
        conn.request = Head(req.method.decode("latin-1"), path, query, headers, conn.peer)
        verdict = self.app.admit(conn.request)
        if isinstance(verdict, Refuse):
            self._refuse(conn, verdict)
            return False
        if isinstance(verdict, Answer):  # a body, if any, is read and dropped; then the answer goes out
            conn.work, conn.answer, conn.phase, conn.chunks, conn.size = (
                Work("", ANSWER_BODY),
                verdict.reply,
                "body",
                [],
                0,
            )
            return True
        lane = self._lanes[verdict.lane]
        if self._queued[verdict.lane] >= lane.workers + lane.queue:
            self.app.release(verdict.reserved)
            self._refuse(conn, Refuse(503, "busy", "busy; retry later\n", (("Retry-After", "1"),)))
            return False
        conn.work, conn.phase, conn.chunks, conn.size = verdict, "body", [], 0
        if conn.http.they_are_waiting_for_100_continue:
            send_now(conn.sock, conn.http.send(h11.InformationalResponse(status_code=100, headers=[])) or b"")
        return True

    def _answer_now(self, conn: Conn, reply: Reply) -> bool:
        """Write an ``Answer`` from the loop without waiting: a client that does not take it is closed.

        True when the connection goes on to its next request.
        """
        data = framed(conn, reply)
        try:
            sent = conn.sock.send(data) if data is not None else 0
        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError, *GONE):
            sent = -1
        if data is None or sent != len(data):
            self.app.count_connection("client_gone")
            self._close(conn)
            return False
        if conn.http.our_state is not h11.DONE or conn.http.their_state is not h11.DONE:
            self._close(conn)
            return False
        conn.http.start_next_cycle()
        self._next_request(conn, time.monotonic())
        return True

    def _hand_over(self, conn: Conn) -> None:
        assert conn.work is not None and conn.request is not None
        conn.phase = "busy"
        self._sel.unregister(conn.sock)
        lane = conn.work.lane
        self._queued[lane] += 1
        fut = self._pools[lane].submit(self._serve, conn)
        self._inflight[fut] = conn
        fut.add_done_callback(self._inflight_done)

    def _inflight_done(self, fut: futures.Future[None]) -> None:
        self._inflight.pop(fut, None)

    def _take_back(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(4096):
                pass
        now = time.monotonic()
        while self._returned:
            conn, keep = self._returned.popleft()
            if conn.phase == "busy" and conn.work is not None:
                self._queued[conn.work.lane] -= 1
            if not keep:
                self._close(conn)
                continue
            self._next_request(conn, now)
            self._sel.register(conn.sock, selectors.EVENT_READ, conn)
            if self._advance(conn):
                self._read(conn)

    def _next_request(self, conn: Conn, now: float) -> None:
        """After a reply: wait for the next request (or read the one already pipelined)."""
        pipelined = conn.http.trailing_data[0]
        conn.head = bytearray(pipelined[:HEAD_KEPT])
        conn.request, conn.work, conn.answer, conn.chunks, conn.size = None, None, None, [], 0
        if pipelined:
            conn.phase, conn.deadline = "head", now + self.limits.read_timeout_s
        else:
            conn.phase, conn.deadline = "idle", now + self.limits.idle_timeout_s

    def _sweep(self, now: float) -> None:
        if not self._accepting and self._listener is not None:
            self._sel.register(self._listener, selectors.EVENT_READ, None)
            self._accepting = True
        for conn in [c for c in self._conns if c.phase != "busy" and c.deadline <= now]:
            if conn.phase in ("head", "body"):
                self.app.count(self._label(conn), "timeout")
                send_now(conn.sock, plain_response(408, "request not received in time\n"))
            elif conn.phase == "idle":
                self.app.count_connection("idle_timeout")
            elif conn.phase in ("new", "sniff", "handshake"):
                self.app.count_connection("timeout")
            self._close(conn)

    # -- a worker -----------------------------------------------------------------------------------

    def _serve(self, conn: Conn) -> None:
        assert conn.request is not None and conn.work is not None
        body, conn.chunks = b"".join(conn.chunks), []
        try:
            reply = self.app.handle(conn.request, body, conn.work.lane)
        except Exception:  # a bug: answered 500, counted, logged with its traceback
            self.log.exception("%s: unexpected error handling %s from %s", self.name, conn.request.path, conn.peer)
            self.app.count(self._label(conn), "error")
            reply = Reply(500, b"internal error\n")
        finally:
            self._release(conn)
        del body
        self._returned.append((conn, self._write(conn, reply)))
        self._wake()

    def _write(self, conn: Conn, reply: Reply) -> bool:
        """Send the reply (blocking, within read_timeout_s); True when the connection may serve another request."""
        data = framed(conn, reply)
        if data is None:
            return False
        try:
            conn.sock.settimeout(self.limits.read_timeout_s)
            conn.sock.sendall(data)
            conn.sock.setblocking(False)
        except GONE as exc:
            self.app.count_connection("client_gone")
            self.log.debug("%s: client %s went away before its reply: %s", self.name, conn.peer, exc)
            return False
        if conn.http.our_state is not h11.DONE or conn.http.their_state is not h11.DONE:
            return False
        conn.http.start_next_cycle()
        return True

    # -- helpers ------------------------------------------------------------------------------------

    def _label(self, conn: Conn) -> str:
        if conn.request is not None:
            return self.app.label(conn.request.path)
        m = _REQUEST_LINE.match(bytes(conn.head))
        return self.app.label(m.group(1).decode("latin-1") if m else None)

    def _refuse(self, conn: Conn, refusal: Refuse) -> None:
        """Answer a refusal, count it and close the connection after a lingering read."""
        self.app.count(self._label(conn), refusal.outcome)
        self._release(conn)
        send_now(conn.sock, plain_response(refusal.status, refusal.text, refusal.headers))
        conn.chunks = []
        self._linger(conn)

    def _gone(self, conn: Conn, why: object) -> None:
        if conn.phase in ("head", "body"):
            self.app.count(self._label(conn), "client_gone")
        else:
            self.app.count_connection("client_gone")
        self.log.debug("%s: client %s went away: %s", self.name, conn.peer, why)
        self._close(conn)
