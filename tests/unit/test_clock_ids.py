"""Clock conversion (BOOTTIME bracketing, microseconds to ns) and deterministic trace/span IDs."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from aaco.contract import ids
from aaco.contract.clock import ClockOffset, boottime_offset, us_to_ns
from aaco.contract.ids import span_id, trace_id

# --- clock ---------------------------------------------------------------------------------------------


def test_boottime_offset_is_plausible():
    off = boottime_offset()
    # an independent bracket: the true offset lies between t0 - boot and t1 - boot
    t0 = time.time_ns()
    boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    t1 = time.time_ns()
    slack = off.uncertainty_ns + 2_000_000  # NTP may slew the epoch clock a little between the two readings
    assert t0 - boot - slack <= off.offset_ns <= t1 - boot + slack
    assert off.method == "boottime-bracket"
    assert 0 <= off.uncertainty_ns < 10_000_000  # the tightest of 32 brackets is microseconds wide at worst


def test_boottime_offset_single_sample():
    off = boottime_offset(samples=1)
    assert off.uncertainty_ns >= 0
    assert off.offset_ns > 1_000_000_000 * 1_000_000_000  # after 2001 in epoch ns


def test_clock_offset_to_dict():
    assert ClockOffset(5, 2, "m").to_dict() == {"offset_ns": 5, "uncertainty_ns": 2, "method": "m"}


def test_us_to_ns_int_arrays_are_exact():
    out = us_to_ns(np.array([0, 1, -2, 4_203_669_603_454], dtype=np.int64))
    assert out.dtype == np.int64
    assert out.tolist() == [0, 1000, -2000, 4_203_669_603_454_000]


def test_us_to_ns_small_int_dtypes_do_not_overflow():
    out = us_to_ns(np.array([3_000_000], dtype=np.int32))
    assert out.dtype == np.int64
    assert out.tolist() == [3_000_000_000]
    assert us_to_ns(np.array([4_000_000_000], dtype=np.uint32)).tolist() == [4_000_000_000_000]


def test_us_to_ns_float_arrays_round_to_nearest():
    # 4203669603454.206 is a real ROCm Kineto ts (relative to baseTimeNanoseconds)
    vals = np.array([1.0, 2.0004, 2.0006, -1.5, 0.25, 4203669603454.206])
    out = us_to_ns(vals)
    assert out.dtype == np.int64
    assert out.tolist() == [1000, 2000, 2001, -1500, 250, 4203669603454206]


def test_us_to_ns_epoch_microsecond_floats_are_exact():
    vals = np.array([1695835572943613.0, 1695835572943613.25])
    assert us_to_ns(vals).tolist() == [1695835572943613000, 1695835572943613250]


def test_us_to_ns_float32_input():
    out = us_to_ns(np.array([1.5], dtype=np.float32))
    assert out.tolist() == [1500]


@given(st.lists(st.integers(min_value=-(2**40), max_value=2**40), max_size=20))
def test_us_to_ns_float_of_integer_values_equals_int_path(values):
    ints = np.array(values, dtype=np.int64)
    assert us_to_ns(ints.astype(np.float64)).tolist() == us_to_ns(ints).tolist() == [v * 1000 for v in values]


# --- ids -----------------------------------------------------------------------------------------------

HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def test_ids_are_deterministic_and_sized():
    t1, t2 = trace_id("node", "file", 3), trace_id("node", "file", 3)
    s1, s2 = span_id("node", "file", 3), span_id("node", "file", 3)
    assert t1 == t2
    assert s1 == s2
    assert HEX32.match(t1)
    assert HEX16.match(s1)


def test_different_inputs_give_different_ids():
    assert trace_id("n", "f", 1) != trace_id("n", "f", 2)
    assert trace_id("n", "f", 1) != trace_id("m", "f", 1)
    # parts are separated, not concatenated
    assert trace_id("ab", "c") != trace_id("a", "bc")
    assert span_id("ab", "c") != span_id("a", "bc")
    # order matters
    assert trace_id("a", "b") != trace_id("b", "a")
    # a span ID is not a prefix of the trace ID of the same parts (different digest sizes)
    assert not trace_id("x").startswith(span_id("x"))


@given(st.lists(st.one_of(st.text(max_size=8), st.integers()), max_size=4))
def test_ids_always_valid(parts):
    t, s = trace_id(*parts), span_id(*parts)
    assert HEX32.match(t)
    assert HEX16.match(s)
    assert int(t, 16) != 0
    assert int(s, 16) != 0


def test_ids_handle_lone_surrogates():
    assert HEX32.match(trace_id("\udcff"))


def test_all_zero_digest_is_replaced(monkeypatch):
    class Zero:
        def __init__(self, digest_size: int, person: bytes) -> None:
            self.size = digest_size

        def update(self, data: bytes) -> None:
            pass

        def hexdigest(self) -> str:
            return "00" * self.size

    monkeypatch.setattr(ids.hashlib, "blake2b", Zero)
    assert trace_id("x") == "0" * 31 + "1"
    assert span_id("x") == "0" * 15 + "1"


@pytest.mark.parametrize("fn", [trace_id, span_id])
def test_no_parts_still_valid(fn):
    assert int(fn(), 16) != 0
