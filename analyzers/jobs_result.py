"""What the jobs analyzer reports (analyzers/jobs.py): its metrics, and each job and rank as a result.

Percentages (0..100, HTA's columns) are in the JSON only; the metrics carry ratios (0..1). ``job``
and ``rank`` label these job series only, never a per-kernel one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from aaco.analyzers.jobs_critical import BOUNDS, CriticalShares
from aaco.analyzers.jobs_hta import RankFigures
from aaco.analyzers.jobs_stragglers import Stragglers
from aaco.contract.signals import MetricPoint, PointBuilder, define

STRAGGLER = define(
    "aaco.job.straggler",
    "aaco_job_straggler",
    "gauge",
    "1",
    "1 while a rank is among its job's stragglers (HTA's: the ranks whose most varying significant collective "
    "starts latest, over the job's recent steps), else 0; only for jobs with two ranks or more in view.",
    ("job", "rank"),
)
STEP_SECONDS = define(
    "aaco.job.step.duration",
    "aaco_job_step_seconds",
    "gauge",
    "s",
    "Median step time (ProfilerStep span) of a rank over its recent steps.",
    ("job", "rank"),
)
OVERLAP = define(
    "aaco.job.comm_comp_overlap",
    "aaco_job_comm_comp_overlap_ratio",
    "gauge",
    "1",
    "Share of a rank's communication kernel time during which a computation kernel also ran (HTA's "
    "get_comm_comp_overlap), over its latest window.",
    ("job", "rank"),
)
TIME_RATIO = define(
    "aaco.job.time_ratio",
    "aaco_job_time_ratio",
    "gauge",
    "1",
    "HTA's temporal breakdown of a rank's latest window: idle, compute and non_compute (communication, memory "
    "and other kernels) as shares of its kernel time.",
    ("job", "rank", "state"),
)
BUS_BANDWIDTH = define(
    "aaco.job.collective.bus_bandwidth",
    "aaco_job_collective_bus_bandwidth_bytes_per_second",
    "gauge",
    "By/s",
    "nccl-tests' bus bandwidth of a job's collectives of one operation over its ranks' recent steps: the sum of "
    "message size times the operation's bus factor over the sum of kernel time (collectives of known size only).",
    ("job", "op"),
)
CRITICAL_SHARE = define(
    "aaco.job.critical_path.share",
    "aaco_job_critical_path_ratio",
    "gauge",
    "1",
    "Share of a rank's critical path (HTA's lightweight critical path of each recent step) bound by: cpu (CPU "
    "operators and runtime calls), compute (GPU computation), comm (collectives), launch (launch delay), gap "
    "(a stream's gap between kernels); the bounds add up to 1.",
    ("job", "rank", "bound"),
)
CRITICAL_SECONDS = define(
    "aaco.job.critical_path.duration",
    "aaco_job_critical_path_seconds",
    "gauge",
    "s",
    "Median length of the critical path of a rank's recent steps (HTA's lightweight critical path).",
    ("job", "rank"),
)
DROPPED = define(
    "aaco.job.dropped",
    "aaco_job_rows_dropped",
    "counter",
    "{row}",
    "Job rows the jobs analyzer did not fold: max_jobs, max_ranks (a cap reached), no_rank (a job without a "
    "rank), max_pending (kernels of a window's newest step beyond max_pending_kernels).",
    ("reason",),
)
DROP_REASONS: Final = ("max_jobs", "max_ranks", "no_rank", "max_pending")
STATES: Final = (("idle", "idle"), ("compute", "compute"), ("non_compute", "noncompute"))


@dataclass(frozen=True)
class RankView:
    """One rank: its latest window's figures, its median step time, whether it straggles."""

    rank: int
    node: str
    run_id: str | None
    figures: RankFigures | None
    step_p50_s: float | None
    steps: int
    straggler: bool | None  # None: no straggler analysis for the job
    critical: CriticalShares | None = None  # its recent steps' critical path

    def to_dict(self) -> dict[str, Any]:
        """JSON form: HTA's columns (percentages 0..100) beside the rank's identity."""
        return {
            "rank": self.rank,
            "node": self.node,
            "run_id": self.run_id,
            "step_p50_s": self.step_p50_s,
            "steps": self.steps,
            "straggler": self.straggler,
            "critical_path": self.critical.to_dict() if self.critical else None,
            **(self.figures.to_dict() if self.figures else {}),
        }


@dataclass(frozen=True)
class JobView:
    """One job: its ranks in view and HTA's stragglers among them."""

    job: str
    world_size: int | None
    backend: str | None
    ranks: tuple[RankView, ...]
    stragglers: Stragglers | None
    bus_bandwidth: dict[str, float] = field(default_factory=dict)  # op -> bytes per second

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "job": self.job,
            "world_size": self.world_size,
            "backend": self.backend,
            "ranks": [r.to_dict() for r in self.ranks],
            "stragglers": self.stragglers.to_dict() if self.stragglers else None,
            "bus_bandwidth_bytes_per_s": dict(self.bus_bandwidth),
        }


@dataclass(frozen=True)
class JobsResult:
    """Every job in view, and the rows dropped at the caps."""

    jobs: tuple[JobView, ...]
    dropped: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        """``{"jobs": [...], "dropped": {...}}``."""
        return {"jobs": [j.to_dict() for j in self.jobs], "dropped": dict(self.dropped)}

    def points(self) -> list[MetricPoint]:
        """Per (job, rank): time ratios, overlap, step time, straggler, critical path; the drop counters."""
        pb = PointBuilder()
        for j in self.jobs:
            for r in j.ranks:
                labels = {"job": j.job, "rank": str(r.rank)}
                if r.figures is not None:
                    shares = r.figures.shares
                    for state, attr in STATES:
                        pb.add(TIME_RATIO, getattr(shares, attr), state=state, **labels)
                    if r.figures.overlap_ratio is not None:
                        pb.add(OVERLAP, r.figures.overlap_ratio, **labels)
                if r.step_p50_s is not None:
                    pb.add(STEP_SECONDS, r.step_p50_s, **labels)
                if r.straggler is not None:
                    pb.add(STRAGGLER, 1.0 if r.straggler else 0.0, **labels)
                if r.critical is not None:
                    pb.add(CRITICAL_SECONDS, r.critical.length_p50_s, **labels)
                    for bound in BOUNDS:
                        pb.add(CRITICAL_SHARE, r.critical.shares[bound], bound=bound, **labels)
            for op, value in sorted(j.bus_bandwidth.items()):
                pb.add(BUS_BANDWIDTH, value, job=j.job, op=op)
        for reason in DROP_REASONS:
            pb.add(DROPPED, float(self.dropped.get(reason, 0)), reason=reason)
        return pb.points
