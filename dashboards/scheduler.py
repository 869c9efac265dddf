"""CPU scheduler: the CPU side of the processes that feed the GPUs.

Runqueue latency, context switches, off-CPU time and page faults (eBPF sched tracepoints, or /proc
where eBPF cannot run).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from .lib import PROMETHEUS, RATE, WORKLOAD, Q, Spec, heat, single_stat, trace_links, ts

UID = "aaco-scheduler"
SCHED = 'node=~"$node", comm=~"$comm"'
LEGEND = "{{node}} {{comm}} ({{pid}})"
SWITCHES = "aaco_sched_context_switches_total"


def comm_variable() -> db.QueryVariable:
    """The process (command name) filter of the scheduler panels."""
    return (
        db.QueryVariable("comm")
        .label("Process")
        .description("Command name of the traced processes (the GPU workloads and the agent itself).")
        .datasource(PROMETHEUS)
        .query('label_values(aaco_sched_oncpu_seconds_total{node=~"$node"}, comm)')
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(dm.VariableSort.NATURAL_ASC)
    )


def spec(traces_plugin: str) -> Spec:
    """The dashboard's panels."""
    runqueue = [
        heat(
            "Runqueue latency",
            "Time the traced processes' threads waited on a runqueue, from wakeup or preemption to running "
            "again (log2 buckets, per interval). Milliseconds here stall the launch thread and idle the GPU.",
            "s",
            Q(
                f"sum by (le) (rate(aaco_sched_runqueue_latency_seconds_bucket{{{SCHED}}}[{RATE}]))",
                "{{le}}",
                heatmap=True,
            ),
        ),
        ts(
            "Runqueue latency p99 by process",
            "p99 runqueue latency of each traced process per interval.",
            "s",
            [
                Q(
                    f"histogram_quantile(0.99, sum by (node, comm, pid, le) "
                    f"(rate(aaco_sched_runqueue_latency_seconds_bucket{{{SCHED}}}[{RATE}])))",
                    LEGEND,
                )
            ],
            min_val=0,
        ),
        ts(
            "Scheduler interference index",
            "Share of the busy threads' wall time spent runnable but waiting for a CPU in the latest "
            "interval (see docs/metrics.md): other work is taking the CPUs this process needs.",
            "percentunit",
            [Q(f"aaco_sched_interference_ratio{{{SCHED}}}", LEGEND)],
            min_val=0,
            max_val=1,
            steps=(("green", None), ("orange", 0.05), ("red", 0.2)),
        ),
        single_stat(
            "Worst interference now",
            "The highest scheduler interference index among the selected processes.",
            "percentunit",
            [Q(f"max(aaco_sched_interference_ratio{{{SCHED}}})", instant=True)],
            steps=(("green", None), ("orange", 0.05), ("red", 0.2)),
            width=12,
            height=8,
        ),
    ]
    switches = [
        ts(
            "Context switches",
            "Context switches per second of each process's threads: voluntary (blocked or slept: I/O, locks, "
            "synchronisation with the GPU) or involuntary (preempted: CPU contention).",
            "ops",
            [
                Q(
                    f"sum by (node, comm, kind) (rate(aaco_sched_context_switches_total{{{SCHED}}}[{RATE}]))",
                    "{{node}} {{comm}} {{kind}}",
                )
            ],
            min_val=0,
        ),
        ts(
            "Involuntary share of switches",
            "Involuntary switches over all switches: above a few percent the process is being preempted.",
            "percentunit",
            [
                Q(
                    f'sum by (node, comm) (rate({SWITCHES}{{{SCHED}, kind="involuntary"}}[{RATE}])) '
                    f"/ sum by (node, comm) (rate({SWITCHES}{{{SCHED}}}[{RATE}]))",
                    "{{node}} {{comm}}",
                )
            ],
            min_val=0,
            max_val=1,
        ),
    ]
    cpu_time = [
        ts(
            "Off-CPU time per workload",
            "Seconds per second each process's threads spent off CPU (asleep, blocked or waiting on a "
            "runqueue), summed over its threads: idle worker threads count too, so compare with on-CPU time.",
            "short",
            [Q(f"sum by (node, comm) (rate(aaco_sched_offcpu_seconds_total{{{SCHED}}}[{RATE}]))", "{{node}} {{comm}}")],
            min_val=0,
        ),
        ts(
            "On-CPU time (CPU cores used)",
            "Seconds per second each process's threads ran on a CPU: the number of cores it keeps busy.",
            "short",
            [Q(f"sum by (node, comm) (rate(aaco_sched_oncpu_seconds_total{{{SCHED}}}[{RATE}]))", "{{node}} {{comm}}")],
            min_val=0,
        ),
        ts(
            "Page faults and fault penalty",
            "User page faults per second of each process, and the fault penalty index (faults per second "
            "weighted by their share of off-CPU time, see docs/metrics.md): faults that actually stall.",
            "short",
            [
                Q(
                    f"sum by (node, comm) (rate(aaco_sched_page_faults_total{{{SCHED}}}[{RATE}]))",
                    "{{node}} {{comm}} faults/s",
                ),
                Q(f"aaco_sched_fault_penalty_index{{{SCHED}}}", LEGEND + " penalty"),
            ],
            min_val=0,
        ),
        ts(
            "Iteration latency p99 (for comparison)",
            "p99 iteration latency of the workloads on the same nodes: runqueue or fault spikes that line up "
            "with latency spikes point at the CPU side.",
            "s",
            [
                Q(
                    f"histogram_quantile(0.99, sum by (node, model, le) "
                    f"(rate(aaco_iteration_latency_seconds_bucket{{{WORKLOAD}}}[{RATE}])))",
                    "{{node}} {{model}} p99",
                    exemplar=True,
                )
            ],
            links=trace_links(traces_plugin),
            min_val=0,
        ),
    ]
    return Spec(
        uid=UID,
        title="AACO / CPU scheduler",
        description="The CPU side of the GPU workloads: runqueue latency, context switches, off-CPU and on-CPU "
        "time, page faults, scheduler interference, beside the workloads' latency.",
        tags=("scheduler",),
        extra_variables=[comm_variable()],
        rows=[
            ("Runqueue", runqueue),
            ("Context switches", switches),
            ("CPU time and faults", cpu_time),
        ],
    )
