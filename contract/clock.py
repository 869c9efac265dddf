"""Clock conversion: every timestamp leaves a source as Unix-epoch nanoseconds (docs/architecture.md, Event schemas).

rocprofv3 and HSA stamp CLOCK_BOOTTIME; to convert, the offset between the two clocks is sampled
by bracketing: read the epoch clock, then BOOTTIME, then the epoch clock again, many times, and
keep the pair with the tightest bracket. The offset is the bracket's midpoint minus BOOTTIME and
its uncertainty is half the bracket's width. Sources record the offset they used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

NS_PER_US = 1_000
# Epoch nanoseconds a converted event time must lie in: 1990-01-01 and 2100-01-01 (UTC). Outside,
# the time is damage or a wrong clock conversion: counted and left out, never stored as 1970 or wrapped.
EPOCH_FLOOR_NS = 631_152_000 * 10**9
EPOCH_CEIL_NS = 4_102_444_800 * 10**9
INT64_MAX = (1 << 63) - 1
UINT64_MAX = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class ClockOffset:
    """``epoch_ns = clock_ns + offset_ns``, how it was found, and how sure it is."""

    offset_ns: int
    uncertainty_ns: int
    method: str  # "boottime-bracket", "kineto-baseTimeNanoseconds", "ort-profiling-start", ...

    def to_dict(self) -> dict[str, object]:
        """Plain form for logs and the lake's source records."""
        return {"offset_ns": self.offset_ns, "uncertainty_ns": self.uncertainty_ns, "method": self.method}


def boottime_offset(samples: int = 32) -> ClockOffset:
    """Offset from CLOCK_BOOTTIME to the epoch clock, sampled by bracketing (tightest of ``samples``)."""
    best_width = None
    best_offset = 0
    for _ in range(samples):
        t0 = time.time_ns()
        boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        t1 = time.time_ns()
        width = t1 - t0
        if best_width is None or width < best_width:
            best_width = width
            best_offset = (t0 + width // 2) - boot
    return ClockOffset(best_offset, (best_width or 0) // 2, "boottime-bracket")


def us_to_ns(values: np.ndarray) -> np.ndarray:
    """Microseconds (int or float, as trace formats store them) to int64 nanoseconds, rounded."""
    if values.dtype.kind in "iu":
        return values.astype(np.int64) * NS_PER_US
    # Split whole and fractional microseconds: whole * 1000 stays exact in int64, while
    # float64 * 1000 would pass 2**53 for epoch microseconds and lose up to ~128 ns.
    v = values.astype(np.float64)
    whole = np.floor(v)
    return whole.astype(np.int64) * NS_PER_US + np.rint((v - whole) * NS_PER_US).astype(np.int64)


def in_epoch_range(ns: np.ndarray) -> np.ndarray:
    """Mask of epoch-ns times inside [``EPOCH_FLOOR_NS``, ``EPOCH_CEIL_NS``) (see the constants)."""
    a = np.asarray(ns)
    return (a >= EPOCH_FLOOR_NS) & (a < EPOCH_CEIL_NS)


def fits_int64(value: int) -> bool:
    """Whether a Python int fits a signed 64-bit column (ids beyond it are bad events, not exceptions)."""
    return -INT64_MAX - 1 <= value <= INT64_MAX
