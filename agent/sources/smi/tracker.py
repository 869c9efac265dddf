"""Sampling discipline: a fixed-rate clock that does not drift, and GPUs that come and go.

``FixedRate`` schedules sample k at ``t0 + k * interval`` on the monotonic clock: a slow sample
delays nothing after it (the next one starts at its own slot), and a sample that overran whole
slots skips them (counted) instead of firing a burst to catch up.

``GpuTracker`` remembers the GPUs it has seen (at most ``max_gpus``). Every sample reports each
known GPU: ``aaco.gpu.up`` 1 with its readings when the backend read it, 0 (and nothing else) when
it did not (it vanished, is resetting, or the whole backend call failed), plus
``hw.errors{error.type=lost}``, the number of times it went missing. A GPU that comes back is up
again with its readings. A logical device (a MIG device, an AMD partition) that is absent while
its parent GPU was read was removed (MIG reconfigured, partition mode changed): it is forgotten,
not reported down; one lost with its GPU is down with it (its loss counted, the GPU's reported).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from aaco.contract.telemetry import ERRORS, UP, GpuIdentity, GpuSample, Snapshot


class FixedRate:
    """Ticks at ``t0 + k * interval``."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self._clock = clock
        self.t0 = clock()
        self.k = 0
        self.missed = 0

    def next_delay(self) -> float:
        """Seconds until the next slot after now (advancing past slots already gone, counted in ``missed``)."""
        now = self._clock()
        k = self.k + 1
        due = self.t0 + k * self.interval_s
        if now >= due:
            late = math.floor((now - due) / self.interval_s) + 1
            self.missed += late
            k += late
            due = self.t0 + k * self.interval_s
        self.k = k
        return max(0.0, due - now)

    def wait(self, stop: threading.Event) -> bool:
        """Sleep until the next slot; True if ``stop`` was set meanwhile."""
        return stop.wait(self.next_delay())

    def run(
        self, stop: threading.Event, sample: Callable[[], int], samples: int | None, overrun: Callable[[int], None]
    ) -> None:
        """``sample()`` at every slot until ``stop`` (or ``samples`` taken); ``overrun(n)`` for slots skipped."""
        taken = 0
        while not stop.is_set():
            sample()
            taken += 1
            if samples is not None and taken >= samples:
                return
            missed = self.missed
            if self.wait(stop):
                return
            if self.missed > missed:
                overrun(self.missed - missed)


@dataclass
class Transitions:
    """What changed in one update."""

    lost: list[GpuIdentity] = field(default_factory=list)
    back: list[GpuIdentity] = field(default_factory=list)
    refused: int = 0  # GPUs beyond max_gpus


class GpuTracker:
    """Known GPUs, their up/down state and how often each went missing."""

    def __init__(self, max_gpus: int = 64) -> None:
        self.max_gpus = max_gpus
        self.known: dict[str, GpuIdentity] = {}
        self.down: set[str] = set()
        self.lost_count: dict[str, int] = {}

    def update(self, snap: Snapshot | None) -> tuple[list[GpuSample], Transitions]:
        """The samples to publish for this round (``snap`` None: the backend call failed)."""
        t = Transitions()
        out: list[GpuSample] = []
        present = {g.gpu.index: g for g in snap.gpus} if snap is not None else {}
        for idx, g in present.items():
            if idx not in self.known and len(self.known) >= self.max_gpus:
                t.refused += 1
                continue
            self.known[idx] = g.gpu
            if idx in self.down:
                self.down.discard(idx)
                t.back.append(g.gpu)
            g.add(UP, 1.0)
            g.add(ERRORS, float(self.lost_count.get(idx, 0)), error_type="lost")
            out.append(g)
        gone = [i for i, g in self.known.items() if i not in present and g.parent and g.parent in present]
        for idx in gone:  # a logical device removed from a GPU that answers: not lost
            del self.known[idx]
            self.down.discard(idx)
            self.lost_count.pop(idx, None)
        for idx, gpu in self.known.items():
            if idx in present:
                continue
            if idx not in self.down:
                self.down.add(idx)
                self.lost_count[idx] = self.lost_count.get(idx, 0) + 1
                if not gpu.parent or gpu.parent not in self.known or gpu.parent in present:
                    t.lost.append(gpu)  # a logical device lost with its GPU: the GPU's loss is the one said
            s = GpuSample(gpu)
            s.add(UP, 0.0)
            s.add(ERRORS, float(self.lost_count[idx]), error_type="lost")
            out.append(s)
        return out, t
