"""Energy per workload on a shared GPU (contract/energy.py): Kepler's split of the energy above idle by activity."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aaco.contract.energy import APPORTIONED, MEASURED, EnergyLedger, apportion

S = 10**9


def test_two_processes_share_the_energy_above_idle_by_activity():
    """A GPU draws 300 W for 10 s with a 60 W idle line: 2,400 J dynamic, split 3:1 by SM activity."""
    parts = apportion(3000.0, 60.0, 10.0, {"a": 0.6, "b": 0.2})
    assert parts == pytest.approx({"a": 1800.0, "b": 600.0})
    assert sum(parts.values()) == pytest.approx(3000.0 - 600.0, rel=0.01)


def test_an_idle_gpu_apportions_nothing_and_below_idle_is_idle():
    assert apportion(3000.0, 60.0, 10.0, {"a": 0.0, "b": 0.0}) == {"a": 0.0, "b": 0.0}
    assert apportion(500.0, 60.0, 10.0, {"a": 0.5}) == {"a": 0.0}  # under the idle line: no dynamic energy
    assert apportion(100.0, 0.0, 1.0, {"a": -1.0, "b": 1.0}) == {"a": 0.0, "b": 100.0}


@given(
    energy=st.floats(0, 1e6),
    idle=st.floats(0, 1000),
    interval=st.floats(0.001, 60),
    activity=st.dictionaries(st.text(min_size=1, max_size=4), st.floats(0, 1), min_size=1, max_size=8),
)
def test_the_parts_add_up_to_the_energy_above_idle(energy, idle, interval, activity):
    parts = apportion(energy, idle, interval, activity)
    dynamic = max(0.0, energy - idle * interval)
    if sum(activity.values()) > 0:
        assert sum(parts.values()) == pytest.approx(dynamic, rel=1e-9, abs=1e-9)
    assert all(v >= 0 for v in parts.values())


def test_the_ledger_follows_the_counter_and_its_resets():
    ledger = EnergyLedger()
    ledger.observe("gpu0", 0, 1000.0, 50.0, {})
    ledger.observe("gpu0", 10 * S, 4000.0, 50.0, {"pod-a": 0.5, "pod-b": 0.25})  # 3000 J, 500 J idle
    assert ledger.totals("gpu0") == pytest.approx(
        {("pod-a", APPORTIONED): 2500 * 2 / 3, ("pod-b", APPORTIONED): 2500 / 3}
    )
    ledger.observe("gpu0", 20 * S, 100.0, 50.0, {"pod-a": 1.0})  # a driver reload: starts over
    ledger.observe("gpu0", 30 * S, 1100.0, 50.0, {"pod-a": 1.0})  # 1000 J, 500 J idle
    a_total = ledger.totals("gpu0")[("pod-a", APPORTIONED)]
    assert a_total == pytest.approx(2500 * 2 / 3 + 500)
    idle, dynamic = ledger.device_totals("gpu0")
    assert (idle, dynamic) == pytest.approx((1000.0, 3000.0))  # every joule above the first reading, once


def test_bounded():
    ledger = EnergyLedger(max_devices=2, max_workloads=2)
    ledger.observe("g", 0, 0.0, 0.0, {})
    ledger.observe("g", S, 30.0, 0.0, {"a": 1.0, "b": 1.0, "c": 1.0})
    assert len(ledger.totals("g")) == 2 and ledger.dropped == 1
    for d in ("x", "y"):
        ledger.observe(d, 0, 0.0, 0.0, {})
    assert ledger.totals("g") == {} and ledger.dropped == 2


def test_a_workload_alone_on_a_whole_device_is_measured_idle_included():
    ledger = EnergyLedger()
    ledger.observe("gpu0", 0, 0.0, 50.0, {"pod-a": 0.2}, exclusive=True)
    ledger.observe("gpu0", 10 * S, 900.0, 50.0, {"pod-a": 0.2}, exclusive=True)
    assert ledger.totals("gpu0") == {("pod-a", MEASURED): 900.0}
    ledger.observe("gpu0", 20 * S, 1800.0, 50.0, {"pod-a": 0.2, "pod-b": 0.2}, exclusive=True)  # shared now
    assert ledger.totals("gpu0")[("pod-b", APPORTIONED)] == pytest.approx(200.0)
    assert ledger.device_totals("gpu0") == pytest.approx((500.0, 1300.0))
