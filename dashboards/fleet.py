"""Fleet: every node and model at once, from the recording rules of dashboards/rules/recording.yaml.

Worst nodes, latency spread across nodes, SLO standing, throttled share of GPUs, drifting models,
bottleneck classes, GPU availability and utilisation per node and namespace.
"""

from __future__ import annotations

from .lib import MODEL, NODE, Q, Spec, bars, single_stat, tbl, trace_links, ts

UID = "aaco-fleet"
NODE_MODEL = 'node=~"$node", model=~"$model"'


def spec(traces_plugin: str) -> Spec:
    """The dashboard's panels."""
    glance = [
        single_stat(
            "Agents reporting",
            "AACO agents Prometheus scrapes successfully (one per GPU node).",
            "short",
            [Q(f"count(aaco_agent_info{{{NODE}}})", instant=True)],
        ),
        single_stat(
            "GPUs up / known",
            "GPUs answering their telemetry backend, and GPUs known, over the selected nodes.",
            "short",
            [
                Q(f"sum(node:aaco_gpus_up:sum{{{NODE}}})", "up", instant=True),
                Q(f"sum(node:aaco_gpus:count{{{NODE}}})", "known", instant=True),
            ],
        ),
        single_stat(
            "GPUs throttled (fleet)",
            "Share of the fleet's GPUs throttled for any reason right now.",
            "percentunit",
            [Q("fleet:aaco_gpus_throttled:ratio", instant=True)],
            steps=(("green", None), ("orange", 0.1), ("red", 0.3)),
        ),
        single_stat(
            "Models over SLO",
            "Node and model pairs whose p99 latency (5 minutes) is above the model's SLO.",
            "short",
            [
                Q(
                    f"count(node_model:aaco_iteration_latency_seconds:p99_over_slo{{{NODE_MODEL}}} > 1) or vector(0)",
                    instant=True,
                )
            ],
            steps=(("green", None), ("red", 1)),
        ),
        single_stat(
            "Models drifting",
            "Models whose latency, kernel count or GPU time is in a drifted state on at least one node.",
            "short",
            [Q(f"count(model:aaco_drift_active:nodes{{{MODEL}}}) or vector(0)", instant=True)],
            steps=(("green", None), ("orange", 1)),
        ),
        single_stat(
            "Uncorrectable GPU errors (1 h)",
            "Uncorrectable (ECC) GPU memory errors over the last hour, fleet-wide.",
            "short",
            [Q(f"sum(node:aaco_gpu_errors_uncorrected:increase1h{{{NODE}}})", instant=True)],
            steps=(("green", None), ("red", 1)),
            decimals=0,
        ),
    ]
    latency = [
        bars(
            "Worst nodes",
            "Nodes ranked by their p99 latency over the fleet's typical p99 for the same model (the median "
            "over nodes), worst model per node: 1 is typical, 2 is twice as slow as the typical node.",
            "short",
            [
                Q(
                    f"topk(10, max by (node) (node_model:aaco_iteration_latency_seconds:p99_vs_fleet{{{NODE_MODEL}}}))",
                    "{{node}}",
                    instant=True,
                )
            ],
            steps=(("green", None), ("orange", 1.25), ("red", 2.0)),
            min_val=0,
        ),
        ts(
            "p99 latency per model (fleet)",
            "p99 iteration latency of each model over all nodes (5 minutes), beside the median over nodes "
            "of each node's p99.",
            "s",
            [
                Q(f"model:aaco_iteration_latency_seconds:p99_5m{{{MODEL}}}", "{{model}} fleet p99"),
                Q(f"model:aaco_iteration_latency_seconds:p99_5m_node_median{{{MODEL}}}", "{{model}} median node p99"),
            ],
            links=trace_links(traces_plugin),
            min_val=0,
        ),
        ts(
            "Latency spread across nodes",
            "For each model, the slowest node's p99 over the fastest node's (1: every node alike). A spread "
            "that grows means some nodes degrade: see 'Worst nodes'.",
            "short",
            [Q(f"model:aaco_iteration_latency_seconds:p99_spread_5m{{{MODEL}}}", "{{model}}")],
            min_val=1,
        ),
        ts(
            "p99 per node and model",
            "Each node's p99 latency per model (5 minutes).",
            "s",
            [Q(f"node_model:aaco_iteration_latency_seconds:p99_5m{{{NODE_MODEL}}}", "{{model}} {{node}}")],
            links=trace_links(traces_plugin),
            min_val=0,
        ),
        ts(
            "p99 over SLO",
            "Each node's p99 over its model's SLO: above 1 for 5 minutes raises AacoIterationLatencySLOBreach.",
            "percentunit",
            [Q(f"node_model:aaco_iteration_latency_seconds:p99_over_slo{{{NODE_MODEL}}}", "{{model}} {{node}}")],
            steps=(("green", None), ("red", 1.0)),
            min_val=0,
        ),
        ts(
            "Throughput per model",
            "Iterations completed per second per model over the fleet (5 minutes).",
            "ops",
            [Q(f"model:aaco_iterations:rate5m{{{MODEL}}}", "{{model}}")],
            min_val=0,
        ),
    ]
    gpus = [
        ts(
            "Throttled share of GPUs per node",
            "Share of each node's GPUs throttled (any reason), and the fleet's share.",
            "percentunit",
            [
                Q(f"node:aaco_gpus_throttled:ratio{{{NODE}}}", "{{node}}"),
                Q("fleet:aaco_gpus_throttled:ratio", "fleet"),
            ],
            min_val=0,
            max_val=1,
        ),
        ts(
            "Share of GPU time throttled per node",
            "Share of each node's GPU time spent in throttling episodes over 5 minutes (throttle analyzer), "
            "and the fleet's.",
            "percentunit",
            [
                Q(f"node:aaco_gpu_throttled_time:ratio5m{{{NODE}}}", "{{node}}"),
                Q("fleet:aaco_gpu_throttled_time:ratio5m", "fleet"),
            ],
            min_val=0,
            max_val=1,
        ),
        ts(
            "Throttling latency impact per model",
            "For each model, the worst ratio over its nodes of the median latency inside throttling episodes "
            "to the median outside: what throttling costs that model.",
            "short",
            [Q(f"model:aaco_throttle_latency_impact:max{{{MODEL}}}", "{{model}}")],
            steps=(("green", None), ("orange", 1.1), ("red", 1.5)),
        ),
        ts(
            "GPU utilisation per node",
            "Mean GPU utilisation of each node's GPUs.",
            "percentunit",
            [Q(f"node:aaco_gpu_utilization:avg{{{NODE}}}", "{{node}}")],
            min_val=0,
            max_val=1,
        ),
        ts(
            "GPU utilisation per namespace",
            "Mean utilisation of the GPUs allocated to each Kubernetes namespace (empty: unallocated GPUs, "
            "or no kubelet pod-resources API).",
            "percentunit",
            [Q('namespace:aaco_gpu_utilization:avg{namespace=~"$namespace"}', "{{namespace}}")],
            min_val=0,
            max_val=1,
        ),
        ts(
            "GPUs down per node",
            "GPUs known minus GPUs up, per node.",
            "short",
            [Q(f"node:aaco_gpus:count{{{NODE}}} - node:aaco_gpus_up:sum{{{NODE}}}", "{{node}}")],
            min_val=0,
        ),
        ts(
            "GPU power per node",
            "Power drawn by each node's GPUs together.",
            "watt",
            [Q(f"node:aaco_gpu_power_watts:sum{{{NODE}}}", "{{node}}")],
            min_val=0,
        ),
    ]
    diagnosis = [
        tbl(
            "Drifting models",
            "Models in a drifted state (latency, kernels per iteration or GPU time), with the number of nodes "
            "they drift on.",
            "short",
            [Q(f"model:aaco_drift_active:nodes{{{MODEL}}}", instant=True, table=True)],
        ),
        tbl(
            "Bottleneck classes",
            "How many nodes see each model in each bottleneck class right now.",
            "short",
            [Q(f"model_class:aaco_bottleneck_class:nodes{{{MODEL}}} > 0", instant=True, table=True)],
        ),
        ts(
            "Agent ingest and drops per node",
            "Events each node's agent takes in per second, and drops (5 minutes).",
            "ops",
            [
                Q(f"node:aaco_events_received:rate5m{{{NODE}}}", "{{node}} received"),
                Q(f"node:aaco_events_dropped:rate5m{{{NODE}}}", "{{node}} dropped"),
            ],
            min_val=0,
            width=24,
        ),
    ]
    return Spec(
        uid=UID,
        title="AACO / Fleet",
        description="All nodes and models at once from the recording rules: worst nodes, latency spread, SLO "
        "standing, throttled share, drifting models, bottleneck classes, GPU availability and utilisation.",
        tags=("fleet",),
        rows=[
            ("At a glance", glance),
            ("Latency across the fleet", latency),
            ("GPUs across the fleet", gpus),
            ("Diagnosis across the fleet", diagnosis),
        ],
    )
