"""Distributed jobs, per rank: Holistic Trace Analysis's figures and stragglers, live (docs/jobs.md).

Rows that carry a ``job`` and a ``rank`` (kernels and iterations) are folded per (job, rank):

- per window of a rank (a run: one trace file, one capture) HTA 0.5.0's temporal breakdown and
  communication/computation overlap (``analyzers/jobs_hta.py``). HTA leaves out the GPU work
  launched once a window's last ``ProfilerStep`` started; streamed, that work is held until the
  next step starts (then it belongs in), so a window's last step stays out as in HTA. With one step
  or none, HTA keeps everything: so does the snapshot.
- per step of a rank its span, its GPU work and its collectives; across the ranks of a job and its
  most recent ``window_steps`` complete steps, HTA's stragglers (``analyzers/jobs_stragglers.py``).

Bounded: ``max_jobs`` jobs and ``max_ranks`` ranks per job (the least recently seen one makes room
once it has been quiet for ``forget_after_s`` of trace time; otherwise the new one's rows are
dropped and counted), ``window_steps`` steps per rank, four windows per rank, and
``max_pending_kernels`` held per window. ``job`` and ``rank`` are labels of these job series only.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveFloat, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.analyzers.grouping import group
from aaco.analyzers.jobs_critical import critical_shares, step_paths
from aaco.analyzers.jobs_hta import (
    COMMUNICATION,
    STRAGGLER_KERNEL_PREFIX,
    KernelTypes,
    RankFigures,
    RankWindow,
    ceil_us,
    floor_us,
)
from aaco.analyzers.jobs_result import DROP_REASONS, JobsResult, JobView, RankView
from aaco.analyzers.jobs_stragglers import StepData, find_stragglers, undominated
from aaco.contract.config_base import StrictModel
from aaco.contract.jobs import bus_factor
from aaco.contract.schemas import EventBatch

_RUNS_PER_RANK: Final = 4


class JobsSettings(StrictModel):
    """Distributed jobs: HTA's per-rank figures and stragglers (docs/jobs.md)."""

    max_jobs: PositiveInt = Field(8, description="Jobs tracked at once (bounds the job label).")
    max_ranks: PositiveInt = Field(64, description="Ranks tracked per job (bounds the rank label).")
    forget_after_s: PositiveFloat = Field(
        600.0, description="A job or rank with no rows for this long (trace time) makes room for a new one at a cap."
    )
    window_steps: PositiveInt = Field(
        16, description="Steps of each rank kept: stragglers and step times are over a job's most recent ones."
    )
    stragglers: PositiveInt = Field(2, description="How many stragglers to name per job (HTA's num_candidates).")
    max_pending_kernels: PositiveInt = Field(
        200_000, description="Kernels of a window's newest step held until the next step starts (HTA leaves it out)."
    )


@dataclass
class _Run:
    window: RankWindow
    last_step_us: int | None = None  # start of its newest step
    steps: int = 0
    pending: list[tuple[np.ndarray, ...]] = field(default_factory=list)  # (launch, lo, hi, type) chunks
    pending_rows: int = 0

    def held(self) -> tuple[np.ndarray, ...]:
        """The held kernels as (launch, lo, hi, type)."""
        if not self.pending:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty, np.zeros(0, np.int8)
        return tuple(np.concatenate(parts) for parts in zip(*self.pending, strict=True))

    def release(self) -> None:
        """Fold the held kernels launched before the newest step started."""
        if not self.pending or self.last_step_us is None:
            return
        launch, lo, hi, types = self.held()
        go = launch < self.last_step_us
        self.window.fold(lo[go], hi[go], types[go])
        keep = ~go
        self.pending = [(launch[keep], lo[keep], hi[keep], types[keep])] if keep.any() else []
        self.pending_rows = int(keep.sum())


@dataclass
class _Rank:
    node: str
    last_ns: int
    runs: OrderedDict[str, _Run] = field(default_factory=OrderedDict)
    steps: dict[int, StepData] = field(default_factory=dict)


