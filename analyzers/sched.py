"""Scheduler interference of workloads: switches, runqueue latency, on/off-CPU time, faults, two indices.

Folds ``sched`` rows (``aaco.contract.sched``) into per-process totals and computes, per
process and drain interval, the two indices defined in ``docs/metrics.md``:

- **scheduler interference index**: the share of the workload's wall time its threads spent
  runnable but waiting for a CPU (after a wakeup or an involuntary preemption):
  ``sum(runqueue_wait_ns) / (interval_ns * busy_threads)``, where busy threads are those that ran
  or waited in the interval (threads asleep all along are not interfered with), capped at 1;
- **fault penalty index**: page faults per second weighted by their share of off-CPU time:
  ``page_faults / interval_s * fault_offcpu_ns / offcpu_ns`` (eBPF measures the off-CPU time of
  uninterruptible sleeps right after a fault); the ``/proc`` backend cannot, and weights by the
  share of faults that were major (the ones that wait for I/O) instead.

Both are evidence of a CPU-bound (host-side) bottleneck: a GPU feeder thread that waits for a CPU,
or sleeps on faults, leaves the GPU idle. They are in the snapshot (``analysis.json`` ``sched``)
for the bottleneck analyzer, and on ``/metrics``.

Cardinality: the first ``max_workloads`` processes get their own ``comm``/``pid`` labels; later
ones, and those that exited (after ``retain_s`` of data time) or went silent (``stale_s``), are
summed into ``comm="other", pid="other"`` so counters stay monotonic and totals exact. The
analyzer is pure: data time only, no clocks, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveFloat, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.analyzers.stats import log2_quantile
from aaco.contract.config_base import StrictModel
from aaco.contract.sched import (
    EXITED,
    FAULT_OFFCPU,
    FAULTS,
    HIST_SLOTS,
    INVOLUNTARY,
    MAJOR_FAULTS,
    OFFCPU,
    ONCPU,
    RQ_LATENCY,
    RQ_WAIT,
    RQ_WAITS,
    VOLUNTARY,
)
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import HistogramValue, MetricPoint, PointBuilder, define

# Prometheus buckets: the kernel's log2 slots 9..32, i.e. upper bounds 2**10 ns (~1 us) .. 2**33 ns (~8.6 s).
FIRST_SLOT, LAST_SLOT = 9, 32
RQ_BOUNDS_S: tuple[float, ...] = tuple((1 << (k + 1)) / 1e9 for k in range(FIRST_SLOT, LAST_SLOT + 1))
PROCESS = ("node", "comm", "pid")
OTHER = "other"

SWITCHES = define(
    "aaco.sched.context_switches",
    "aaco_sched_context_switches",
    "counter",
    "{switch}",
    "Context switches of a process's threads: voluntary (blocked, slept) or involuntary (preempted).",
    (*PROCESS, "kind"),
)
RUNQUEUE_LATENCY = define(
    "aaco.sched.runqueue.latency",
    "aaco_sched_runqueue_latency_seconds",
    "histogram",
    "s",
    "Runqueue latency: from a wakeup or preemption to running again (log2 buckets).",
    PROCESS,
    RQ_BOUNDS_S,
)
ONCPU_TIME = define(
    "aaco.sched.oncpu.time",
    "aaco_sched_oncpu_seconds",
    "counter",
    "s",
    "Time a process's threads spent on a CPU.",
    PROCESS,
)
OFFCPU_TIME = define(
    "aaco.sched.offcpu.time",
    "aaco_sched_offcpu_seconds",
    "counter",
    "s",
    "Time a process's threads spent off CPU (asleep, blocked or waiting on a runqueue).",
    PROCESS,
)
PAGE_FAULTS = define(
    "aaco.sched.page_faults",
    "aaco_sched_page_faults",
    "counter",
    "{fault}",
    "User page faults of a process's threads.",
    PROCESS,
)
INTERFERENCE = define(
    "aaco.sched.interference",
    "aaco_sched_interference_ratio",
    "gauge",
    "1",
    "Scheduler interference index of the latest interval: share of busy threads' wall time spent "
    "runnable but waiting for a CPU (see docs/metrics.md).",
    PROCESS,
)
FAULT_PENALTY = define(
    "aaco.sched.fault_penalty",
    "aaco_sched_fault_penalty_index",
    "gauge",
    "{fault}/s",
    "Fault penalty index of the latest interval: page faults per second weighted by their share of "
    "off-CPU time (see docs/metrics.md).",
    PROCESS,
)

_SUMMED = (VOLUNTARY, INVOLUNTARY, ONCPU, OFFCPU, RQ_WAIT, RQ_WAITS, FAULTS, MAJOR_FAULTS, FAULT_OFFCPU)


def interference_index(wait_ns: float, interval_ns: float, busy_threads: int) -> float:
    """Share of busy threads' wall time spent runnable but waiting (0 when nothing ran), capped at 1."""
    if interval_ns <= 0 or busy_threads <= 0:
        return 0.0
    return min(1.0, wait_ns / (interval_ns * busy_threads))


