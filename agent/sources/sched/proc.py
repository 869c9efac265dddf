"""The ``/proc`` backend of the ``sched`` source: no root, no BPF, no bcc needed.

Every interval it reads, for each thread of each target process,
``/proc/<pid>/task/<tid>/schedstat`` (ns on CPU, ns waiting on a runqueue, timeslices),
``status`` (voluntary and nonvoluntary context switches) and ``stat`` (name, minor and major
faults, start time), and publishes the deltas. What it cannot see, compared with eBPF:

- the runqueue latency distribution: each thread's mean wait per timeslice over the interval is
  counted once per timeslice in the log2 histogram, so quantiles are of per-interval means;
- off-CPU time caused by page faults (the fault penalty index weights by major faults instead);
- the last increments of a thread that exits between two reads, and off-CPU intervals.

A thread seen for the first time counts from zero when it started after the previous read,
otherwise it only sets the baseline. Off-CPU time is the thread's wall time in the interval less
its CPU time, for sleeping threads too (eBPF credits a sleep when it ends; totals agree over
time). All reads tolerate processes vanishing mid-way.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from aaco.contract.sched import (
    FAULTS,
    INVOLUNTARY,
    MAJOR_FAULTS,
    OFFCPU,
    ONCPU,
    RQ_WAIT,
    RQ_WAITS,
    VOLUNTARY,
    Drain,
    ThreadDeltas,
    log2_slot,
)

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class ThreadReading:
    """Cumulative counters of one thread at one moment."""

    tgid: int
    comm: str
    run_ns: int
    wait_ns: int
    slices: int
    voluntary: int
    involuntary: int
    minflt: int
    majflt: int
    start_ns: int  # CLOCK_BOOTTIME ns


def parse_stat(text: str) -> tuple[str, int, int, int]:
    """``/proc/.../stat``: (comm, minflt, majflt, starttime in clock ticks); comm may hold spaces and parens."""
    head, _, rest = text.rpartition(")")
    comm = head.partition("(")[2]
    fields = rest.split()
    # fields[0] is field 3 (state): field N is fields[N - 3].
    return comm, int(fields[7]), int(fields[9]), int(fields[19])


def parse_status_switches(text: str) -> tuple[int, int]:
    """``/proc/.../status``: (voluntary_ctxt_switches, nonvoluntary_ctxt_switches)."""
    vol = invol = 0
    for line in text.splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            vol = int(line.split()[1])
        elif line.startswith("nonvoluntary_ctxt_switches:"):
            invol = int(line.split()[1])
    return vol, invol


def read_thread(task_dir: Path, tgid: int) -> ThreadReading | None:
    """One thread's counters, or None when it vanished or cannot be read."""
    try:
        run, wait, slices = (int(x) for x in (task_dir / "schedstat").read_text().split()[:3])
        vol, invol = parse_status_switches((task_dir / "status").read_text())
        comm, minflt, majflt, start = parse_stat((task_dir / "stat").read_text())
    except (OSError, ValueError, IndexError):
        return None
    return ThreadReading(tgid, comm, run, wait, slices, vol, invol, minflt, majflt, start * 1_000_000_000 // CLK_TCK)


def alive(pid: int, proc: Path = Path("/proc")) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return False
    return text.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


class ProcBackend:
    """Reads ``/proc`` every interval; bounded by ``max_threads`` threads per read."""

    name = "proc"

    def __init__(self, *, all_tasks: bool = False, max_threads: int = 16384, proc: Path = Path("/proc")) -> None:
        self.all_tasks = all_tasks
        self.max_threads = max_threads
        self.proc = proc
        self._targets: set[int] = set()
        self._prev: dict[int, ThreadReading] = {}
        self._seen_tgids: set[int] = set()
        self._last_boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        self._last_ns = time.time_ns()
        self._capped = 0
        self.closed = False
        if all_tasks:
            self._prev = self._read_all(self._all_tgids())

    def _all_tgids(self) -> set[int]:
        try:
            return {int(n) for n in os.listdir(self.proc) if n.isdigit()}
        except OSError:
            return set()

    def _read_all(self, tgids: set[int]) -> dict[int, ThreadReading]:
        out: dict[int, ThreadReading] = {}
        for tgid in sorted(tgids):
            task = self.proc / str(tgid) / "task"
            try:
                tids = [int(n) for n in os.listdir(task) if n.isdigit()]
            except OSError:
                continue
            for tid in tids:
                if len(out) >= self.max_threads:
                    self._capped += 1
                    continue
                r = read_thread(task / str(tid), tgid)
                if r is not None:
                    out[tid] = r
        return out

    def set_targets(self, tgids: set[int]) -> None:
        """Trace exactly ``tgids``; new ones get a baseline now (ignored when tracing every task)."""
        if self.all_tasks:
            return
        new = tgids - self._targets
        if new:
            self._prev.update(self._read_all(new))
        gone = self._targets - tgids
        if gone:
            self._prev = {tid: r for tid, r in self._prev.items() if r.tgid not in gone}
        self._targets = set(tgids)

    def drain(self) -> Drain:
        """Deltas since the previous read."""
        now = time.time_ns()
        boot = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        interval = max(1, now - self._last_ns)
        since = self._last_boot
        self._last_ns, self._last_boot = now, boot
        tgids = self._all_tgids() if self.all_tasks else set(self._targets)
        self._capped = 0
        cur = self._read_all(tgids)
        present = {r.tgid for r in cur.values()}
        exited = sorted(t for t in self._seen_tgids if t not in present and not alive(t, self.proc))
        self._seen_tgids = present
        rows: list[tuple[int, int, str, tuple[int, ...]]] = []
        for tid, r in cur.items():
            p = self._prev.get(tid)
            if p is None or p.tgid != r.tgid or p.start_ns != r.start_ns:
                if r.start_ns < since:
                    continue  # first sight of an old thread: baseline only
                p = ThreadReading(r.tgid, r.comm, 0, 0, 0, 0, 0, 0, 0, r.start_ns)
            d = (
                r.run_ns - p.run_ns,
                r.wait_ns - p.wait_ns,
                r.slices - p.slices,
                r.voluntary - p.voluntary,
                r.involuntary - p.involuntary,
                (r.minflt + r.majflt) - (p.minflt + p.majflt),
                r.majflt - p.majflt,
                max(0, boot - max(since, r.start_ns)),
            )
            if min(d) < 0 or not any(d):
                continue
            rows.append((r.tgid, tid, r.comm, d))
        self._prev = cur
        return self._to_drain(rows, now, interval, exited)

    def _to_drain(
        self, rows: list[tuple[int, int, str, tuple[int, ...]]], now: int, interval: int, exited: list[int]
    ) -> Drain:
        if not rows:
            dropped = {"thread_cap": self._capped} if self._capped else {}
            return Drain(now, interval, ThreadDeltas.empty(), exited=exited, dropped=dropped)
        m = np.array([d for _, _, _, d in rows], dtype=np.int64)
        run, wait, slices, vol, invol, faults, major, observed = m.T
        values = {
            ONCPU: run,
            OFFCPU: np.maximum(observed - run, 0),
            RQ_WAIT: wait,
            RQ_WAITS: slices,
            VOLUNTARY: vol,
            INVOLUNTARY: invol,
            FAULTS: faults,
            MAJOR_FAULTS: major,
        }
        tgid = np.array([r[0] for r in rows], dtype=np.int64)
        threads = ThreadDeltas(tgid, np.array([r[1] for r in rows], dtype=np.int64), [r[2] for r in rows], values)
        # Runqueue latency: each timeslice counted at its thread's mean wait over the interval.
        has = slices > 0
        slot = log2_slot(np.where(has, wait // np.maximum(slices, 1), 0))
        keys = tgid[has] * 64 + slot[has]
        uniq, inverse = np.unique(keys, return_inverse=True)
        counts = np.bincount(inverse, weights=slices[has]).astype(np.int64) if uniq.size else np.zeros(0, np.int64)
        return Drain(
            now,
            interval,
            threads,
            hist_tgid=uniq // 64,
            hist_slot=uniq % 64,
            hist_count=counts,
            exited=exited,
            dropped={"thread_cap": self._capped} if self._capped else {},
        )

    def sizes(self) -> dict[str, int]:
        """Threads and processes held between reads (bounded by max_threads)."""
        return {"user_threads": len(self._prev), "targets": len(self._targets)}

    def close(self) -> None:
        """Nothing to unload; forget the baselines."""
        self.closed = True
        self._prev.clear()
