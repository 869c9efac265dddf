"""OtlpSender: bounded in items and in bytes (the shared ByteBudget), in-flight bytes held, deadlines kept."""

from __future__ import annotations

import threading
import time

import pytest

from aaco.contract.budget import ByteBudget
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, EXPORT_ERRORS, Stats
from aaco.exporters.otlp_sender import QUEUE_BYTES, OtlpSender
from aaco.exporters.otlp_settings import OtlpTarget
from aaco.exporters.otlp_transport import SendResult

TARGET = OtlpTarget("traces", "grpc", "127.0.0.1:1", False, timeout_s=10.0)
COMPONENT = "exporter:otlp"


class FakeTransport:
    """An in-memory transport: answers from a script, or hangs like a server that accepts and never answers."""

    def __init__(self, script=(), hang=False, cancel_on_close=True):
        self.script = list(script)
        self.hang = hang
        self.cancel_on_close = cancel_on_close
        self.sent: list[bytes] = []
        self.timeouts: list[float] = []
        self.gate = threading.Event()  # set: sends go through (when not hanging)
        self.gate.set()
        self.entered = threading.Event()
        self.closed = threading.Event()
        self.answer = threading.Event()  # set: a hanging HTTP-like request finally ends

    def send(self, payload: bytes, timeout_s: float) -> SendResult:
        self.timeouts.append(timeout_s)
        self.entered.set()
        if self.hang:
            if self.cancel_on_close:  # gRPC: closing the channel ends the call at once
                self.closed.wait(timeout_s)
            else:  # HTTP: only its timeout ends it (or the test, to end sooner)
                self.answer.wait(timeout_s)
            return SendResult(False, True, None, "no answer")
        self.gate.wait(30)
        if self.script:
            return self.script.pop(0)
        self.sent.append(payload)
        return SendResult(True)

    def close(self) -> None:
        self.closed.set()


def sender(transport=None, limit=10**9, queue_max_items=10**6):
    stats = Stats()
    budget = ByteBudget(limit, stats)
    transport = transport or FakeTransport()
    s = OtlpSender(TARGET, stats, COMPONENT, queue_max_items, 60.0, transport=transport, budget=budget)
    return s, stats, budget


def wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_queue_is_bounded_in_bytes_and_drops_its_own_oldest():
    s, stats, budget = sender(limit=1000)
    for i in range(10):
        s.enqueue(bytes([i]) * 300, 1)
    assert budget.held_by("otlp") == 900 and s.queued_bytes == 900 and s.queued == 3
    assert stats.get(QUEUE_BYTES, queue="otlp") == 900
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="memory_budget") == 7
    t = s._transport
    s.start()
    assert s.force_flush(10)
    assert [p[0] for p in t.sent] == [7, 8, 9]  # the newest were kept
    assert budget.held == 0 and stats.get(EVENTS_EMITTED, component=COMPONENT) == 3
    s.shutdown(1)


def test_other_holders_over_the_budget_make_the_sender_drop_only_its_own():
    s, stats, budget = sender(limit=1000)
    budget.acquire("assembly", 900)
    s.enqueue(b"x" * 300, 4)  # 1200 held: the sender gives up its own (the new request), not the assembly's
    assert s.queued == 0 and budget.held_by("otlp") == 0 and budget.held_by("assembly") == 900
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="memory_budget") == 4


def test_over_the_memory_limit_the_sender_sheds_its_older_half_and_forgets_its_shedder_at_shutdown():
    s, stats, budget = sender(limit=10_000)
    for i in range(8):
        s.enqueue(bytes([i]) * 100, 2)
    budget.shed()  # what the memory guard does over the hard limit
    assert s.queued_bytes == 400 and [p[0] for p, _ in s._queue] == [4, 5, 6, 7]
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="memory_limit") == 8
    s.shutdown(0.1)
    budget.shed()
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="memory_limit") == 8


def test_the_item_bound_stays():
    s, stats, budget = sender(queue_max_items=5)
    for _ in range(3):
        s.enqueue(b"y" * 10, 3)
    assert s.queued == 3 and budget.held_by("otlp") == 10
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="queue_full") == 6


