"""The shared HTTP loop (contract/http_loop.py) with an app of the test's own: lanes, answers, bounds, eviction."""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from aaco.contract.http_app import Answer, Head, Lane, Limits, Refuse, Reply, Work
from aaco.contract.http_loop import LoopServer


class App:
    """/slow waits for ``release`` in the ``slow`` lane; /now is answered from the loop; /no is refused."""

    def __init__(self) -> None:
        self.release_slow = threading.Event()
        self.counts: Counter[tuple[str, str]] = Counter()
        self.connections: Counter[str] = Counter()
        self.reserved = 0

    def label(self, path: str | None) -> str:
        return path or "?"

    def admit(self, head: Head) -> Refuse | Answer | Work:
        if head.path == "/now":
            return Answer(Reply(200, b"now"))
        if head.path == "/no":
            return Refuse(403, "forbidden", "no\n")
        self.reserved += 10
        return Work("slow" if head.path == "/slow" else "fast", max_body=100, reserved=10)

    def handle(self, head: Head, body: bytes, lane: str) -> Reply:
        if lane == "slow":
            self.release_slow.wait(30)
        return Reply(200, lane.encode() + b":" + body)

    def release(self, reserved: int) -> None:
        self.reserved -= reserved

    def count(self, label: str, outcome: str) -> None:
        self.counts[label, outcome] += 1

    def count_connection(self, outcome: str) -> None:
        self.connections[outcome] += 1

    def tls(self) -> ssl.SSLContext | None:
        return None

    def check_peer(self, sock: ssl.SSLSocket) -> str | None:
        return None


@contextmanager
def serving(
    max_connections: int = 8, per_peer: int = 8, read_timeout_s: float = 5.0
) -> Iterator[tuple[LoopServer, App]]:
    app = App()
    lanes = {"slow": Lane(1, 1), "fast": Lane(2, 4)}
    server = LoopServer("test", "127.0.0.1", 0, Limits(max_connections, per_peer, read_timeout_s, 30.0), lanes, app)
    server.bind()
    server.start()
    try:
        yield server, app
    finally:
        app.release_slow.set()
        server.stop(5)


def connect(server: LoopServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def get(path: str, body: bytes = b"", close: bool = False) -> bytes:
    extra = "Connection: close\r\n" if close else ""
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + body


def read_until_closed(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "not in time"
        time.sleep(0.01)


def test_answers_from_the_loop_and_lanes_serve_pipelined_requests_in_order():
    with serving() as (server, app), connect(server) as sock:
        sock.sendall(get("/now") + get("/fast", b"abc") + get("/now", close=True))
        got = read_until_closed(sock)
    assert got.count(b"HTTP/1.1 200 ") == 3
    assert got.index(b"now") < got.index(b"fast:abc") < got.rindex(b"now")
    assert app.reserved == 0


def test_a_refusal_is_answered_counted_and_closed():
    with serving() as (server, app), connect(server) as sock:
        sock.sendall(get("/no"))
        assert read_until_closed(sock).startswith(b"HTTP/1.1 403 ")
    assert app.counts["/no", "forbidden"] == 1


def test_a_full_lane_answers_503_at_once_and_gives_the_reservation_back():
    with serving() as (server, app):
        held = [connect(server), connect(server)]
        held[0].sendall(get("/slow"))  # at work in the slow lane's one thread
        wait_for(lambda: app.reserved == 10)
        held[1].sendall(get("/slow"))  # waits in its queue of one
        wait_for(lambda: app.reserved == 20)
        with connect(server) as third:
            third.sendall(get("/slow"))
            assert read_until_closed(third).startswith(b"HTTP/1.1 503 ")
        assert app.counts["/slow", "busy"] == 1 and app.reserved == 20
        app.release_slow.set()
        for sock in held:
            assert sock.recv(64).startswith(b"HTTP/1.1 200 ")
            sock.close()
    assert app.reserved == 0


def test_at_the_bound_the_stalled_go_first_and_a_new_one_is_refused_only_when_all_are_at_work():
    with serving(max_connections=3) as (server, app):
        stalled = connect(server)
        stalled.sendall(b"POST /fast HTTP/1.1\r\n")  # half a head
        quiet = connect(server)  # connected, nothing sent yet
        busy = connect(server)
        busy.sendall(get("/slow"))
        wait_for(lambda: app.reserved == 10)
        with connect(server) as fourth:
            fourth.sendall(get("/now", close=True))
            assert read_until_closed(fourth).startswith(b"HTTP/1.1 200 ")
        assert stalled.recv(1) == b"", "the stalled head went first, before the quiet new connection"
        assert app.connections["evicted"] == 1
        with connect(server) as fifth:
            fifth.sendall(get("/now", close=True))
            assert read_until_closed(fifth).startswith(b"HTTP/1.1 200 ")
        assert quiet.recv(1) == b"", "then the quiet one"
        busy.close()


def test_a_new_connection_is_refused_only_when_every_one_at_the_bound_is_at_work():
    with serving(max_connections=2) as (server, app):
        held = [connect(server), connect(server)]
        for sock in held:
            sock.sendall(get("/slow"))  # one at work, one queued: neither can be closed to make room
        wait_for(lambda: app.reserved == 20)
        with connect(server) as third:
            assert read_until_closed(third).startswith(b"HTTP/1.1 503 ")
        assert app.connections["too_many_connections"] == 1 and app.connections["evicted"] == 0
        for sock in held:
            sock.close()


def test_a_connection_that_sends_nothing_is_closed_at_the_read_deadline():
    with serving(read_timeout_s=0.3) as (server, app), connect(server) as sock:
        assert sock.recv(1) == b""
        wait_for(lambda: app.connections["timeout"] == 1)
