"""The GPU health readings' metric definitions (docs/health.md), rendered by the telemetry analyzer.

Counts are the GPU's own counters (since the driver loaded, or over its life for retired pages and
remapped rows), so they are Prometheus counters; pending and failure flags are gauges (0 or 1).
"""

from __future__ import annotations

from typing import Final

from aaco.analyzers.telemetry_series import BASE_LABELS
from aaco.contract import telemetry as m
from aaco.contract.signals import MetricDef, define


def _health(otel: str, prom: str, kind: str, description: str, extra: str = "") -> MetricDef:
    return define(otel, prom, kind, m.UNITS[otel], description, BASE_LABELS + ((extra,) if extra else ()))  # type: ignore[arg-type]


ECC_CORRECTED = _health(
    m.ECC_CORRECTED,
    "aaco_gpu_ecc_corrected_errors",
    "counter",
    "Corrected ECC errors since the driver loaded, by memory location or RAS block (NVIDIA: dram, sram; AMD: "
    "umc, gfx, sdma, mmhub, xgmi_wafl, ...).",
    "block",
)
ECC_UNCORRECTED = _health(
    m.ECC_UNCORRECTED,
    "aaco_gpu_ecc_uncorrected_errors",
    "counter",
    "Uncorrected ECC errors since the driver loaded, by memory location or RAS block: any one makes the GPU "
    "unhealthy (docs/health.md).",
    "block",
)
RETIRED_PAGES = _health(
    m.RETIRED_PAGES,
    "aaco_gpu_memory_retired_pages",
    "counter",
    "GPU memory pages retired over the GPU's life, by cause: single_bit, double_bit (NVIDIA), ecc (AMD bad pages).",
    "cause",
)
RETIRED_PAGES_PENDING = _health(
    m.RETIRED_PAGES_PENDING,
    "aaco_gpu_memory_retired_pages_pending",
    "gauge",
    "GPU memory pages waiting for a GPU reset (or reboot) to be retired.",
)
REMAPPED_ROWS = _health(
    m.REMAPPED_ROWS,
    "aaco_gpu_memory_remapped_rows",
    "counter",
    "GPU memory rows remapped over the GPU's life, by the error that caused it: correctable, uncorrectable.",
    "cause",
)
ROW_REMAP_PENDING = _health(
    m.ROW_REMAP_PENDING,
    "aaco_gpu_memory_row_remap_pending",
    "gauge",
    "1 while a row remapping waits for a GPU reset to take effect.",
)
ROW_REMAP_FAILURE = _health(
    m.ROW_REMAP_FAILURE,
    "aaco_gpu_memory_row_remap_failure",
    "gauge",
    "1 once a memory row could not be remapped (no spare rows left): the GPU should be replaced.",
)
PCIE_REPLAYS = _health(
    m.PCIE_REPLAYS,
    "aaco_gpu_pcie_replays",
    "counter",
    "PCIe link replays (retransmitted packets) since the driver loaded: a rising count is a failing link.",
)
NVLINK_ERRORS = _health(
    m.NVLINK_ERRORS,
    "aaco_gpu_nvlink_errors",
    "counter",
    "NVLink errors summed over the GPU's links, by type: crc_flit, crc_data, replay, recovery.",
    "error_type",
)

XID_ERRORS = _health(
    m.XID_ERRORS,
    "aaco_gpu_xid_errors",
    "counter",
    "NVIDIA XID errors the kernel logged for a GPU, by XID, since the agent started reading the kernel log (the "
    "kernel's ring buffer included); the catalogue's meaning and severity are in docs/health.md.",
    "xid",
)

DEFINITIONS: Final[dict[str, MetricDef]] = {
    m.ECC_CORRECTED: ECC_CORRECTED,
    m.ECC_UNCORRECTED: ECC_UNCORRECTED,
    m.RETIRED_PAGES: RETIRED_PAGES,
    m.RETIRED_PAGES_PENDING: RETIRED_PAGES_PENDING,
    m.REMAPPED_ROWS: REMAPPED_ROWS,
    m.ROW_REMAP_PENDING: ROW_REMAP_PENDING,
    m.ROW_REMAP_FAILURE: ROW_REMAP_FAILURE,
    m.PCIE_REPLAYS: PCIE_REPLAYS,
    m.NVLINK_ERRORS: NVLINK_ERRORS,
    m.XID_ERRORS: XID_ERRORS,
}
