"""GPU health: each GPU's verdict and why, its memory errors, link errors and XIDs, and how busy it really is.

The verdict is the health analyzer's (``aaco_gpu_health``, ``aaco_gpu_health_reason``; docs/health.md:
its rules and thresholds, the runbooks per reason); the counters are the GPUs' own (ECC by block,
retired pages, remapped rows, PCIe replays, NVLink errors) and the kernel's XIDs (the ``xid``
source). The activity row sets the profiling counters (SM active, tensor, DRAM) beside the
utilisation that only says a kernel ran: a GPU "100 % utilised" by one small kernel shows there.
"""

from __future__ import annotations

from typing import Final

from .lib import DEVICE, GPU, RATE, Q, Spec, single_stat, tbl, timeline, ts

UID: Final = "aaco-gpu-health"
LEGEND: Final = "{{node}} gpu{{gpu}}"


def _status(status: str) -> str:
    return f'aaco_gpu_health{{{DEVICE}, status="{status}"}}'


def _increase(metric: str, by: str) -> str:
    return f"sum by (node, gpu, {by}) (increase({metric}{{{GPU}}}[{RATE}]))"


def spec(traces_plugin: str) -> Spec:
    """The dashboard's panels."""
    glance = [
        single_stat(
            "GPUs unhealthy",
            'GPUs whose verdict is unhealthy now (aaco_gpu_health{status="unhealthy"}): an uncorrected ECC '
            "error, a failed row remap, too many retired pages, a critical XID, a lost GPU. AacoGpuUnhealthy fires "
            "after a minute.",
            "short",
            [Q(f"sum({_status('unhealthy')}) or vector(0)", "unhealthy", instant=True)],
            steps=(("green", None), ("red", 1)),
            width=8,
        ),
        single_stat(
            "GPUs in warning",
            "GPUs whose verdict is warning: a remap or retirement waiting for a reset, replays or corrected errors "
            "rising, thermal slowdown, an application XID.",
            "short",
            [Q(f"sum({_status('warning')}) or vector(0)", "warning", instant=True)],
            steps=(("green", None), ("orange", 1)),
            width=8,
        ),
        single_stat(
            "GPUs healthy",
            "GPUs judged healthy out of all the health analyzer judges.",
            "short",
            [Q(f"sum({_status('healthy')})", "healthy", instant=True)],
            width=8,
        ),
    ]
    verdict = [
        timeline(
            "Verdict by GPU",
            "Each GPU's verdict over time: healthy, warning, unhealthy (the health analyzer, docs/health.md).",
            [
                Q(
                    f"max by (node, gpu) ({_status('warning')}) + 2 * max by (node, gpu) ({_status('unhealthy')})",
                    LEGEND,
                )
            ],
            {"0": ("healthy", "green"), "1": ("warning", "orange"), "2": ("unhealthy", "red")},
            width=16,
        ),
        tbl(
            "Why: the reasons that hold now",
            "Each reason that holds for a GPU not healthy (aaco_gpu_health_reason); docs/runbooks.md says what to "
            "do for each (AacoGpuUnhealthy).",
            "short",
            [Q(f"aaco_gpu_health_reason{{{DEVICE}}} == 1", "", instant=True, table=True)],
            width=8,
        ),
    ]
    memory = [
        ts(
            "Uncorrected ECC errors",
            "Uncorrected ECC errors per interval, by GPU and memory location or RAS block (dram/sram; umc, gfx, "
            "sdma ...): any one makes the GPU unhealthy.",
            "short",
            [Q(_increase("aaco_gpu_ecc_uncorrected_errors_total", "block"), LEGEND + " {{block}}")],
            bars=True,
            min_val=0,
        ),
        ts(
            "Corrected ECC errors",
            "Corrected ECC errors per interval, by block: harmless one by one, a rising rate precedes failures "
            "(warning beyond analyzers.health.corrected_per_hour).",
            "short",
            [Q(_increase("aaco_gpu_ecc_corrected_errors_total", "block"), LEGEND + " {{block}}")],
            bars=True,
            min_val=0,
        ),
        ts(
            "Retired pages and remapped rows",
            "Pages retired over the GPU's life by cause (63 make it unhealthy, DCGM's limit) and rows remapped by "
            "the error that caused them.",
            "short",
            [
                Q(f"aaco_gpu_memory_retired_pages_total{{{GPU}}}", LEGEND + " retired {{cause}}"),
                Q(f"aaco_gpu_memory_remapped_rows_total{{{GPU}}}", LEGEND + " remapped {{cause}}"),
            ],
            min_val=0,
        ),
        timeline(
            "Waiting for a reset, or failed",
            "A page retirement or row remap pending (the GPU needs a reset to apply it: warning), or a row that "
            "could not be remapped (unhealthy: no spare rows left).",
            [
                Q(f"aaco_gpu_memory_retired_pages_pending{{{GPU}}} > bool 0", LEGEND + " retirement pending"),
                Q(f"aaco_gpu_memory_row_remap_pending{{{GPU}}}", LEGEND + " remap pending"),
                Q(f"aaco_gpu_memory_row_remap_failure{{{GPU}}}", LEGEND + " remap failed"),
            ],
            {"0": ("no", "green"), "1": ("yes", "red")},
        ),
    ]
    links = [
        ts(
            "PCIe replays per minute",
            "PCIe link replays (retransmissions) per minute: above 8 (DCGM's limit, the dashed line) the link is "
            "failing (AacoGpuPcieReplaysRising).",
            "short",
            [Q(f"sum by (node, gpu) (rate(aaco_gpu_pcie_replays_total{{{GPU}}}[{RATE}])) * 60", LEGEND)],
            min_val=0,
            steps=(("green", None), ("red", 8)),
        ),
        ts(
            "NVLink errors",
            "NVLink errors per interval summed over each GPU's links, by type: CRC errors and replays are retried, "
            "recoveries take the link down for a moment.",
            "short",
            [Q(_increase("aaco_gpu_nvlink_errors_total", "error_type"), LEGEND + " {{error_type}}")],
            bars=True,
            min_val=0,
        ),
        ts(
            "XID errors",
            "XID errors the kernel logged per interval, by GPU and XID (the xid source); the catalogue's meaning "
            "and severity: docs/health.md, `aaco health --kernel-log`.",
            "short",
            [Q(_increase("aaco_gpu_xid_errors_total", "xid"), LEGEND + " XID {{xid}}")],
            bars=True,
            min_val=0,
            width=24,
        ),
    ]
    activity = [
        ts(
            "Utilisation against activity",
            "'Utilisation' (a kernel ran) against the graphics engine's and the SMs' activity (profiling "
            "counters): a GPU 100 % utilised with low SM activity runs small kernels on a few SMs.",
            "percentunit",
            [
                Q(f"aaco_gpu_utilization_ratio{{{GPU}}}", LEGEND + " utilisation"),
                Q(f"aaco_gpu_graphics_active_ratio{{{GPU}}}", LEGEND + " graphics active"),
                Q(f"aaco_gpu_sm_active_ratio{{{GPU}}}", LEGEND + " SM active"),
            ],
            min_val=0,
            max_val=1,
            width=24,
        ),
        ts(
            "Tensor cores, DRAM and occupancy",
            "Share of cycles the tensor (matrix) cores and the DRAM interface were busy, and SM occupancy.",
            "percentunit",
            [
                Q(f"aaco_gpu_tensor_active_ratio{{{GPU}}}", LEGEND + " tensor"),
                Q(f"aaco_gpu_dram_active_ratio{{{GPU}}}", LEGEND + " DRAM"),
                Q(f"aaco_gpu_sm_occupancy_ratio{{{GPU}}}", LEGEND + " occupancy"),
            ],
            min_val=0,
            max_val=1,
        ),
        timeline(
            "Activity sampling paused",
            "Whether the agent paused its counter sampling on a GPU, by reason: another profiler on the node "
            "(ncu, nsys, rocprofv3 ...), counters busy, or off after repeated failures.",
            [Q(f"aaco_gpu_counters_paused{{{GPU}}}", LEGEND + " {{reason}}")],
            {"0": ("sampling", "green"), "1": ("paused", "orange")},
        ),
    ]
    return Spec(
        uid=UID,
        title="AACO / GPU health",
        description="Each GPU's health verdict and its reasons, ECC errors by block, retired pages and remapped "
        "rows, PCIe replays, NVLink errors, XIDs, and activity counters beside utilisation.",
        tags=("gpu", "health"),
        rows=[
            ("At a glance", glance),
            ("Verdict", verdict),
            ("Memory errors", memory),
            ("Links and XIDs", links),
            ("Activity", activity),
        ],
    )
