"""The pipeline worker sleeps until work is due: held kernels, a snapshot, or the exporters' tick."""

from __future__ import annotations

import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.pipeline.correlator import Correlator
from aaco.agent.pipeline.worker import MAX_IDLE_WAIT_S, MIN_IDLE_WAIT_S, Pipeline
from aaco.contract.stats import Stats
from aaco.exporters.testing import InMemoryExporter

from .builders import item, iterations, kernels


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def pipeline(clock: FakeClock, snapshot_interval_s: float = 5.0) -> Pipeline:
    stats = Stats()
    corr = Correlator(stats, hold_s=2.0, clock=clock)
    return Pipeline(Bus(stats), corr, [], [InMemoryExporter()], stats, "n1", snapshot_interval_s, clock=clock)


def test_idle_wait_is_bounded_when_nothing_is_due():
    clock = FakeClock()
    p = pipeline(clock)
    p.publish_snapshot()
    assert p.idle_wait() == MAX_IDLE_WAIT_S


def test_idle_wait_ends_when_the_snapshot_of_new_data_is_due():
    clock = FakeClock()
    p = pipeline(clock, snapshot_interval_s=0.4)
    p.publish_snapshot()
    p.dispatch(item("iterations", iterations([(1, 2)])))
    clock.now += 0.1
    assert p.idle_wait() == pytest.approx(0.15)  # the idle gap is 0.25 s (IDLE_SNAPSHOT_GAP_S)
    clock.now += 1.0  # overdue: never zero, so work that waits on something else does not spin
    assert p.idle_wait() == MIN_IDLE_WAIT_S


def test_idle_wait_ends_when_a_held_kernel_is_due():
    clock = FakeClock()
    p = pipeline(clock)
    p.publish_snapshot()
    p.correlator.process(item("iterations", iterations([(1000, 2000)])))
    assert p.correlator.release_in() is None
    p.correlator.process(item("kernels", kernels([5000])))  # newer than every iteration: held 2 s
    clock.now += 1.8
    assert p.correlator.release_in() == pytest.approx(0.2)
    p.publish_snapshot()
    assert p.idle_wait() == pytest.approx(0.2)
    clock.now += 0.2
    p.step(0.0)
    assert p.correlator.pending_events == 0
    assert p.correlator.release_in() is None


def test_a_closed_empty_bus_answers_at_once():
    bus = Bus(Stats())
    bus.close()
    assert bus.get(timeout_s=3600) is None