@dataclass
class _Job:
    last_ns: int
    world_size: int | None = None
    backend: str | None = None
    ranks: dict[int, _Rank] = field(default_factory=dict)


def _np(col: pa.Array | pa.ChunkedArray, fill: int) -> np.ndarray:
    return col.fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64)


class JobsAnalyzer(Analyzer):
    """Folds the kernels and steps of distributed jobs' ranks into HTA's figures and stragglers."""

    name = "jobs"
    kinds = frozenset({"kernels", "iterations"})

    def __init__(self, settings: JobsSettings | None = None) -> None:
        self._s = settings or JobsSettings()
        self._jobs: OrderedDict[str, _Job] = OrderedDict()
        self._types = KernelTypes()
        self._dropped = dict.fromkeys(DROP_REASONS, 0)
        self._newest_ns = 0
        self._seq = 0

    # -- folding -----------------------------------------------------------------------------------

    def update(self, item: EventBatch) -> None:
        """Fold a kernels or iterations batch in (rows without a job are not job rows)."""
        b = item.batch
        if b.num_rows == 0 or b.column("job").null_count == b.num_rows:
            return
        no_rank = pc.and_(b.column("job").is_valid(), b.column("rank").is_null())
        self._dropped["no_rank"] += int(pc.sum(no_rank).as_py() or 0)
        b = b.filter(pc.and_(b.column("job").is_valid(), b.column("rank").is_valid()))
        if b.num_rows == 0:
            return
        self._newest_ns = max(self._newest_ns, int(pc.max(b.column("end_ns")).as_py()))
        runs = b.column("run_id").fill_null(item.source)
        groups = group(b.column("job"), b.column("rank"), runs, b.column("node"))
        for i, (job, rank, run_id, node) in enumerate(groups.keys):
            part = b.filter(pa.array(groups.index == i)) if len(groups.keys) > 1 else b
            state = self._rank(job, int(rank), node, int(pc.max(part.column("end_ns")).as_py()), part.num_rows)
            if state is None:
                continue
            self._job_meta(job, part)
            run = state.runs.pop(run_id, None) or _Run(RankWindow())
            state.runs[run_id] = run
            while len(state.runs) > _RUNS_PER_RANK:
                state.runs.popitem(last=False)
            if item.kind == "iterations":
                self._steps(state, run, run_id, part)
            else:
                self._kernels(state, run, run_id, part)

    def _rank(self, job: str, rank: int, node: str, last_ns: int, rows: int) -> _Rank | None:
        j = self._jobs.pop(job, None)
        if j is None:
            if not self._room(self._jobs, self._s.max_jobs):
                self._dropped["max_jobs"] += rows
                return None
            j = _Job(last_ns)
        self._jobs[job] = j
        j.last_ns = max(j.last_ns, last_ns)
        r = j.ranks.pop(rank, None)
        if r is None:
            if not self._room(j.ranks, self._s.max_ranks):
                self._dropped["max_ranks"] += rows
                return None
            r = _Rank(node, last_ns)
        j.ranks[rank] = r
        r.last_ns, r.node = max(r.last_ns, last_ns), node
        return r

    def _room(self, table: OrderedDict[Any, Any] | dict[Any, Any], cap: int) -> bool:
        """Whether there is room for one more (the least recently seen forgotten if it has been quiet)."""
        if len(table) < cap:
            return True
        oldest = next(iter(table))
        if self._newest_ns - table[oldest].last_ns >= self._s.forget_after_s * 1e9:
            del table[oldest]
            return True
        return False

    def _job_meta(self, job: str, part: pa.RecordBatch) -> None:
        j = self._jobs[job]
        ws = pc.max(part.column("world_size")).as_py()
        if ws is not None:
            j.world_size = max(j.world_size or 0, int(ws))
        backend = part.column("dist_backend").drop_null()
        if len(backend):
            j.backend = backend[0].as_py()

    def _steps(self, rank: _Rank, run: _Run, run_id: str, part: pa.RecordBatch) -> None:
        starts, ends = _np(part.column("start_ns"), 0), _np(part.column("end_ns"), 0)
        numbers = part.column("iteration").to_pylist()
        paths = step_paths(part)
        for start, end, n, path in zip(starts.tolist(), ends.tolist(), numbers, paths, strict=True):
            if n is None:
                continue
            step = self._step(rank, n, run_id)
            if step is None:
                continue
            start_us = int(ceil_us(np.int64(start)))
            step.span(start_us, int(floor_us(np.int64(end))), end - start)
            step.critical = path or step.critical
            if run.last_step_us is None or start_us > run.last_step_us:
                run.last_step_us = start_us
                run.steps += 1
                run.release()

    def _step(self, rank: _Rank, n: int, run_id: str) -> StepData | None:
        step = rank.steps.get(n)
        if step is None:
            if len(rank.steps) > self._s.window_steps and n < min(rank.steps):
                return None  # older than every step kept
            step = rank.steps[n] = StepData(run_id)
            while len(rank.steps) > self._s.window_steps + 1:
                del rank.steps[min(rank.steps)]
        return step

    def _kernels(self, rank: _Rank, run: _Run, run_id: str, part: pa.RecordBatch) -> None:
        lo, hi = ceil_us(_np(part.column("start_ns"), 0)), floor_us(_np(part.column("end_ns"), 0))
        launch = ceil_us(_np(pc.coalesce(part.column("launch_start_ns"), part.column("start_ns")), 0))
        types = self._types.of(part.column("name"), part.column("kind"))
        iteration = _np(part.column("iteration"), -1)
        for n in np.unique(iteration[iteration >= 0]).tolist():
            step = self._step(rank, n, run_id)
            if step is not None:
                mask = iteration == n
                step.work(int(lo[mask].min()), int(hi[mask].max()))
        self._collectives(rank, part, lo, hi, types, iteration)
        self._bus(rank, part, iteration)
        if run.last_step_us is not None:
            go = launch < run.last_step_us
            run.window.fold(lo[go], hi[go], types[go])
            launch, lo, hi, types = launch[~go], lo[~go], hi[~go], types[~go]
        if lo.size:
            run.pending.append((launch, lo, hi, types))
            run.pending_rows += int(lo.size)
        if run.pending_rows > self._s.max_pending_kernels:
            held = run.held()
            if run.steps == 0:  # no step at all: HTA keeps everything, fold the older half
                cut = run.pending_rows // 2
                run.window.fold(held[1][:cut], held[2][:cut], held[3][:cut])
            else:
                cut = run.pending_rows - self._s.max_pending_kernels
                self._dropped["max_pending"] += cut
            run.pending = [tuple(a[cut:] for a in held)]
            run.pending_rows -= cut

    def _collectives(
        self, rank: _Rank, part: pa.RecordBatch, lo: np.ndarray, hi: np.ndarray, types: np.ndarray, it: np.ndarray
    ) -> None:
        """HTA's candidate collectives (``ncclKernel*`` on a stream > 0 in a step > 0), thinned, kept per step."""
        stream = _np(part.column("stream"), -1)
        named = pc.starts_with(part.column("name"), STRAGGLER_KERNEL_PREFIX).fill_null(False)
        rows = np.flatnonzero((types == COMMUNICATION) & (stream > 0) & (it > 0) & named.to_numpy(zero_copy_only=False))
        if rows.size == 0:
            return
        take = pa.array(rows)
        names = part.column("name").take(take)
        keys = group(pa.array(it[rows]), pa.array(stream[rows]), names)
        keep = undominated(keys.index, lo[rows], hi[rows] - lo[rows])
        for i in np.flatnonzero(keep).tolist():
            row = int(rows[i])
            step = rank.steps.get(int(it[row]))
            if step is not None:
                step.collective(int(stream[row]), names[i].as_py(), int(lo[row]), int(hi[row] - lo[row]), self._seq + i)
        self._seq += int(rows.size)

    def _bus(self, rank: _Rank, part: pa.RecordBatch, it: np.ndarray) -> None:
        known = pc.and_(part.column("collective").is_valid(), part.column("collective_bytes").is_valid())
        rows = np.flatnonzero(known.fill_null(False).to_numpy(zero_copy_only=False) & (it >= 0))
        if rows.size == 0:
            return
        take = pa.array(rows)
        size = pc.coalesce(part.column("collective_group_size"), part.column("world_size")).take(take).to_pylist()
        ops = part.column("collective").take(take).to_pylist()
        nbytes = part.column("collective_bytes").take(take).to_pylist()
        ns = (_np(part.column("end_ns"), 0) - _np(part.column("start_ns"), 0))[rows].tolist()
        for row, op, b, n, t in zip(rows.tolist(), ops, nbytes, size, ns, strict=True):
            step, factor = rank.steps.get(int(it[row])), bus_factor(op, n)
            if step is not None and factor is not None and t > 0:
                step.bus_time(op, b * factor, t)

    # -- results -----------------------------------------------------------------------------------

    def snapshot(self) -> JobsResult:
        """Every job's ranks and stragglers."""
        return JobsResult(tuple(self._view(job, j) for job, j in self._jobs.items()), dict(self._dropped))

    def _view(self, job: str, j: _Job) -> JobView:
        complete = {rank: self._complete(r) for rank, r in j.ranks.items()}
        numbers = sorted({n for steps in complete.values() for n in steps})[-self._s.window_steps :]
        recent = {rank: {n: s for n, s in steps.items() if n in numbers} for rank, steps in complete.items()}
        found = find_stragglers({r: s for r, s in recent.items() if s}, self._s.stragglers)
        ranks = []
        for rank, r in sorted(j.ranks.items()):
            run_id, figures = self._figures(r)
            durations = [s.duration_ns for s in r.steps.values() if s.duration_ns is not None]
            p50 = float(np.median(durations)) / 1e9 if durations else None
            straggler = None if found is None else rank in found.stragglers
            critical = critical_shares(s.critical for s in r.steps.values())
            ranks.append(RankView(rank, r.node, run_id, figures, p50, len(durations), straggler, critical))
        totals: dict[str, tuple[float, int]] = {}
        for r in j.ranks.values():
            for step in r.steps.values():
                for op, (b, t) in step.bus.items():
                    tb, tt = totals.get(op, (0.0, 0))
                    totals[op] = (tb + b, tt + t)
        bus = {op: b / (t / 1e9) for op, (b, t) in sorted(totals.items()) if t > 0}
        return JobView(job, j.world_size, j.backend, tuple(ranks), found, bus)

    @staticmethod
    def _complete(r: _Rank) -> dict[int, StepData]:
        """Steps followed by a later one in their window (HTA leaves each window's last step out)."""
        out = {}
        for n, s in r.steps.items():
            run = r.runs.get(s.run)
            if run is not None and None not in (s.start_us, run.last_step_us) and s.start_us < run.last_step_us:
                out[n] = s
        return out

    @staticmethod
    def _figures(r: _Rank) -> tuple[str | None, RankFigures | None]:
        """The newest window with figures (with one step or none, HTA keeps the held kernels too)."""
        for run_id in reversed(r.runs):
            run = r.runs[run_id]
            _, lo, hi, types = run.held() if run.steps <= 1 else (None, None, None, None)
            figures = run.window.figures(lo, hi, types)
            if figures is not None:
                return run_id, figures
        return None, None


def create(s: JobsSettings, hints: AgentHints, max_models: int) -> JobsAnalyzer:
    """The analyzer for its settings."""
    return JobsAnalyzer(s)
