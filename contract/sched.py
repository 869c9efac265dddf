"""The rows of the ``sched`` kind: what one drain of a scheduler backend holds, and its Arrow form.

Both backends (eBPF and ``/proc``) hand the ``sched`` source a ``Drain``: per-thread deltas over
one interval, a log2 histogram of runqueue latency per process, long off-CPU intervals, and the
processes that exited. ``drain_to_table`` turns it into the long-form ``sched`` schema (docs/architecture.md,
Event schemas): one row per (thread, metric) with ``ts_ns`` the end of the interval and ``interval_ns``
its length; zero values are left out. The metric names below are the vocabulary the lake and the
``sched`` analyzer share:

=====================  =====  ===========================================================================
metric                 per    value
=====================  =====  ===========================================================================
oncpu_ns               tid    ns on a CPU (credited when the slice ends)
offcpu_ns              tid    ns off CPU, runqueue wait included (credited when the thread runs again)
runqueue_wait_ns       tid    ns runnable but waiting: from a wakeup or an involuntary preemption to the run
runqueue_waits         tid    number of such waits
voluntary_switches     tid    switches out because the thread blocked or slept
involuntary_switches   tid    switches out while still runnable (preempted, yielded)
page_faults            tid    user page faults
fault_offcpu_ns        tid    off-CPU ns in uninterruptible sleep right after a page fault (eBPF only)
major_page_faults      tid    page faults that needed I/O (``/proc`` only)
runqueue_latency       tgid   waits whose latency fell in the log2 bucket ending at ``bucket_le_ns``
offcpu_interval_ns     tid    one off-CPU interval at least the configured threshold long, with
                              ``offcpu_start_ns``/``offcpu_end_ns`` (Unix ns); the correlator may
                              attach it to the iteration it overlaps
exited                 tgid   1: the process ended during the interval
=====================  =====  ===========================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

ONCPU = "oncpu_ns"
OFFCPU = "offcpu_ns"
RQ_WAIT = "runqueue_wait_ns"
RQ_WAITS = "runqueue_waits"
VOLUNTARY = "voluntary_switches"
INVOLUNTARY = "involuntary_switches"
FAULTS = "page_faults"
FAULT_OFFCPU = "fault_offcpu_ns"
MAJOR_FAULTS = "major_page_faults"
RQ_LATENCY = "runqueue_latency"
OFFCPU_INTERVAL = "offcpu_interval_ns"
EXITED = "exited"

THREAD_METRICS: tuple[str, ...] = (
    ONCPU,
    OFFCPU,
    RQ_WAIT,
    RQ_WAITS,
    VOLUNTARY,
    INVOLUNTARY,
    FAULTS,
    FAULT_OFFCPU,
    MAJOR_FAULTS,
)

HIST_SLOTS = 64  # log2 slots of a u64 latency in ns


def slot_le_ns(slot: np.ndarray) -> np.ndarray:
    """Upper bounds (ns) of log2 slots: slot k holds latencies in [2**k, 2**(k+1)); capped at 2**62."""
    return np.left_shift(np.int64(1), np.minimum(np.asarray(slot, dtype=np.int64) + 1, 62))


def log2_slot(values_ns: np.ndarray) -> np.ndarray:
    """floor(log2(v)) per value, 0 for values below 2 (the kernel's ``bpf_log2l``)."""
    v = np.maximum(np.asarray(values_ns, dtype=np.float64), 1.0)
    return np.minimum(np.floor(np.log2(v)).astype(np.int64), HIST_SLOTS - 1)


@dataclass
class ThreadDeltas:
    """Per-thread deltas of one interval: parallel arrays, one entry per thread."""

    tgid: np.ndarray
    tid: np.ndarray
    comm: list[str]
    values: dict[str, np.ndarray]

    @classmethod
    def empty(cls) -> ThreadDeltas:
        """No threads."""
        z = np.zeros(0, dtype=np.int64)
        return cls(z, z, [], {})

    def __len__(self) -> int:
        return int(self.tid.size)


@dataclass
class OffcpuEvents:
    """Long off-CPU intervals (Unix ns), parallel arrays."""

    start_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    end_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tgid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    comm: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return int(self.start_ns.size)


@dataclass
class Drain:
    """Everything one interval produced."""

    ts_ns: int  # end of the interval (Unix ns)
    interval_ns: int
    threads: ThreadDeltas
    hist_tgid: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    hist_slot: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    hist_count: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    events: OffcpuEvents = field(default_factory=OffcpuEvents)
    exited: list[int] = field(default_factory=list)
    process_comm: dict[int, str] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)  # reason -> events or entries lost this interval


