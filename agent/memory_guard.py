"""The agent's memory guard: the process's resident size held under a limit, as the Collector's memory_limiter.

Every ``CHECK_EVERY_S`` the guard reads the resident size. Above the soft limit (the hard limit
less the spike allowance) the byte budget refuses every admission, so the receiver answers 503 /
RESOURCE_EXHAUSTED with a retry delay and the agent's own work goes on; above the hard limit it also
has every holder shed what it holds (application spans waiting for their links forwarded, the
oldest requests of the export queues dropped, counted ``memory_limit``); both give freed memory back
to the OS. Below the soft limit again, admissions resume. Each crossing is said once in the log.
"""

from __future__ import annotations

import logging
import threading
from typing import Final

from aaco.contract.budget import ByteBudget
from aaco.contract.memory import Trimmer, rss_bytes
from aaco.contract.signals import define
from aaco.contract.stats import Stats

log = logging.getLogger("aaco.memory")

CHECK_EVERY_S: Final = 0.5
MIB: Final = 1024 * 1024

MEMORY_RESIDENT = define(
    "aaco.agent.memory.resident",
    "aaco_memory_resident_bytes",
    "gauge",
    "By",
    "The agent's resident memory, as its memory guard last read it.",
)
MEMORY_LIMIT = define(
    "aaco.agent.memory.limit",
    "aaco_memory_limit_bytes",
    "gauge",
    "By",
    "The memory guard's limits: soft (admissions refused above it) and hard (held data shed above it).",
    ("limit",),
)
MEMORY_LIMITER = define(
    "aaco.agent.memory.limiter",
    "aaco_memory_limiter",
    "counter",
    "{event}",
    "Memory guard actions: refuse (over the soft limit: the receiver refuses new data), shed (over the hard "
    "limit: held data forwarded or dropped), resume (back under the soft limit).",
    ("action",),
)


def limits(limit_mib: int, spike_mib: int, budget_mib: int, cgroup: int | None = None) -> tuple[int, int]:
    """(soft, hard) in bytes: the hard limit less ``spike_mib`` (0: a fifth), the soft never under half the hard.

    The hard limit is ``limit_mib``; 0: nine tenths of the container's memory limit (``cgroup``, bytes)
    where it has one, else 1024 MiB plus twice the byte budget.
    """
    if limit_mib:
        hard = limit_mib * MIB
    elif cgroup is not None:
        hard = cgroup * 9 // 10
    else:
        hard = (1024 + 2 * budget_mib) * MIB
    spike = spike_mib * MIB if spike_mib else hard // 5
    return max(hard - spike, hard // 2), hard


class MemoryGuard:
    """A thread holding the process under its memory limits (see the module docstring)."""

    def __init__(self, soft: int, hard: int, budget: ByteBudget, stats: Stats) -> None:
        self.soft, self.hard = soft, hard
        self.budget = budget
        self.stats = stats
        self._trimmer = Trimmer()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.state = "ok"  # ok, refusing, shedding
        stats.set(MEMORY_LIMIT, soft, limit="soft")
        stats.set(MEMORY_LIMIT, hard, limit="hard")
        for action in ("refuse", "shed", "resume"):
            stats.declare(MEMORY_LIMITER, action=action)

    def start(self) -> None:
        """Check in the background (no-op where the resident size cannot be read)."""
        if rss_bytes() is None:
            log.info("memory guard off: this platform has no /proc/self/statm")
            return
        self._thread = threading.Thread(target=self._run, name="aaco-memory-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop checking, and admit again."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        self.budget.refuse(None)

    def _run(self) -> None:
        while not self._stop.wait(CHECK_EVERY_S):
            rss = rss_bytes()
            if rss is not None:
                self.check(rss)

    def check(self, rss: int) -> None:
        """Act on one reading of the resident size."""
        self.stats.set(MEMORY_RESIDENT, rss)
        if rss > self.hard:
            self._enter("shedding", "shed", rss)
            self.budget.refuse("memory_limit")
            self.budget.shed()
            self._trimmer.trim()
        elif rss > self.soft:
            self._enter("refusing", "refuse", rss)
            self.budget.refuse("memory_limit")
            self._trimmer.trim()
        elif self.state != "ok":
            self._enter("ok", "resume", rss)
            self.budget.refuse(None)

    def _enter(self, state: str, action: str, rss: int) -> None:
        if action == "shed" or state != self.state:
            self.stats.inc(MEMORY_LIMITER, action=action)
        if state != self.state:
            log.warning(
                "memory: %d MiB resident (soft limit %d MiB, hard %d MiB): %s",
                rss // MIB,
                self.soft // MIB,
                self.hard // MIB,
                {"shedding": "new data refused, held data shed", "refusing": "new data refused"}.get(
                    state, "admitting again"
                ),
            )
            self.state = state