def fault_penalty_index(
    faults: float, interval_ns: float, offcpu_ns: float, fault_offcpu_ns: float | None, major: float | None
) -> float:
    """Faults per second x their share of off-CPU time (eBPF), or x the major-fault share (``/proc``)."""
    if interval_ns <= 0 or faults <= 0:
        return 0.0
    if fault_offcpu_ns is not None:
        weight = min(1.0, fault_offcpu_ns / offcpu_ns) if offcpu_ns > 0 else 0.0
    elif major is not None:
        weight = min(1.0, major / faults)
    else:
        weight = 0.0
    return faults / (interval_ns / 1e9) * weight


@dataclass(frozen=True)
class SchedWorkload:
    """One process's (or a node's ``other`` bucket's) totals and latest indices, as the snapshot reports them."""

    node: str
    pid: int | None  # None: the "other" bucket
    comm: str
    context_switches: int
    voluntary: int
    involuntary: int
    runqueue_latency_p50_s: float | None
    runqueue_latency_p99_s: float | None
    runqueue_wait_s: float
    runqueue_waits: int
    oncpu_s: float
    offcpu_s: float
    page_faults: int
    major_page_faults: int
    fault_offcpu_s: float
    interference_ratio: float | None  # the latest interval's
    fault_penalty_index: float | None  # the latest interval's
    interference_ratio_overall: float
    fault_penalty_index_overall: float
    threads: int
    interval_s: float
    last_ts_ns: int
    exited: bool

    def to_dict(self) -> dict[str, Any]:
        """JSON form (every field, in order)."""
        return asdict(self)


@dataclass
class _Workload:
    node: str
    pid: int | None  # None: the "other" bucket
    comm: str
    sums: dict[str, float] = field(default_factory=lambda: dict.fromkeys(_SUMMED, 0.0))
    slots: np.ndarray = field(default_factory=lambda: np.zeros(HIST_SLOTS, dtype=np.int64))
    busy_wall_ns: float = 0.0  # sum over intervals of interval_ns * busy threads
    fault_weighted: float = 0.0  # sum over intervals of faults x weight
    duration_ns: float = 0.0
    interference: float | None = None
    fault_penalty: float | None = None
    threads: int = 0
    interval_ns: int = 0
    last_ts: int = 0
    exited_ts: int | None = None

    def fold(self, other: _Workload) -> None:
        """Add another workload's totals (folding it into this bucket)."""
        for k, v in other.sums.items():
            self.sums[k] += v
        self.slots += other.slots
        self.busy_wall_ns += other.busy_wall_ns
        self.fault_weighted += other.fault_weighted
        self.last_ts = max(self.last_ts, other.last_ts)

    def row(self) -> SchedWorkload:
        """The snapshot's row for this workload."""
        s = self.sums
        overall_fpi = self.fault_weighted / (self.duration_ns / 1e9) if self.duration_ns > 0 else 0.0
        return SchedWorkload(
            node=self.node,
            pid=self.pid,
            comm=self.comm,
            context_switches=int(s[VOLUNTARY] + s[INVOLUNTARY]),
            voluntary=int(s[VOLUNTARY]),
            involuntary=int(s[INVOLUNTARY]),
            runqueue_latency_p50_s=log2_quantile(self.slots, 0.50),
            runqueue_latency_p99_s=log2_quantile(self.slots, 0.99),
            runqueue_wait_s=s[RQ_WAIT] / 1e9,
            runqueue_waits=int(s[RQ_WAITS]),
            oncpu_s=s[ONCPU] / 1e9,
            offcpu_s=s[OFFCPU] / 1e9,
            page_faults=int(s[FAULTS]),
            major_page_faults=int(s[MAJOR_FAULTS]),
            fault_offcpu_s=s[FAULT_OFFCPU] / 1e9,
            interference_ratio=self.interference,
            fault_penalty_index=self.fault_penalty,
            interference_ratio_overall=min(1.0, s[RQ_WAIT] / self.busy_wall_ns) if self.busy_wall_ns else 0.0,
            fault_penalty_index_overall=overall_fpi,
            threads=self.threads,
            interval_s=self.interval_ns / 1e9,
            last_ts_ns=self.last_ts,
            exited=self.exited_ts is not None,
        )

    def histogram(self) -> HistogramValue:
        cum = np.cumsum(self.slots)
        counts = tuple(int(cum[k]) for k in range(FIRST_SLOT, LAST_SLOT + 1))
        return HistogramValue(RQ_BOUNDS_S, counts, int(cum[-1]), self.sums[RQ_WAIT] / 1e9)


