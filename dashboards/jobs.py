"""Training jobs: per distributed job, its step time by rank, the stragglers, overlap and collective bandwidth.

The panels read the jobs analyzer's series (``analyzers/jobs_result.py``; docs/jobs.md): each rank's
median step time, HTA's straggler verdict, temporal breakdown and communication/computation overlap,
and each job's nccl-tests bus bandwidth per collective. Their ``job`` label is the training job's
(the agent's, kept by scraping with ``honor_labels`` as the chart's ServiceMonitor does); the
dashboard's ``training_job`` and ``rank`` variables select by it.

The link's peak is a constant of this file (``LINK_PEAK_BYTES_PER_S``: 50 GB/s, one 400 Gb/s NIC per
GPU, the inter-node fabric of a DGX H100 or MI300X platform): a dashed line on the bandwidth panel and
the denominator of its share. Change it for your fabric and regenerate (dashboards/README.md).

The critical path's panels read each rank's recent steps' paths (HTA's lightweight critical path,
found at ingest): its median length beside the step time, and the share of it each bound takes.
"""

from __future__ import annotations

from typing import Final

from .lib import NODE, Q, Spec, bars, query_variable, single_stat, tbl, timeline, ts

UID: Final = "aaco-jobs"
LINK_PEAK_BYTES_PER_S: Final = 50e9  # 400 Gb/s per GPU
RANKS: Final = f'{NODE}, job=~"$training_job", rank=~"$rank"'
JOBS: Final = f'{NODE}, job=~"$training_job"'
STEP: Final = f"aaco_job_step_seconds{{{RANKS}}}"
STRAGGLER: Final = f"aaco_job_straggler{{{RANKS}}}"
BUS: Final = f"aaco_job_collective_bus_bandwidth_bytes_per_second{{{JOBS}}}"
CRITICAL: Final = f"aaco_job_critical_path_ratio{{{RANKS}}}"


def variables() -> list:
    """The training job and its ranks (the job series' labels)."""
    return [
        query_variable(
            "training_job",
            "Training job",
            "label_values(aaco_job_step_seconds, job)",
            "Distributed training jobs the agents see (the job label of the aaco_job_* series: configured, from the "
            "ranks' environment, or named from their ranks as <backend>-<world>x-<start>; docs/jobs.md).",
        ),
        query_variable(
            "rank",
            "Rank",
            'label_values(aaco_job_step_seconds{job=~"$training_job"}, rank)',
            "Ranks of the selected jobs.",
        ),
    ]


def _ratio(state: str) -> str:
    return f'aaco_job_time_ratio{{{RANKS}, state="{state}"}}'