def _process_comm(d: Drain) -> dict[int, str]:
    """Process names: the backend's, else the main thread's (tid == tgid), else any thread's."""
    names: dict[int, str] = {}
    t = d.threads
    for tgid, tid, comm in zip(t.tgid.tolist(), t.tid.tolist(), t.comm, strict=True):
        if comm and (tgid not in names or tid == tgid):
            names[tgid] = comm
    names.update({k: v for k, v in d.process_comm.items() if v})
    return names


_I64 = pa.int64()
_COLUMNS = {
    "pid": _I64,
    "tid": _I64,
    "metric": pa.string(),
    "value": pa.float64(),
    "offcpu_start_ns": _I64,
    "offcpu_end_ns": _I64,
    "comm": pa.string(),
    "bucket_le_ns": _I64,
}


def _part(n: int, **cols: object) -> pa.Table:
    """``n`` rows with the given columns, nulls in the others."""
    return pa.table({name: pa.array(cols.get(name, [None] * n), typ) for name, typ in _COLUMNS.items()})


def drain_to_table(d: Drain, *, node: str, source: str) -> pa.Table:
    """The drain as ``sched`` rows (long form, zeros left out)."""
    parts: list[pa.Table] = []
    t = d.threads
    for metric in THREAD_METRICS:
        arr = t.values.get(metric)
        if arr is None or not len(t):
            continue
        nz = np.flatnonzero(arr)
        if nz.size:
            parts.append(
                _part(
                    nz.size,
                    pid=t.tgid[nz],
                    tid=t.tid[nz],
                    metric=[metric] * nz.size,
                    value=arr[nz].astype(np.float64),
                    comm=[t.comm[i] for i in nz],
                )
            )
    names = _process_comm(d)
    nz = np.flatnonzero(d.hist_count)
    if nz.size:
        pids = d.hist_tgid[nz]
        parts.append(
            _part(
                nz.size,
                pid=pids,
                metric=[RQ_LATENCY] * nz.size,
                value=d.hist_count[nz].astype(np.float64),
                comm=[names.get(p) for p in pids.tolist()],
                bucket_le_ns=slot_le_ns(d.hist_slot[nz]),
            )
        )
    if d.exited:
        n = len(d.exited)
        parts.append(
            _part(n, pid=d.exited, metric=[EXITED] * n, value=[1.0] * n, comm=[names.get(p) for p in d.exited])
        )
    ev = d.events
    if len(ev):
        parts.append(
            _part(
                len(ev),
                pid=ev.tgid,
                tid=ev.tid,
                metric=[OFFCPU_INTERVAL] * len(ev),
                value=(ev.end_ns - ev.start_ns).astype(np.float64),
                comm=ev.comm,
                offcpu_start_ns=ev.start_ns,
                offcpu_end_ns=ev.end_ns,
            )
        )
    body = pa.concat_tables(parts) if parts else _part(0)
    n = body.num_rows
    return pa.table(
        {
            "ts_ns": pa.array(np.full(n, d.ts_ns, dtype=np.int64)),
            "node": pa.array([node] * n, pa.string()),
            **{
                name: body.column(name)
                for name in ("pid", "tid", "metric", "value", "offcpu_start_ns", "offcpu_end_ns", "comm")
            },
            "interval_ns": pa.array(np.full(n, d.interval_ns, dtype=np.int64)),
            "source": pa.array([source] * n, pa.string()),
            "bucket_le_ns": body.column("bucket_le_ns"),
        }
    )
