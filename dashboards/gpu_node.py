"""GPU node overview: the GPUs of the selected nodes, and the workloads running there.

Utilisation, power, temperatures, clocks against their maximum, memory, throttle episodes, errors
and GPU up/down, per node and GPU.
"""

from __future__ import annotations

from .lib import DEVICE, GPU, RATE, WORKLOAD, Q, Spec, heat, single_stat, timeline, trace_links, ts

UID = "aaco-gpu-node"
LEGEND = "{{node}} gpu{{gpu}} {{model}}"


def spec(traces_plugin: str) -> Spec:
    """The dashboard's panels."""
    glance = [
        single_stat(
            "GPUs up",
            "GPUs answering their telemetry backend (aaco_gpu_up = 1) out of the GPUs the agents know. "
            "Fewer up than known: see 'GPU up' below and the AacoGpuDown runbook.",
            "short",
            [
                Q(f"sum(aaco_gpu_up{{{GPU}}})", "up", instant=True),
                Q(f"count(aaco_gpu_up{{{GPU}}})", "known", instant=True),
            ],
        ),
        single_stat(
            "GPUs throttled now",
            "GPUs throttled for any reason (power, thermal, current, other) at the latest reading; a GPU "
            "throttled for several reasons counts once.",
            "short",
            [Q(f"sum(max by (node, gpu, gpu_uuid) (aaco_gpu_throttle_active{{{GPU}}}))", instant=True)],
            steps=(("green", None), ("orange", 1)),
        ),
        single_stat(
            "Uncorrectable errors (24 h)",
            "Uncorrectable (ECC) memory errors counted by the selected GPUs over the last 24 hours. Any is a "
            "page: see the AacoGpuUncorrectableErrors runbook.",
            "short",
            [Q(f'sum(increase(aaco_gpu_errors_total{{{GPU}, error_type="uncorrected"}}[24h]))', instant=True)],
            steps=(("green", None), ("red", 1)),
            decimals=0,
        ),
        single_stat(
            "Power draw",
            "Power drawn by the selected GPUs together, at the latest reading.",
            "watt",
            [Q(f"sum(aaco_gpu_power_watts{{{GPU}}})", instant=True)],
        ),
        single_stat(
            "VRAM in use",
            "GPU memory in use over GPU memory size, over the selected GPUs.",
            "percentunit",
            [Q(f"sum(aaco_gpu_memory_usage_bytes{{{GPU}}}) / sum(aaco_gpu_memory_limit_bytes{{{GPU}}})", instant=True)],
            steps=(("green", None), ("orange", 0.85), ("red", 0.95)),
        ),
        single_stat(
            "Hottest sensor",
            "The highest temperature of any sensor (edge, junction, memory) of the selected GPUs.",
            "celsius",
            [Q(f"max(aaco_gpu_temperature_celsius{{{GPU}}})", instant=True)],
            steps=(("green", None), ("orange", 85), ("red", 95)),
        ),
    ]
    utilisation = [
        ts(
            "GPU utilisation",
            "Share of time each GPU's graphics/compute engine was busy, as its telemetry backend reports it "
            "(hw.gpu.utilization). Busy is not efficient: compare with the device active ratio from kernel "
            "traces, and with clocks and throttling below.",
            "percentunit",
            [Q(f"aaco_gpu_utilization_ratio{{{GPU}}}", LEGEND)],
            min_val=0,
            max_val=1,
        ),
        ts(
            "Memory controller busy",
            "Share of time each GPU's memory controller was busy: high with low compute utilisation hints "
            "at a memory-bound workload.",
            "percentunit",
            [Q(f"aaco_gpu_memory_utilization_ratio{{{GPU}}}", LEGEND)],
            min_val=0,
            max_val=1,
        ),
        ts(
            "Device active ratio (kernel traces)",
            "Share of the latest capture window in which the device ran any kernel, copy or memset, from "
            "the kernel traces themselves (the union of busy intervals over the window), per node and device.",
            "percentunit",
            [Q(f"aaco_device_active_ratio{{{DEVICE}}}", "{{node}} device {{gpu}}")],
            min_val=0,
            max_val=1,
        ),
    ]
    power = [
        ts(
            "Power draw against its cap",
            "Power each GPU draws (socket or board power, hw.power) beside the power cap it is held to "
            "(its enforced power limit). A draw pinned at the cap while clocks sit below their maximum is "
            "power throttling: see 'Throttle episodes'.",
            "watt",
            [
                Q(f"aaco_gpu_power_watts{{{GPU}}}", "draw " + LEGEND),
                Q(f"aaco_gpu_power_limit_watts{{{GPU}}}", "cap " + LEGEND),
            ],
            min_val=0,
        ),
        ts(
            "Power draw over cap",
            "Each GPU's power draw over its power cap: near 100 % the GPU is power-limited and its clocks drop first.",
            "percentunit",
            [Q(f"aaco_gpu_power_watts{{{GPU}}} / aaco_gpu_power_limit_watts{{{GPU}}}", LEGEND)],
            min_val=0,
            max_val=1.05,
            steps=(("green", None), ("orange", 0.9), ("red", 0.98)),
        ),
        ts(
            "Average power from the energy counter",
            "Mean power over each interval from the GPU's own energy counter (rate of hw.energy), where the "
            "backend reports one: smooths out the spikes a power sample can miss.",
            "watt",
            [Q(f"rate(aaco_gpu_energy_joules_total{{{GPU}}}[{RATE}])", LEGEND)],
            min_val=0,
        ),
        ts(
            "Temperatures",
            "Temperature of each GPU sensor: edge (NVIDIA: the core sensor), junction (hotspot) and memory. "
            "Thermal throttling starts near the vendor's slowdown threshold (about 90 C edge on NVIDIA, "
            "100-110 C junction on AMD Instinct).",
            "celsius",
            [Q(f"aaco_gpu_temperature_celsius{{{GPU}}}", "{{node}} gpu{{gpu}} {{sensor}}")],
            steps=(("green", None), ("orange", 85), ("red", 95)),
        ),
    ]
    clocks = [
        ts(
            "Clocks against their maximum",
            "Each clock domain's current frequency over its highest frequency (aaco_gpu_clock_hertz / "
            "aaco_gpu_clock_max_hertz). A busy GPU well below 100 % on its graphics/SM clock is being held "
            "back: power or thermal limits, or an application clock setting.",
            "percentunit",
            [
                Q(
                    f"aaco_gpu_clock_hertz{{{GPU}}} / aaco_gpu_clock_max_hertz{{{GPU}}}",
                    "{{node}} gpu{{gpu}} {{clock}}",
                )
            ],
            min_val=0,
            max_val=1.05,
        ),
        ts(
            "Clocks",
            "Current clock of each domain: graphics/SM (compute), memory, SoC, fabric, video.",
            "hertz",
            [Q(f"aaco_gpu_clock_hertz{{{GPU}}}", "{{node}} gpu{{gpu}} {{clock}}")],
            min_val=0,
        ),
    ]
    memory = [
        ts(
            "VRAM in use",
            "GPU memory (VRAM) in use, per GPU, beside its size.",
            "bytes",
            [
                Q(f"aaco_gpu_memory_usage_bytes{{{GPU}}}", "used " + LEGEND),
                Q(f"aaco_gpu_memory_limit_bytes{{{GPU}}}", "size " + LEGEND),
            ],
            min_val=0,
        ),
        ts(
            "VRAM in use (share)",
            "GPU memory in use over its size: close to 100 % risks out-of-memory failures and allocator churn.",
            "percentunit",
            [Q(f"aaco_gpu_memory_usage_bytes{{{GPU}}} / aaco_gpu_memory_limit_bytes{{{GPU}}}", LEGEND)],
            min_val=0,
            max_val=1,
            steps=(("green", None), ("orange", 0.85), ("red", 0.95)),
        ),
    ]
    health = [
        timeline(
            "Throttle episodes",
            "Throttling episodes of each GPU by reason, as the throttle analyzer finds them: the vendor's "
            "throttle status, or the clock below 90 % of its maximum under load with power at its cap "
            "(power), or a sensor within 5 C of its limit (thermal). Sustained throttling that costs "
            "latency raises AacoThrottlingWithLatencyImpact.",
            [Q(f"max by (node, gpu, reason) (aaco_throttle_active{{{DEVICE}}})", "{{node}} gpu{{gpu}} {{reason}}")],
            {"0": ("not throttled", "green"), "1": ("throttled", "orange")},
        ),
        timeline(
            "Vendor throttle status",
            "The throttle reasons the GPU's own telemetry reports (NVML clock event reasons, amd-smi "
            "throttle status, gpu_metrics throttler bits), at each reading.",
            [Q(f"max by (node, gpu, reason) (aaco_gpu_throttle_active{{{GPU}}})", "{{node}} gpu{{gpu}} {{reason}}")],
            {"0": ("not throttled", "green"), "1": ("throttled", "orange")},
        ),
        ts(
            "Time throttled",
            "Share of time each GPU spent in a throttling episode, by reason (throttle analyzer).",
            "percentunit",
            [
                Q(
                    f"sum by (node, gpu, reason) (rate(aaco_throttle_seconds_total{{{DEVICE}}}[{RATE}]))",
                    "{{node}} gpu{{gpu}} {{reason}}",
                ),
            ],
            min_val=0,
            max_val=1,
        ),
        ts(
            "Throttle episodes started",
            "Throttling episodes started per interval, by GPU and reason: many short episodes mean a GPU "
            "oscillating around its power cap or thermal limit.",
            "short",
            [
                Q(
                    f"sum by (node, gpu, reason) (increase(aaco_throttle_episodes_total{{{DEVICE}}}[{RATE}]))",
                    "{{node}} gpu{{gpu}} {{reason}}",
                )
            ],
            bars=True,
            min_val=0,
        ),
        timeline(
            "GPU up",
            "Whether each GPU answers its telemetry backend (1) or vanished (0): fell off the bus, driver "
            "wedged, or the backend cannot see it. See the AacoGpuDown runbook.",
            [Q(f"aaco_gpu_up{{{GPU}}}", LEGEND)],
            {"0": ("down", "red"), "1": ("up", "green")},
        ),
        ts(
            "GPU errors",
            "GPU errors per interval by type: ECC corrected (harmless in small numbers, a trend predicts "
            "failures), uncorrected (data corruption: page), lost (times the GPU went missing).",
            "short",
            [
                Q(
                    f"sum by (node, gpu, error_type) (increase(aaco_gpu_errors_total{{{GPU}}}[{RATE}]))",
                    "{{node}} gpu{{gpu}} {{error_type}}",
                )
            ],
            bars=True,
            min_val=0,
        ),
    ]
    workloads = [
        ts(
            "Iteration latency p99 of the workloads here",
            "p99 iteration latency of each model on the selected nodes (from the latency histogram); the "
            "dots are exemplars: one iteration's trace each. The link opens the model's traces.",
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
        heat(
            "Iteration latency distribution",
            "How the latency of every iteration of the selected models is distributed over time (histogram "
            "buckets per interval); exemplars mark single iterations with their trace.",
            "s",
            Q(
                f"sum by (le) (rate(aaco_iteration_latency_seconds_bucket{{{WORKLOAD}}}[{RATE}]))",
                "{{le}}",
                heatmap=True,
                exemplar=True,
            ),
            exemplars=True,
        ),
    ]
    return Spec(
        uid=UID,
        title="AACO / GPU node overview",
        description="The GPUs of the selected nodes: utilisation, power, temperatures, clocks against their "
        "maximum, memory, throttle episodes, errors, up/down; and the latency of the workloads running there.",
        tags=("gpu",),
        rows=[
            ("At a glance", glance),
            ("Utilisation", utilisation),
            ("Power and temperature", power),
            ("Clocks", clocks),
            ("Memory", memory),
            ("Throttling, errors and availability", health),
            ("Workloads on these nodes", workloads),
        ],
    )