def test_bytes_are_held_while_in_flight_and_through_retries_then_released():
    retry = SendResult(False, True, 0.01, "unavailable")
    t = FakeTransport(script=[retry, retry])
    t.gate.clear()
    s, stats, budget = sender(t)
    s.start()
    s.enqueue(b"z" * 500, 2)
    wait(t.entered.is_set)
    assert s.queued_bytes == 0 and s.in_flight == 2 and budget.held_by("otlp") == 500  # in flight: still held
    t.gate.set()
    assert s.force_flush(10)
    assert budget.held == 0 and stats.get(EXPORT_ERRORS, exporter="otlp") == 2
    assert stats.get(EVENTS_EMITTED, component=COMPONENT) == 2
    s.shutdown(1)


def test_retries_are_at_most_retry_max_interval_s_apart():
    """Eight failures without a server-given delay: with the default 16 s cap they would take over a minute."""
    t = FakeTransport(script=[SendResult(False, True, None, "unavailable")] * 8)
    stats = Stats()
    target = OtlpTarget("traces", "grpc", "127.0.0.1:1", False, timeout_s=10.0, retry_max_interval_s=0.02)
    s = OtlpSender(target, stats, COMPONENT, 10**6, 60.0, transport=t, budget=ByteBudget(10**9, stats))
    s.start()
    s.enqueue(b"b" * 10, 1)
    assert s.force_flush(10)
    assert stats.get(EXPORT_ERRORS, exporter="otlp") == 8 and stats.get(EVENTS_EMITTED, component=COMPONENT) == 1
    s.shutdown(1)


def test_a_request_given_up_releases_its_bytes():
    t = FakeTransport(script=[SendResult(False, False, None, "HTTP 400")])
    s, stats, budget = sender(t)
    s.start()
    s.enqueue(b"r" * 100, 5)
    assert s.force_flush(10)
    assert budget.held == 0 and stats.get(EVENTS_DROPPED, component=COMPONENT, reason="rejected") == 5
    s.shutdown(1)


@pytest.mark.parametrize("cancel_on_close", [True, False], ids=["grpc-like", "http-like"])
def test_shutdown_keeps_its_deadline_against_an_upstream_that_never_answers(cancel_on_close):
    t = FakeTransport(hang=True, cancel_on_close=cancel_on_close)
    s, stats, budget = sender(t)
    s.start()
    for _ in range(3):
        s.enqueue(b"h" * 100, 10)
    wait(t.entered.is_set)  # the first request is in flight with the full 10 s timeout
    started = time.monotonic()
    s.shutdown(0.5)
    assert time.monotonic() - started < 0.5 + 5  # the deadline plus a fixed slack, never the 10 s timeout
    assert t.closed.is_set()
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="shutdown") == 30  # queued and in flight
    assert budget.held == 0 and s.queued == 0
    assert all(timeout <= 0.5 for timeout in t.timeouts[1:])  # once closing, sends are capped by the time left
    t.answer.set()
    s._thread.join(15)
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="shutdown") == 30  # the late outcome not counted
    assert stats.get(EVENTS_EMITTED, component=COMPONENT) == 0


def test_after_close_requests_are_refused_and_counted():
    s, stats, budget = sender()
    s.close(time.monotonic() + 1)
    s.enqueue(b"late", 3)
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="shutdown") == 3 and budget.held == 0
    s.shutdown(1)
    s.shutdown(1)  # idempotent
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="shutdown") == 3


def test_once_closed_sends_and_backoffs_are_capped_by_the_time_left():
    t = FakeTransport(script=[SendResult(False, True, 0.05, "busy"), SendResult(False, True, 30.0, "busy")])
    s, stats, budget = sender(t)
    s.enqueue(b"c" * 10, 4)
    s.close(time.monotonic() + 2.0)
    s.start()
    assert s.force_flush(15)  # the 30 s backoff the server asked for ends at the deadline: given up, not waited out
    assert len(t.timeouts) == 2 and all(timeout <= 2.0 for timeout in t.timeouts)
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="shutdown") == 4 and budget.held == 0
    s.shutdown(1)
