"""The bounded bus: two bounds, offer vs put, drop reasons, FIFO, gauges."""

from __future__ import annotations

import threading
from collections import deque

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aaco.agent.pipeline.bus import Bus
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, EVENTS_RECEIVED, QUEUE_CAPACITY, QUEUE_DEPTH, Stats


def batch(rows: int, source: str = "src", tag: int = 0) -> EventBatch:
    """A telemetry batch of ``rows`` rows; ``tag`` goes in ts_ns so batches can be told apart."""
    b = conform(
        "telemetry",
        {
            "ts_ns": pa.array([tag] * rows, pa.int64()),
            "node": ["n"] * rows,
            "device": ["0"] * rows,
            "metric": ["m"] * rows,
            "value": pa.array([1.0] * rows, pa.float64()),
            "unit": ["1"] * rows,
        },
    )
    return EventBatch("telemetry", b, source)


def dropped(stats: Stats, source: str, reason: str) -> float:
    return stats.get(EVENTS_DROPPED, component=f"source:{source}", reason=reason)


def test_capacity_must_be_positive():
    with pytest.raises(ValueError):
        Bus(Stats(), max_batches=0)
    with pytest.raises(ValueError):
        Bus(Stats(), max_events=0)


def test_gauges_set_at_creation_and_follow_depth():
    s = Stats()
    bus = Bus(s, max_batches=10, max_events=100)
    assert s.get(QUEUE_CAPACITY, queue="bus") == 100
    assert s.get(QUEUE_DEPTH, queue="bus") == 0
    assert bus.capacity == 100
    bus.offer(batch(7))
    bus.offer(batch(5))
    assert bus.depth == 12
    assert s.get(QUEUE_DEPTH, queue="bus") == 12
    bus.get()
    assert bus.depth == 5
    assert s.get(QUEUE_DEPTH, queue="bus") == 5
    assert s.get(EVENTS_RECEIVED, component="bus") == 12
    assert s.get(EVENTS_EMITTED, component="bus") == 7


def test_offer_drops_when_batch_bound_reached():
    s = Stats()
    bus = Bus(s, max_batches=2, max_events=1000)
    assert bus.offer(batch(1, "a"))
    assert bus.offer(batch(1, "a"))
    assert not bus.offer(batch(3, "a"))
    assert dropped(s, "a", "queue_full") == 3
    assert bus.depth == 2


def test_offer_drops_when_event_bound_reached():
    s = Stats()
    bus = Bus(s, max_batches=100, max_events=10)
    assert bus.offer(batch(6, "a"))
    assert bus.offer(batch(4, "a"))  # exactly at capacity is fine
    assert not bus.offer(batch(1, "b"))
    assert dropped(s, "b", "queue_full") == 1
    assert dropped(s, "a", "queue_full") == 0
    assert bus.depth == 10


def test_drop_counter_is_per_source_and_reason():
    s = Stats()
    bus = Bus(s, max_batches=1, max_events=100)
    bus.offer(batch(1, "x"))
    bus.offer(batch(2, "telemetry"))
    bus.offer(batch(3, "telemetry"))
    bus.offer(batch(4, "ort"))
    assert dropped(s, "telemetry", "queue_full") == 5
    assert dropped(s, "ort", "queue_full") == 4
    assert s.total(EVENTS_DROPPED) == 9


def test_oversized_batch_admitted_into_empty_bus_only():
    s = Stats()
    bus = Bus(s, max_batches=4, max_events=10)
    assert bus.offer(batch(50, "big"))
    assert bus.depth == 50
    assert not bus.offer(batch(1, "small"))
    assert dropped(s, "small", "queue_full") == 1
    assert bus.get().rows == 50
    assert bus.offer(batch(1, "small"))
    # and another oversized one no longer fits next to it
    assert not bus.offer(batch(50, "big"))
    assert dropped(s, "big", "queue_full") == 50


def test_oversized_batch_put_does_not_deadlock():
    bus = Bus(Stats(), max_batches=4, max_events=10)
    assert bus.put(batch(50), timeout_s=0.01)


def test_get_is_fifo_and_times_out_when_empty():
    bus = Bus(Stats(), max_batches=10, max_events=100)
    for tag in range(5):
        bus.offer(batch(1, tag=tag))
    got = [bus.get().batch.column("ts_ns")[0].as_py() for _ in range(5)]
    assert got == [0, 1, 2, 3, 4]
    assert bus.get(timeout_s=0.01) is None


def test_get_wakes_when_a_batch_arrives():
    bus = Bus(Stats(), max_batches=10, max_events=100)
    out = []
    t = threading.Thread(target=lambda: out.append(bus.get(timeout_s=30)))
    t.start()
    bus.offer(batch(3, tag=42))
    t.join(30)
    assert not t.is_alive()
    assert out[0] is not None
    assert out[0].rows == 3