def spec(traces_plugin: str) -> Spec:
    """The dashboard's panels."""
    glance = [
        single_stat(
            "Ranks straggling",
            "Ranks HTA's straggler analysis names now, per job (aaco_job_straggler = 1). HTA always names its k "
            "candidates (analyzers.jobs.stragglers, 2): with k ranks or fewer in view all of them are named. An agent "
            "sees the ranks of its node; the job's world size can be larger.",
            "short",
            [Q(f"sum by (job) ({STRAGGLER})", "{{job}}", instant=True)],
            steps=(("green", None), ("orange", 1)),
            width=12,
        ),
        single_stat(
            "Slowest rank over the median",
            "Each job's slowest rank's median step time over the median of its ranks' (1: balanced).",
            "short",
            [Q(f"max by (job) ({STEP}) / quantile by (job) (0.5, {STEP})", "{{job}}", instant=True)],
            steps=(("green", None), ("orange", 1.05), ("red", 1.2)),
            decimals=3,
            width=12,
        ),
    ]
    steps = [
        ts(
            "Step time by rank",
            "Median ProfilerStep time of each rank over its recent steps (analyzers.jobs.window_steps). A rank "
            "above the others holds every collective of the job back.",
            "s",
            [Q(STEP, "{{job}} rank {{rank}}")],
            min_val=0,
            width=16,
        ),
        bars(
            "Step time by rank, now",
            "The latest median step time per rank, slowest first: the straggler is usually at the top.",
            "s",
            [Q(f"sort_desc({STEP})", "{{job}} rank {{rank}}", instant=True)],
            width=8,
            min_val=0,
        ),
        timeline(
            "Straggler by rank",
            "HTA's straggler analysis over each job's recent steps: the ranks whose most varying significant "
            "collective starts latest, per rank over time. A rank red for 10 minutes fires AacoJobRankStraggling.",
            [Q(STRAGGLER, "{{job}} rank {{rank}}")],
            {"0": ("keeps up", "green"), "1": ("straggler", "red")},
            width=24,
        ),
    ]
    breakdown = [
        tbl(
            "Temporal breakdown by rank (idle, compute, non-compute)",
            "HTA's temporal breakdown of each rank's latest window: idle, computation kernels, and non-compute "
            "(communication, memory and other kernels) as shares of its kernel time.",
            "percentunit",
            [
                Q(_ratio("idle"), "idle", instant=True, table=True),
                Q(_ratio("compute"), "compute", instant=True, table=True),
                Q(_ratio("non_compute"), "non-compute", instant=True, table=True),
            ],
            sort_by="Value #A",
        ),
        ts(
            "Idle share by rank",
            "Share of each rank's kernel time with no GPU work (HTA's idle time): a rank idler than the others "
            "waits on them, a rank busier than the others makes them wait.",
            "percentunit",
            [Q(_ratio("idle"), "{{job}} rank {{rank}}")],
            min_val=0,
            max_val=1,
        ),
        ts(
            "Communication/computation overlap by rank",
            "Share of each rank's communication kernel time during which a computation kernel also ran (HTA's "
            "get_comm_comp_overlap): low overlap leaves the collectives exposed on the critical path.",
            "percentunit",
            [Q(f"aaco_job_comm_comp_overlap_ratio{{{RANKS}}}", "{{job}} rank {{rank}}")],
            min_val=0,
            max_val=1,
        ),
    ]
    critical = [
        ts(
            "Critical path by bound",
            "What bounds each job's steps, averaged over the selected ranks: the share of the critical path (HTA's "
            "lightweight critical path of each recent step) spent in CPU operators and runtime calls (cpu), GPU "
            "computation (compute), collectives (comm), kernel launch delay (launch) and gaps between a stream's "
            "kernels (gap). A large cpu, launch or gap share is time the GPU could have saved.",
            "percentunit",
            [Q(f"avg by (job, bound) ({CRITICAL})", "{{job}} {{bound}}")],
            min_val=0,
            max_val=1,
            stack=True,
        ),
        tbl(
            "Critical path by rank",
            "The share of each rank's critical path each bound takes, over its recent steps.",
            "percentunit",
            [
                Q(f'aaco_job_critical_path_ratio{{{RANKS}, bound="{b}"}}', b, instant=True, table=True)
                for b in ("cpu", "compute", "comm", "launch", "gap")
            ],
            sort_by="Value #A",
        ),
        ts(
            "Critical path length and step time by rank",
            "The median critical path of each rank's recent steps beside its median step time: the path is the "
            "chain of dependent work no overlap can hide; the rest of the step ran beside it.",
            "s",
            [
                Q(f"aaco_job_critical_path_seconds{{{RANKS}}}", "{{job}} rank {{rank}} critical path"),
                Q(STEP, "{{job}} rank {{rank}} step"),
            ],
            min_val=0,
            width=24,
        ),
    ]
    peak = LINK_PEAK_BYTES_PER_S
    collectives = [
        ts(
            "Collective bus bandwidth against the link's peak",
            "nccl-tests' bus bandwidth of each job's collectives per operation (message size times the bus "
            f"factor over kernel time, collectives of known size only). The dashed line is the link's peak, a "
            f"constant of dashboards/jobs.py: {peak / 1e9:g} GB/s (400 Gb/s per GPU).",
            "Bps",
            [Q(BUS, "{{job}} {{op}}")],
            min_val=0,
            steps=(("green", None), ("red", peak)),
        ),
        ts(
            "Collective bus bandwidth, share of the link's peak",
            f"The bus bandwidth over the link's peak ({peak / 1e9:g} GB/s, dashboards/jobs.py): near 1 the "
            "collectives run at the fabric's speed; far below, they are latency-bound (small messages) or contend.",
            "percentunit",
            [Q(f"{BUS} / {peak:.0f}", "{{job}} {{op}}")],
            min_val=0,
        ),
        ts(
            "Job rows dropped",
            "Rows the jobs analyzer did not fold, per second, by reason: max_jobs and max_ranks (caps reached), "
            "no_rank (a job without a rank), max_pending (a window's newest step over max_pending_kernels).",
            "short",
            [Q(f"sum by (node, reason) (rate(aaco_job_rows_dropped_total{{{NODE}}}[$__rate_interval]))", "{{reason}}")],
            min_val=0,
        ),
    ]
    return Spec(
        uid=UID,
        title="AACO / Training jobs",
        description="Per distributed training job: step time by rank, the straggler, HTA's temporal breakdown and "
        "communication/computation overlap, the critical path's shares, collective bus bandwidth against the "
        "link's peak.",
        tags=("jobs",),
        extra_variables=variables(),
        rows=[
            ("At a glance", glance),
            ("Step time and stragglers", steps),
            ("Where each rank's time goes (HTA)", breakdown),
            ("Critical path (HTA)", critical),
            ("Collectives", collectives),
        ],
    )
