"""The GPU activity counters' metric definitions (docs/health.md, "Activity"), rendered by the telemetry analyzer.

Where ``aaco_gpu_utilization_ratio`` says whether any kernel ran, these say how much of the GPU it
kept busy: NVML's GPM metrics (Hopper and later; DCGM's profiling fields measure the same) and
amdsmi's activity counters.
"""

from __future__ import annotations

from typing import Final

from aaco.analyzers.telemetry_series import BASE_LABELS
from aaco.contract import telemetry as m
from aaco.contract.signals import MetricDef, define


def _gauge(otel: str, prom: str, description: str, extra: str = "") -> MetricDef:
    return define(otel, prom, "gauge", m.UNITS[otel], description, BASE_LABELS + ((extra,) if extra else ()))  # type: ignore[arg-type]


SM_ACTIVE = _gauge(
    m.SM_ACTIVE,
    "aaco_gpu_sm_active_ratio",
    "Share of SM cycles with at least one warp resident, over the sample's interval (NVML GPM SM_UTIL; "
    "DCGM_FI_PROF_SM_ACTIVE).",
)
SM_OCCUPANCY = _gauge(
    m.SM_OCCUPANCY,
    "aaco_gpu_sm_occupancy_ratio",
    "Resident warps over the SMs' maximum, over the sample's interval (NVML GPM SM_OCCUPANCY; "
    "DCGM_FI_PROF_SM_OCCUPANCY).",
)
GRAPHICS_ACTIVE = _gauge(
    m.GRAPHICS_ACTIVE,
    "aaco_gpu_graphics_active_ratio",
    "Share of time the graphics/compute engine was busy (NVML GPM GRAPHICS_UTIL, DCGM_FI_PROF_GR_ENGINE_ACTIVE; "
    "AMD gfx_activity, GRBM_GUI_ACTIVE).",
)
TENSOR_ACTIVE = _gauge(
    m.TENSOR_ACTIVE,
    "aaco_gpu_tensor_active_ratio",
    "Share of cycles the tensor (NVIDIA) or matrix (AMD MFMA) cores were busy (NVML GPM ANY_TENSOR_UTIL; "
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE).",
)
DRAM_ACTIVE = _gauge(
    m.DRAM_ACTIVE,
    "aaco_gpu_dram_active_ratio",
    "Share of cycles the device memory interface was busy (NVML GPM DRAM_BW_UTIL, DCGM_FI_PROF_DRAM_ACTIVE; AMD "
    "umem_activity).",
)
MEDIA_ACTIVE = _gauge(
    m.MEDIA_ACTIVE,
    "aaco_gpu_media_active_ratio",
    "Share of time the video engines were busy (AMD mm_activity; NVIDIA NVDEC and NVENC, the busier).",
)
PCIE_THROUGHPUT = _gauge(
    m.PCIE_THROUGHPUT,
    "aaco_gpu_pcie_throughput_bytes_per_second",
    "PCIe traffic of the GPU by direction (transmit, receive), over the sample's interval (NVML GPM PCIE_TX/RX).",
    "direction",
)
NVLINK_THROUGHPUT = _gauge(
    m.NVLINK_THROUGHPUT,
    "aaco_gpu_nvlink_throughput_bytes_per_second",
    "NVLink traffic of the GPU over all its links by direction (transmit, receive) (NVML GPM NVLINK_TOTAL_TX/RX).",
    "direction",
)
COUNTERS_PAUSED = _gauge(
    m.COUNTERS_PAUSED,
    "aaco_gpu_counters_paused",
    "1 while the agent's activity sampling of a GPU is paused, by reason: another_profiler (a profiler runs on "
    "the node), busy (the counters are in use), off (turned off after repeated failures until restart).",
    "reason",
)

DEFINITIONS: Final[dict[str, MetricDef]] = {
    m.SM_ACTIVE: SM_ACTIVE,
    m.SM_OCCUPANCY: SM_OCCUPANCY,
    m.GRAPHICS_ACTIVE: GRAPHICS_ACTIVE,
    m.TENSOR_ACTIVE: TENSOR_ACTIVE,
    m.DRAM_ACTIVE: DRAM_ACTIVE,
    m.MEDIA_ACTIVE: MEDIA_ACTIVE,
    m.PCIE_THROUGHPUT: PCIE_THROUGHPUT,
    m.NVLINK_THROUGHPUT: NVLINK_THROUGHPUT,
    m.COUNTERS_PAUSED: COUNTERS_PAUSED,
}