def test_put_waits_for_room_then_enqueues():
    s = Stats()
    bus = Bus(s, max_batches=1, max_events=100)
    assert bus.put(batch(1, tag=1))
    result = []
    t = threading.Thread(target=lambda: result.append(bus.put(batch(2, "p", tag=2))))
    t.start()
    t.join(0.2)
    assert t.is_alive(), "put returned although the bus was full"
    first = bus.get(timeout_s=5)
    t.join(30)
    assert not t.is_alive()
    assert result == [True]
    assert first.batch.column("ts_ns")[0].as_py() == 1
    assert bus.get(timeout_s=5).batch.column("ts_ns")[0].as_py() == 2
    assert s.total(EVENTS_DROPPED) == 0


def test_put_gives_up_on_stop_event():
    s = Stats()
    bus = Bus(s, max_batches=1, max_events=100)
    bus.put(batch(1))
    stop = threading.Event()
    result = []
    t = threading.Thread(target=lambda: result.append(bus.put(batch(4, "f"), stop=stop)))
    t.start()
    t.join(0.2)
    assert t.is_alive()
    stop.set()
    t.join(30)
    assert result == [False]
    assert dropped(s, "f", "shutdown") == 4
    assert dropped(s, "f", "timeout") == 0
    assert bus.depth == 1


def test_put_with_stop_already_set_refuses():
    s = Stats()
    bus = Bus(s)
    stop = threading.Event()
    stop.set()
    assert not bus.put(batch(2, "f"), stop=stop)
    assert dropped(s, "f", "shutdown") == 2
    assert bus.depth == 0


def test_put_gives_up_on_timeout():
    s = Stats()
    bus = Bus(s, max_batches=1, max_events=100)
    bus.put(batch(1))
    assert not bus.put(batch(3, "f"), timeout_s=0.05)
    assert dropped(s, "f", "timeout") == 3
    assert dropped(s, "f", "shutdown") == 0
    assert bus.depth == 1


def test_close_refuses_with_reason_shutdown_and_keeps_queued():
    s = Stats()
    bus = Bus(s, max_batches=10, max_events=100)
    bus.offer(batch(2, tag=7))
    bus.close()
    assert not bus.offer(batch(3, "o"))
    assert not bus.put(batch(4, "p"), timeout_s=5)
    assert dropped(s, "o", "shutdown") == 3
    assert dropped(s, "p", "shutdown") == 4
    assert dropped(s, "o", "queue_full") == 0
    assert bus.get().batch.column("ts_ns")[0].as_py() == 7
    bus.reopen()
    assert bus.offer(batch(1))


def test_close_wakes_a_waiting_put():
    s = Stats()
    bus = Bus(s, max_batches=1, max_events=100)
    bus.put(batch(1))
    result = []
    t = threading.Thread(target=lambda: result.append(bus.put(batch(5, "w"))))
    t.start()
    t.join(0.2)
    assert t.is_alive()
    bus.close()
    t.join(30)
    assert result == [False]
    assert dropped(s, "w", "shutdown") == 5


# --- property: the bus behaves like a simple bounded FIFO model ---------------------------------------

ops = st.lists(
    st.one_of(
        st.tuples(st.just("offer"), st.integers(min_value=1, max_value=30)),
        st.tuples(st.just("get"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    max_batches=st.integers(min_value=1, max_value=5),
    max_events=st.integers(min_value=1, max_value=40),
    operations=ops,
)
def test_bus_matches_bounded_fifo_model(max_batches, max_events, operations):
    s = Stats()
    bus = Bus(s, max_batches=max_batches, max_events=max_events)
    model: deque[tuple[int, int]] = deque()
    offered = accepted = dropped_rows = 0
    for i, (op, rows) in enumerate(operations):
        if op == "offer":
            offered += rows
            events = sum(r for _, r in model)
            fits = not model or (len(model) < max_batches and events + rows <= max_events)
            assert bus.offer(batch(rows, tag=i)) == fits
            if fits:
                model.append((i, rows))
                accepted += rows
            else:
                dropped_rows += rows
        else:
            got = bus.get(timeout_s=0)
            if model:
                tag, expected_rows = model.popleft()
                assert got is not None
                assert got.batch.column("ts_ns")[0].as_py() == tag
                assert got.rows == expected_rows
            else:
                assert got is None
        depth = sum(r for _, r in model)
        assert bus.depth == depth == s.get(QUEUE_DEPTH, queue="bus")
        # the bounds hold except for a lone oversized batch
        assert len(model) <= max_batches
        assert depth <= max_events or len(model) == 1
    assert s.get(EVENTS_RECEIVED, component="bus") == accepted
    assert s.total(EVENTS_DROPPED, reason="queue_full") == dropped_rows
    assert accepted + dropped_rows == offered