@dataclass(frozen=True)
class SchedResult:
    """Per-process totals and latest indices, and the ``other`` buckets."""

    workloads: tuple[SchedWorkload, ...]
    others: tuple[SchedWorkload, ...]
    _hist: tuple[tuple[dict[str, str], HistogramValue], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """``{"workloads": [...], "other": [...]}``, one object per process (or node, for other)."""
        return {"workloads": [w.to_dict() for w in self.workloads], "other": [w.to_dict() for w in self.others]}

    def points(self) -> list[MetricPoint]:
        """Counters and the histogram for every labelled process and ``other``; indices for live processes."""
        pb = PointBuilder()
        for w in (*self.workloads, *self.others):
            labels = {"node": w.node, "comm": w.comm, "pid": OTHER if w.pid is None else str(w.pid)}
            pb.add(SWITCHES, w.voluntary, kind="voluntary", **labels)
            pb.add(SWITCHES, w.involuntary, kind="involuntary", **labels)
            pb.add(ONCPU_TIME, w.oncpu_s, **labels)
            pb.add(OFFCPU_TIME, w.offcpu_s, **labels)
            pb.add(PAGE_FAULTS, w.page_faults, **labels)
            if w.pid is not None and not w.exited:
                if w.interference_ratio is not None:
                    pb.add(INTERFERENCE, w.interference_ratio, **labels)
                if w.fault_penalty_index is not None:
                    pb.add(FAULT_PENALTY, w.fault_penalty_index, **labels)
        for labels, hist in self._hist:
            pb.add(RUNQUEUE_LATENCY, hist, **labels)
        return pb.points


class SchedSettings(StrictModel):
    """Scheduler interference per process (labelled processes: the sched sources' max_workloads)."""

    retain_s: PositiveFloat = Field(60.0, description="An exited process keeps its labels this long (data time).")
    stale_s: PositiveFloat = Field(600.0, description="A process silent this long is summed into 'other'.")
    max_folded: PositiveInt = Field(65_536, description="Processes remembered as summed into 'other'.")


class SchedAnalyzer(Analyzer):
    """Streams ``sched`` rows into per-process totals and per-interval indices (bounded label sets)."""

    name = "sched"
    kinds = frozenset({"sched"})

    def __init__(
        self, max_workloads: int = 64, retain_s: float = 60.0, stale_s: float = 600.0, max_folded: int = 65_536
    ) -> None:
        self.max_workloads = max_workloads
        self.retain_ns = int(retain_s * 1e9)
        self.stale_ns = int(stale_s * 1e9)
        self.max_folded = max_folded
        self._live: OrderedDict[tuple[str, int], _Workload] = OrderedDict()
        self._other: dict[str, _Workload] = {}
        self._folded: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._latest_ts = 0

    # -- folding in ---------------------------------------------------------------------------------

    def _bucket(self, node: str, pid: int, comm: str | None) -> _Workload:
        key = (node, pid)
        w = self._live.get(key)
        if w is not None:
            if comm and comm not in (w.comm, OTHER):
                w.comm = comm
            return w
        if key not in self._folded and len(self._live) < self.max_workloads:
            w = _Workload(node, pid, comm or str(pid))
            self._live[key] = w
            return w
        self._remember_folded(key)
        return self._other_bucket(node)

    def _other_bucket(self, node: str) -> _Workload:
        if node not in self._other:
            self._other[node] = _Workload(node, None, OTHER)
        return self._other[node]

    def _remember_folded(self, key: tuple[str, int]) -> None:
        self._folded[key] = None
        self._folded.move_to_end(key)
        while len(self._folded) > self.max_folded:
            self._folded.popitem(last=False)

    def update(self, item: EventBatch) -> None:
        """Fold a ``sched`` batch in: sums per (process, interval), histogram buckets, exits."""
        t = pa.Table.from_batches([item.batch])
        if t.num_rows == 0:
            return
        t = t.filter(pc.is_valid(t.column("pid")))
        if t.num_rows == 0:
            return
        t = t.set_column(t.schema.get_field_index("interval_ns"), "interval_ns", pc.fill_null(t["interval_ns"], 0))
        comms = self._comms(t)
        sums = t.group_by(["node", "pid", "ts_ns", "metric"]).aggregate([("value", "sum"), ("interval_ns", "max")])
        busy_rows = t.filter(pc.and_(pc.is_in(t["metric"], pa.array([ONCPU, RQ_WAIT])), pc.greater(t["value"], 0)))
        busy = {
            (r["node"], r["pid"], r["ts_ns"]): r["tid_count_distinct"]
            for r in busy_rows.group_by(["node", "pid", "ts_ns"]).aggregate([("tid", "count_distinct")]).to_pylist()
        }
        intervals: dict[tuple[str, int, int], dict[str, float]] = {}
        interval_len: dict[tuple[str, int, int], int] = {}
        for r in sums.to_pylist():
            key = (r["node"], r["pid"], r["ts_ns"])
            intervals.setdefault(key, {})[r["metric"]] = r["value_sum"]
            interval_len[key] = max(interval_len.get(key, 0), int(r["interval_ns_max"] or 0))
        for key in sorted(intervals, key=lambda k: k[2]):
            node, pid, ts = key
            m = intervals[key]
            w = self._bucket(node, pid, comms.get((node, pid)))
            for name in _SUMMED:
                w.sums[name] += m.get(name, 0.0)
            if m.get(EXITED):
                w.exited_ts = ts
            elif w.exited_ts is not None and ts > w.exited_ts:
                w.exited_ts = None  # more data after an exit: a main thread ended before the others
            w.last_ts = max(w.last_ts, ts)
            self._latest_ts = max(self._latest_ts, ts)
            if w.pid is None:
                continue
            length = interval_len[key]
            threads = busy.get(key, 0)
            if not (set(m) - {EXITED}):
                continue
            w.interference = interference_index(m.get(RQ_WAIT, 0.0), length, threads)
            w.fault_penalty = fault_penalty_index(
                m.get(FAULTS, 0.0), length, m.get(OFFCPU, 0.0), m.get(FAULT_OFFCPU), m.get(MAJOR_FAULTS)
            )
            w.busy_wall_ns += length * threads
            w.fault_weighted += w.fault_penalty * length / 1e9
            w.duration_ns += length
            w.threads = threads
            w.interval_ns = length
        self._fold_histograms(t)
        self._expire()

    def _comms(self, t: pa.Table) -> dict[tuple[str, int], str]:
        """Process names: process rows (tid null) first, then the main thread's, then any thread's."""
        named = t.filter(pc.is_valid(t["comm"])).select(["node", "pid", "tid", "comm"])
        out: dict[tuple[str, int], tuple[int, str]] = {}
        for r in named.group_by(["node", "pid", "tid", "comm"]).aggregate([]).to_pylist():
            rank = 0 if r["tid"] is None else 1 if r["tid"] == r["pid"] else 2
            key = (r["node"], r["pid"])
            if key not in out or rank < out[key][0]:
                out[key] = (rank, r["comm"])
        return {k: v[1] for k, v in out.items()}

    def _fold_histograms(self, t: pa.Table) -> None:
        h = t.filter(pc.and_(pc.equal(t["metric"], RQ_LATENCY), pc.is_valid(t["bucket_le_ns"])))
        if h.num_rows == 0:
            return
        agg = h.group_by(["node", "pid", "bucket_le_ns"]).aggregate([("value", "sum")])
        for r in agg.to_pylist():
            le = int(r["bucket_le_ns"])
            slot = min(HIST_SLOTS - 1, max(0, le.bit_length() - 2))  # le = 2**(slot+1)
            w = self._bucket(r["node"], r["pid"], None)
            w.slots[slot] += int(r["value_sum"])

    def _expire(self) -> None:
        """Fold processes that exited ``retain_s`` ago, or went silent for ``stale_s``, into ``other``."""
        latest = self._latest_ts
        for key, w in list(self._live.items()):
            gone = w.exited_ts is not None and latest - w.exited_ts >= self.retain_ns
            if gone or latest - w.last_ts >= self.stale_ns:
                del self._live[key]
                self._remember_folded(key)
                self._other_bucket(w.node).fold(w)

    # -- results ------------------------------------------------------------------------------------

    def snapshot(self) -> SchedResult:
        """Totals per labelled process and per ``other`` bucket."""
        hist = []
        for w in (*self._live.values(), *self._other.values()):
            labels = {"node": w.node, "comm": w.comm, "pid": OTHER if w.pid is None else str(w.pid)}
            hist.append((labels, w.histogram()))
        return SchedResult(
            tuple(w.row() for w in self._live.values()),
            tuple(w.row() for w in self._other.values()),
            tuple(hist),
        )


def create(s: SchedSettings, hints: AgentHints, max_models: int) -> SchedAnalyzer:
    """The analyzer for its settings and what the agent derives from its sources."""
    return SchedAnalyzer(
        max_workloads=hints.sched_max_workloads, retain_s=s.retain_s, stale_s=s.stale_s, max_folded=s.max_folded
    )
