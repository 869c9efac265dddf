"""Workload diagnosis: where the time went and why latency changed, per model.

Latency (p50/p95/p99 with exemplars, against its SLO), throughput, KAR, launch tax, the temporal
breakdown of the devices, GPU time per kernel family, the bottleneck class over time with its
evidence, drift; drift change points and throttle episodes as annotations.
"""

from __future__ import annotations

from .lib import (
    DEVICE,
    MODEL,
    NODE,
    RATE,
    WORKLOAD,
    Annotation,
    Q,
    Spec,
    bars,
    heat,
    scatter,
    single_stat,
    tbl,
    timeline,
    trace_links,
    ts,
)

UID = "aaco-workload"
BUCKETS = f"aaco_iteration_latency_seconds_bucket{{{WORKLOAD}}}"
LAUNCH_BANDS = (("green", None), ("orange", 1.0), ("red", 5.0))


def _quantile(q: float) -> str:
    return f"histogram_quantile({q}, sum by (node, model, le) (rate({BUCKETS}[{RATE}])))"


def spec(traces_plugin: str) -> Spec:
    """The dashboard's panels."""
    links = trace_links(traces_plugin)
    latency = [
        ts(
            "Iteration latency p50 / p95 / p99",
            "Latency quantiles of each model's iterations (inference requests, training steps) from the "
            "agent's latency histogram. The dots are exemplars: one iteration each, with its trace ID; "
            "click one to open that trace, or use the link for every trace of the model.",
            "s",
            [
                Q(_quantile(0.5), "{{model}} {{node}} p50", exemplar=True),
                Q(_quantile(0.95), "{{model}} {{node}} p95", exemplar=True),
                Q(_quantile(0.99), "{{model}} {{node}} p99", exemplar=True),
            ],
            links=links,
            min_val=0,
            width=16,
        ),
        single_stat(
            "p99 over SLO",
            "Each model's p99 (5 minutes) over its SLO (model:aaco_iteration_latency_slo_seconds:effective, "
            "from dashboards/rules/recording.yaml). Above 1 for 5 minutes raises AacoIterationLatencySLOBreach.",
            "percentunit",
            [Q(f"max by (model) (node_model:aaco_iteration_latency_seconds:p99_over_slo{{{WORKLOAD}}})", "{{model}}")],
            steps=(("green", None), ("orange", 0.8), ("red", 1.0)),
            width=8,
            height=8,
        ),
        heat(
            "Iteration latency distribution",
            "Every iteration's latency, bucketed per interval (histogram buckets), with exemplars: a second "
            "mode or a long tail shows here before it moves the quantiles.",
            "s",
            Q(f"sum by (le) (rate({BUCKETS}[{RATE}]))", "{{le}}", heatmap=True, exemplar=True),
            exemplars=True,
        ),
        ts(
            "p99 against its SLO",
            "Each model's p99 latency over 5 minutes per node (recording rule) beside its SLO.",
            "s",
            [
                Q(f"node_model:aaco_iteration_latency_seconds:p99_5m{{{WORKLOAD}}}", "{{model}} {{node}} p99 (5m)"),
                Q(f"model:aaco_iteration_latency_slo_seconds:effective{{{MODEL}}}", "{{model}} SLO"),
            ],
            links=links,
            min_val=0,
        ),
        ts(
            "Throughput",
            "Iterations per second: completed iterations per second of wall time (from the histogram count), "
            "and the agent's sequential throughput (iterations per second of iteration time, which ignores "
            "idle time between them).",
            "ops",
            [
                Q(
                    f"sum by (node, model) (rate(aaco_iteration_latency_seconds_count{{{WORKLOAD}}}[{RATE}]))",
                    "{{model}} {{node}} completed/s",
                ),
                Q(f"aaco_iteration_throughput_per_second{{{WORKLOAD}}}", "{{model}} {{node}} sequential"),
            ],
            min_val=0,
        ),
    ]
    kernels = [
        ts(
            "KAR (kernel amplification ratio)",
            "Kernels launched per iteration over the ONNX graph's node count. Near 1: one kernel per graph "
            "node; well above 1: ops decompose into many small kernels (a fusion opportunity); below 1: "
            "fused or CPU-resident ops.",
            "short",
            [Q(f"aaco_kar_ratio{{{WORKLOAD}}}", "{{model}} {{node}}")],
            min_val=0,
        ),
        ts(
            "Kernels per iteration",
            "Mean kernels launched per iteration, beside the ONNX graph's node count (KAR's denominator).",
            "short",
            [
                Q(f"aaco_kernels_per_iteration{{{WORKLOAD}}}", "{{model}} {{node}} kernels/iteration"),
                Q(f"aaco_model_graph_nodes{{{WORKLOAD}}}", "{{model}} graph nodes"),
            ],
            min_val=0,
        ),
        ts(
            "Launch tax",
            "Microkernel fraction x kernel launches per second / 1000. Bands: under 1 healthy; 1 to 5 "
            "elevated (launches start to set the pace); 5 and above severe (launch-bound: CUDA/HIP graphs, "
            "fusion, bigger batches). A jump raises AacoLaunchBoundRegression.",
            "suffix: kernels/ms",
            [Q(f"aaco_launch_tax_score{{{WORKLOAD}}}", "{{model}} {{node}}")],
            steps=LAUNCH_BANDS,
            min_val=0,
        ),
        ts(
            "Launch rate and microkernels",
            "Kernels launched per second of wall time, and the fraction of kernels shorter than the "
            "microkernel threshold (10 us): the two factors of the launch tax.",
            "short",
            [
                Q(f"aaco_kernel_launch_rate_per_second{{{WORKLOAD}}}", "{{model}} {{node}} launches/s"),
                Q(f"aaco_microkernel_ratio{{{WORKLOAD}}} * 100", "{{model}} {{node}} microkernel %"),
            ],
            min_val=0,
        ),
        ts(
            "Launch delay p95",
            "GPU start of each kernel minus the end of its CPU launch call (Holistic Trace Analysis's launch "
            "delay), p95 per interval: long delays mean a queue of launched work in front of the kernel.",
            "s",
            [
                Q(
                    f"histogram_quantile(0.95, sum by (node, model, le) "
                    f"(rate(aaco_kernel_launch_delay_seconds_bucket{{{WORKLOAD}}}[{RATE}])))",
                    "{{model}} {{node}} p95",
                )
            ],
            min_val=0,
        ),
        ts(
            "CPU time in launch calls",
            "CPU seconds per second spent in kernel launch calls (cudaLaunchKernel, hipLaunchKernel, ...): the "
            "launching thread's budget; near 1 it is saturated and the GPU waits for it.",
            "short",
            [
                Q(
                    f"sum by (node, model) (rate(aaco_kernel_launch_cpu_seconds_total{{{WORKLOAD}}}[{RATE}]))",
                    "{{model}} {{node}}",
                )
            ],
            min_val=0,
        ),
        ts(
            "Short kernels and launch outliers",
            "Per second, as Holistic Trace Analysis defines them: GPU events shorter than their CPU launch call "
            "(short kernels), launch calls longer than the runtime cutoff (50 us) and kernels whose launch "
            "delay exceeds the delay cutoff (100 us).",
            "ops",
            [
                Q(
                    f"sum by (model) (rate(aaco_short_kernels_total{{{WORKLOAD}}}[{RATE}]))",
                    "{{model}} short kernels",
                ),
                Q(
                    f"sum by (model) (rate(aaco_launch_runtime_outliers_total{{{WORKLOAD}}}[{RATE}]))",
                    "{{model}} slow launch calls",
                ),
                Q(
                    f"sum by (model) (rate(aaco_launch_delay_outliers_total{{{WORKLOAD}}}[{RATE}]))",
                    "{{model}} delayed kernels",
                ),
            ],
            min_val=0,
        ),
        ts(
            "GPU events by kind",
            "Kernels, copies and memsets seen per second, per model.",
            "ops",
            [
                Q(
                    f"sum by (model, kind) (rate(aaco_kernels_total{{{WORKLOAD}}}[{RATE}]))",
                    "{{model}} {{kind}}",
                )
            ],
            min_val=0,
            stack=True,
        ),
    ]
    time_split = [
        ts(
            "Temporal breakdown",
            "Share of the latest capture window each device spent computing (kernels), in copies and "
            "memsets only (non-compute) and idle, as Holistic Trace Analysis defines it. Idle-heavy: the "
            "host does not keep the device fed (launch- or CPU-bound).",
            "percentunit",
            [Q(f"aaco_device_time_ratio{{{DEVICE}}}", "{{node}} device {{gpu}} {{state}}")],
            stack=True,
            min_val=0,
            max_val=1,
        ),
        ts(
            "GPU time per iteration by kernel family",
            "Mean GPU time per iteration spent in each kernel family (GEMM, convolution, attention, "
            "normalisation/reduction, elementwise, copies, communication, other): what to optimise first.",
            "s",
            [Q(f"aaco_kernel_family_seconds_per_iteration{{{WORKLOAD}}}", "{{model}} {{family}}")],
            stack=True,
            min_val=0,
        ),
        ts(
            "Share of GPU time by kernel family",
            "Each family's share of the GPU time of the model's kernels over the interval.",
            "percentunit",
            [
                Q(
                    f"sum by (model, family) (rate(aaco_kernel_family_seconds_total{{{WORKLOAD}}}[{RATE}])) "
                    f"/ on (model) group_left () "
                    f"sum by (model) (rate(aaco_kernel_family_seconds_total{{{WORKLOAD}}}[{RATE}]))",
                    "{{model}} {{family}}",
                )
            ],
            stack=True,
            min_val=0,
            max_val=1,
        ),
    ]
    diagnosis = [
        timeline(
            "Bottleneck class over time",
            "The bottleneck class of each model (launch-bound, CPU-bound, memory-bound, compute-bound, "
            "queue-bound, throttled, unknown) from the bottleneck analyzer, as it changed "
            "(docs/bottleneck_taxonomy.md).",
            [Q(f"max by (model, class) (aaco_bottleneck_class{{{WORKLOAD}}}) == 1", "{{model}}: {{class}}")],
            {"1": ("current class", "purple")},
        ),
        ts(
            "Bottleneck confidence",
            "Confidence (0..1) of each model's current bottleneck class: low when inputs are missing or "
            "the signals disagree.",
            "percentunit",
            [Q(f"aaco_bottleneck_confidence{{{WORKLOAD}}}", "{{model}} {{node}}")],
            min_val=0,
            max_val=1,
        ),
        tbl(
            "Bottleneck evidence now",
            "The current class of each model beside the signals the classifier weighs: confidence, launch "
            "tax, microkernel share, KAR and p99 latency (the full evidence with weights is in the findings "
            "and analysis.json).",
            "short",
            [
                Q(
                    f"max by (node, model, class) (aaco_bottleneck_class{{{WORKLOAD}}}) == 1",
                    instant=True,
                    table=True,
                ),
                Q(f"max by (node, model) (aaco_bottleneck_confidence{{{WORKLOAD}}})", instant=True, table=True),
                Q(f"max by (node, model) (aaco_launch_tax_score{{{WORKLOAD}}})", instant=True, table=True),
                Q(f"max by (node, model) (aaco_microkernel_ratio{{{WORKLOAD}}})", instant=True, table=True),
                Q(f"max by (node, model) (aaco_kar_ratio{{{WORKLOAD}}})", instant=True, table=True),
                Q(
                    f"max by (node, model) (node_model:aaco_iteration_latency_seconds:p99_5m{{{WORKLOAD}}})",
                    instant=True,
                    table=True,
                ),
            ],
            width=24,
        ),
        ts(
            "Throttling latency impact",
            "Median iteration latency inside throttling episodes over the median outside them, with its 95 % "
            "bootstrap confidence interval (throttle analyzer): a lower bound above 1 means throttling "
            "measurably slows the model down.",
            "short",
            [
                Q(f"aaco_throttle_latency_impact_ratio{{{WORKLOAD}}}", "{{model}} {{node}} impact"),
                Q(f"aaco_throttle_latency_impact_ci_low_ratio{{{WORKLOAD}}}", "{{model}} {{node}} 95 % low"),
                Q(f"aaco_throttle_latency_impact_ci_high_ratio{{{WORKLOAD}}}", "{{model}} {{node}} 95 % high"),
            ],
            steps=(("green", None), ("orange", 1.1), ("red", 1.5)),
        ),
        ts(
            "Iterations inside and outside throttling",
            "Iterations per second classified against throttling episodes on their GPUs: inside, outside, "
            "or unknown (no telemetry then). The impact above compares the first two.",
            "ops",
            [
                Q(
                    f"sum by (model, state) (rate(aaco_throttle_iterations_total{{{WORKLOAD}}}[{RATE}]))",
                    "{{model}} {{state}}",
                )
            ],
            stack=True,
            min_val=0,
        ),
        timeline(
            "Drift state",
            "Series of each model in a drifted state (from a change point until the detector re-baselined): "
            "latency, kernels per iteration, kernel time per iteration.",
            [Q(f"max by (model, series) (aaco_drift_active{{{WORKLOAD}}})", "{{model}} {{series}}")],
            {"0": ("in control", "green"), "1": ("drifted", "orange")},
        ),
        ts(
            "Drift change points",
            "Change points the drift analyzer detected per interval, by series and direction (up: slower, "
            "more kernels or GPU time). Also drawn as annotations on every time series panel.",
            "short",
            [
                Q(
                    f"sum by (model, series, direction) "
                    f"(increase(aaco_drift_changepoints_total{{{WORKLOAD}}}[{RATE}]))",
                    "{{model}} {{series}} {{direction}}",
                )
            ],
            bars=True,
            min_val=0,
            no_value="no change points",
        ),
        ts(
            "Findings",
            "Findings the analyzers reached per interval (drift, throttling, bottleneck, ...), by analyzer "
            "and severity; each is stored with its evidence in the lake's findings dataset.",
            "short",
            [
                Q(
                    f"sum by (analyzer, severity) (increase(aaco_findings_total{{{NODE}}}[{RATE}]))",
                    "{{analyzer}} {{severity}}",
                )
            ],
            bars=True,
            min_val=0,
            no_value="no findings",
        ),
    ]
    annotations = [
        Annotation(
            "Drift change points",
            f"sum by (node, model, series, direction) (increase(aaco_drift_changepoints_total{{{WORKLOAD}}}[1m])) > 0",
            "orange",
            "Drift: {{model}} {{series}} {{direction}} on {{node}}",
            ("model", "series", "direction"),
        ),
        Annotation(
            "Throttle episodes",
            f"max by (node, gpu, reason) (aaco_throttle_active{{{NODE}}}) > 0",
            "red",
            "Throttled ({{reason}}): {{node}} gpu{{gpu}}",
            ("node", "gpu", "reason"),
        ),
    ]
    family = 'node=~"$node"'
    roofline = [
        scatter(
            "Kernel families on the roofline",
            "Each kernel family's arithmetic intensity at HBM (FLOPs per byte, across) against its achieved FLOP/s "
            "(up), from hardware counters (the counters source; docs/counters.md), log scales: left of the ridge "
            "point a family is bound by memory bandwidth, right of it by compute.",
            "flops",
            Q(f'aaco_kernel_family_arithmetic_intensity{{{family}, level="hbm"}}', ""),
            Q(f"aaco_kernel_family_flops_per_second{{{family}}}", ""),
            x_name="FLOP/byte (HBM)",
            y_name="FLOP/s",
        ),
        tbl(
            "Kernel families: how near the roof",
            "Each family's share of the roof that bounds it (bound memory: its HBM bandwidth over the peak; compute: "
            "its FLOP/s over the ceiling of its kind of work), where analyzers.roofline.peaks names the GPU's peaks.",
            "percentunit",
            [Q(f"aaco_kernel_family_roof_fraction{{{family}}}", "", instant=True, table=True)],
            width=6,
        ),
        bars(
            "Kernel families: HBM bandwidth",
            "Each family's achieved HBM bandwidth: its HBM bytes per call over its mean call (hardware counters).",
            "Bps",
            [Q(f"aaco_kernel_family_hbm_bandwidth_bytes_per_second{{{family}}}", "{{node}} {{arch}} {{family}}")],
            width=6,
        ),
    ]
    return Spec(
        uid=UID,
        title="AACO / Workload diagnosis",
        description="Per model: latency against its SLO with trace exemplars, throughput, KAR, launch tax, the "
        "devices' temporal breakdown, GPU time per kernel family, the bottleneck class with its evidence, drift.",
        tags=("workload",),
        annotations=annotations,
        rows=[
            ("Latency and throughput", latency),
            ("Kernels and launches", kernels),
            ("Where the GPU time went", time_split),
            ("Diagnosis", diagnosis),
            ("Roofline (hardware counters)", roofline),
        ],
    )
