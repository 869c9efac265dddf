"""Agent health: is every agent up, and how its pipeline, sources and exports fare.

Events in, out and dropped, queue depth, export errors, bad input, source lag, span export, scrape
and collect duration.

The agent's own metrics carry no node label; the scrape adds it (the Helm chart's ServiceMonitor
relabels the pod's node into ``node``), so ``node`` filters them like the others.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import dashboard as dm

from .lib import PROMETHEUS, RATE, Q, Spec, single_stat, tbl, timeline, ts

UID = "aaco-agent-health"
AGENT = 'job=~"$job", node=~"$node"'


def job_variable() -> db.QueryVariable:
    """The scrape job(s) of the agents."""
    return (
        db.QueryVariable("job")
        .label("Job")
        .description('Prometheus scrape job of the agents ("aaco" with the Helm chart\'s ServiceMonitor).')
        .datasource(PROMETHEUS)
        .query("label_values(aaco_agent_info, job)")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(dm.VariableOption(selected=True, text="All", value="$__all"))
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
    )


def spec(traces_plugin: str) -> Spec:
    """The dashboard's panels."""
    glance = [
        single_stat(
            "Agents up",
            "Agents Prometheus scraped successfully at the last scrape, out of the agent targets it knows.",
            "short",
            [Q(f"sum(up{{{AGENT}}})", "up", instant=True), Q(f"count(up{{{AGENT}}})", "targets", instant=True)],
        ),
        single_stat(
            "Events dropped",
            "Events the agents dropped over the time range shown, all components and reasons (0 is healthy).",
            "short",
            [Q(f"sum(increase(aaco_events_dropped_total{{{AGENT}}}[$__range])) or vector(0)", instant=True)],
            steps=(("green", None), ("orange", 1)),
            decimals=0,
        ),
        single_stat(
            "Export errors",
            "Failed export attempts over the time range shown, all exporters (0 is healthy).",
            "short",
            [Q(f"sum(increase(aaco_export_errors_total{{{AGENT}}}[$__range])) or vector(0)", instant=True)],
            steps=(("green", None), ("orange", 1)),
            decimals=0,
        ),
        single_stat(
            "Bad input skipped",
            "Rows, records or files the sources skipped as bad input over the time range shown.",
            "short",
            [Q(f"sum(increase(aaco_source_errors_total{{{AGENT}}}[$__range])) or vector(0)", instant=True)],
            steps=(("green", None), ("orange", 1)),
            decimals=0,
        ),
        single_stat(
            "Analyzer errors",
            "Batches an analyzer failed on over the time range shown: a bug, see the agent's log.",
            "short",
            [Q(f"sum(increase(aaco_analyzer_errors_total{{{AGENT}}}[$__range])) or vector(0)", instant=True)],
            steps=(("green", None), ("red", 1)),
            decimals=0,
        ),
        single_stat(
            "Oldest uptime",
            "Time since the longest-running selected agent started (a restart loop shows as a short uptime).",
            "s",
            [Q(f"max(time() - aaco_agent_start_time_seconds{{{AGENT}}})", instant=True)],
        ),
    ]
    agents = [
        timeline(
            "Scrape status",
            "Whether Prometheus could scrape each agent (up). Down for 5 minutes raises AacoAgentDown; no "
            "agent target at all, AacoAgentAbsent.",
            [Q(f"up{{{AGENT}}}", "{{node}} {{instance}}")],
            {"0": ("down", "red"), "1": ("up", "green")},
        ),
        tbl(
            "Agents",
            "Every agent with its version, node and start time.",
            "short",
            [Q(f"max by (node, instance, version) (aaco_agent_info{{{AGENT}}})", instant=True, table=True)],
        ),
    ]
    pipeline = [
        ts(
            "Events in",
            "Events each pipeline component takes in per second (bus, correlator, exporters).",
            "ops",
            [
                Q(
                    f"sum by (node, component) (rate(aaco_events_received_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} {{component}}",
                )
            ],
            min_val=0,
        ),
        ts(
            "Events out",
            "Events each pipeline component passes on or writes out per second.",
            "ops",
            [
                Q(
                    f"sum by (node, component) (rate(aaco_events_emitted_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} {{component}}",
                )
            ],
            min_val=0,
        ),
        ts(
            "Events dropped",
            "Events dropped per second by component and reason (queue_full: the bus or an exporter queue was "
            "full; rejected, retries_exhausted: the OTLP peer refused; shutdown). Sustained drops raise "
            "AacoAgentDroppingEvents.",
            "ops",
            [
                Q(
                    f"sum by (node, component, reason) (rate(aaco_events_dropped_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} {{component}} {{reason}}",
                )
            ],
            min_val=0,
            no_value="no drops",
        ),
        ts(
            "Queue fill",
            "Events waiting in each bounded queue over its capacity. Above 80 % for 5 minutes raises "
            "AacoAgentQueueNearlyFull; at 100 % events are dropped.",
            "percentunit",
            [Q(f"aaco_queue_depth{{{AGENT}}} / aaco_queue_capacity{{{AGENT}}}", "{{node}} {{queue}}")],
            min_val=0,
            max_val=1,
            steps=(("green", None), ("orange", 0.8), ("red", 0.95)),
        ),
        ts(
            "Queue depth",
            "Events waiting in each bounded queue.",
            "short",
            [Q(f"aaco_queue_depth{{{AGENT}}}", "{{node}} {{queue}}")],
            min_val=0,
        ),
        ts(
            "Kernel correlation",
            "Kernel events per second by correlation outcome: matched to an iteration (they get its trace ID) "
            "or not (no iteration contains them).",
            "ops",
            [
                Q(
                    f"sum by (node, outcome) (rate(aaco_correlator_kernels_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} {{outcome}}",
                )
            ],
            min_val=0,
        ),
    ]
    sources = [
        ts(
            "Source lag",
            "Wall time between the newest event of a live source's latest batch and its publication. Above a "
            "minute for 10 minutes raises AacoSourceLagging.",
            "s",
            [Q(f"aaco_source_lag_seconds{{{AGENT}}}", "{{node}} {{source}}")],
            min_val=0,
            steps=(("green", None), ("orange", 60)),
        ),
        ts(
            "Files read",
            "Trace and profile files each source finished reading, per interval.",
            "short",
            [Q(f"sum by (node, source) (increase(aaco_source_files_total{{{AGENT}}}[{RATE}]))", "{{node}} {{source}}")],
            bars=True,
            min_val=0,
        ),
        ts(
            "Bad input skipped",
            "Rows, records or files each source skipped as bad input per interval, by reason (the agent logs "
            "each cause once with the file).",
            "short",
            [
                Q(
                    f"sum by (node, source, reason) (increase(aaco_source_errors_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} {{source}} {{reason}}",
                )
            ],
            bars=True,
            min_val=0,
            no_value="no bad input",
        ),
        ts(
            "Capture windows",
            "Profiler capture windows per interval by outcome (ok, failed, timeout, refused_rate, "
            "refused_queue), for agents with a capture source.",
            "short",
            [
                Q(
                    f"sum by (node, source, outcome) (increase(aaco_captures_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} {{source}} {{outcome}}",
                )
            ],
            bars=True,
            min_val=0,
            no_value="no capture source",
        ),
        ts(
            "Analyzer inputs not used",
            "Values the drift and throttle analyzers did not use per interval, by reason (caps reached, late "
            "or non-finite input): nonzero means their results cover less than the input.",
            "short",
            [
                Q(
                    f"sum by (node, reason) (increase(aaco_drift_dropped_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} drift: {{reason}}",
                ),
                Q(
                    f"sum by (node, reason) (increase(aaco_throttle_dropped_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} throttle: {{reason}}",
                ),
            ],
            min_val=0,
        ),
        ts(
            "GPU telemetry series",
            "GPU telemetry series the telemetry analyzer keeps, and readings it did not keep (max_series: the "
            "series cap; unknown_metric) per interval.",
            "short",
            [
                Q(f"aaco_telemetry_series{{{AGENT}}}", "{{node}} series kept"),
                Q(
                    f"sum by (node, reason) (increase(aaco_telemetry_series_dropped_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} not kept: {{reason}}",
                ),
            ],
            min_val=0,
        ),
    ]
    exports = [
        ts(
            "Export errors",
            "Failed export attempts per second by exporter (lake, otlp, ...). Sustained errors raise "
            "AacoExporterFailing.",
            "ops",
            [
                Q(
                    f"sum by (node, exporter) (rate(aaco_export_errors_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} {{exporter}}",
                )
            ],
            min_val=0,
            no_value="no export errors",
        ),
        ts(
            "Spans exported",
            "Spans encoded for OTLP per second by kind (root: iterations; kernel; launch), kernel spans "
            "summarised into their root span by the span budget, and links between application spans and "
            "GPU iterations.",
            "ops",
            [
                Q(
                    f"sum by (node, kind) (rate(aaco_spans_encoded_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} encoded {{kind}}",
                ),
                Q(
                    f"sum by (node, reason) (rate(aaco_spans_summarized_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} summarised ({{reason}})",
                ),
                Q(
                    f"sum by (node, direction) (rate(aaco_span_links_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} links {{direction}}",
                ),
            ],
            min_val=0,
            no_value="OTLP export off",
        ),
        ts(
            "OTLP receiver",
            "Requests the agent's OTLP receiver took from applications per second, by protocol, signal and "
            "outcome, and the spans/metrics/logs items in them (agents with the receiver on).",
            "ops",
            [
                Q(
                    f"sum by (node, protocol, signal, outcome) (rate(aaco_receiver_requests_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} {{protocol}} {{signal}} {{outcome}}",
                ),
                Q(
                    f"sum by (node, signal) (rate(aaco_receiver_items_total{{{AGENT}}}[{RATE}]))",
                    "{{node}} {{signal}} items",
                ),
            ],
            min_val=0,
            no_value="receiver off",
        ),
        ts(
            "Scrape and collect duration",
            "How long Prometheus took to scrape each agent (scrape_duration_seconds) and how long the agent "
            "took to render its previous scrape (aaco_collect_duration_seconds).",
            "s",
            [
                Q(f"scrape_duration_seconds{{{AGENT}}}", "{{node}} scrape"),
                Q(f"aaco_collect_duration_seconds{{{AGENT}}}", "{{node}} collect"),
            ],
            min_val=0,
        ),
        ts(
            "Series per scrape",
            "Samples each scrape of an agent returned: bounded by design (label sets are capped); a steady "
            "climb is a cardinality leak.",
            "short",
            [
                Q(f"scrape_samples_scraped{{{AGENT}}}", "{{node}} samples"),
                Q(f"aaco_stats_series_dropped_total{{{AGENT}}}", "{{node}} self-metric series refused"),
            ],
            min_val=0,
        ),
    ]
    return Spec(
        uid=UID,
        title="AACO / Agent health",
        description="The agents themselves: up, events in/out/dropped, queues, export errors, bad input, "
        "source lag, span export, scrape and collect duration.",
        tags=("agent",),
        extra_variables=[job_variable()],
        rows=[
            ("At a glance", glance),
            ("Agents", agents),
            ("Pipeline", pipeline),
            ("Sources", sources),
            ("Exports and scrapes", exports),
        ],
    )
