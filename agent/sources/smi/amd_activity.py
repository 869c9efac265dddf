"""AMD's activity readings (docs/health.md, "Activity"), from the AMD SMI library or ``amd-smi metric``.

AMD's SMU firmware averages the engines' activity into the GPU metrics table; the library
(``amdsmi_get_gpu_activity``, ``amdsmi_get_gpu_metrics_info``) and the tool (``usage``) read it:

- ``gfx_activity`` (%): ``aaco.gpu.graphics.active``, the value ``hw.gpu.utilization`` also has;
- ``umc_activity`` (%): ``aaco.gpu.dram.active``, as ``aaco.gpu.memory.utilization``;
- ``mm_activity`` and the VCN (video encode/decode) engines, per engine (``vcn_activity``) or per
  partition and engine (the library's ``xcp_stats.vcn_busy``, the tool's ``vcn_busy``, a map of
  ``xcp_N`` to lists): the busiest
  as ``aaco.gpu.media.active`` (an MI300X can read ``mm_activity`` 0 while VCN 0 is 19 % busy).

Left out: the per-XCC graphics activity (``gfx_busy_inst``, ``gfx_busy_acc``: the contract has no
XCC attribute, and ``gfx_activity`` covers the whole GPU), the JPEG engines (``jpeg_activity``,
``jpeg_busy``; NVIDIA's NVJPG is left out as well), PCIe bandwidth (one figure for both directions,
where the reading has a direction) and XGMI traffic (accumulated kilobytes per link, not NVLink).
Matrix-core (MFMA), SM-like occupancy and wave counters are rocprofiler's, not the SMI's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from aaco.agent.sources.smi.values import Fields
from aaco.contract.telemetry import (
    DRAM_ACTIVE,
    GRAPHICS_ACTIVE,
    MEDIA_ACTIVE,
    MEMORY_UTILIZATION,
    UTILIZATION,
    GpuSample,
)

# the library's keys (amdsmi_get_gpu_metrics_info) and the tool's (amd-smi metric's usage) of the VCN engines
LIBRARY_VCN: Final = ("vcn_activity", "xcp_stats.vcn_busy")
TOOL_VCN: Final = ("vcn_activity", "vcn_busy")
MAX_DEPTH: Final = 2  # per partition, per engine


def library_activity(
    f: Fields, where: str, activity: Mapping[str, Any], metrics: Mapping[str, Any], s: GpuSample
) -> None:
    """The activity readings of the library's ``amdsmi_get_gpu_activity`` and GPU metrics (after utilisation)."""
    media = [(activity.get("mm_activity"), f"{where}.mm_activity")]
    media += [(metrics.get(key), f"{where}.gpu_metrics.{key}") for key in LIBRARY_VCN]
    _add(s, _busiest(f, media))


def tool_activity(f: Fields, usage: Mapping[str, Any], where: str, s: GpuSample) -> None:
    """The activity readings of ``amd-smi metric``'s ``usage`` section (after utilisation)."""
    media = [(usage.get(key), f"{where}.usage.{key}") for key in ("mm_activity", *TOOL_VCN)]
    _add(s, _busiest(f, media))


def _add(s: GpuSample, media: float | None) -> None:
    """Graphics and DRAM activity as the utilisation readings already in ``s`` have them; the media engines."""
    for source, metric in ((UTILIZATION, GRAPHICS_ACTIVE), (MEMORY_UTILIZATION, DRAM_ACTIVE)):
        s.add(metric, next((r.value for r in s.readings if r.metric == source and not r.attrs), None))
    s.add(MEDIA_ACTIVE, media)


def _busiest(f: Fields, items: Iterable[tuple[Any, str]]) -> float | None:
    """The largest of the percentages (numbers, ``{value, unit}``, lists of them, "N/A"), as a ratio."""
    found: list[float] = []
    for value, path in items:
        _collect(f, value, path, found, 0)
    return max(found) if found else None


def _collect(f: Fields, value: Any, path: str, found: list[float], depth: int) -> None:
    """Append the ratios in ``value``: a percentage, or a list (per engine) or map (per partition) of them."""
    nested: Iterable[tuple[str, Any]] = ()
    if isinstance(value, list):
        nested = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, Mapping) and "value" not in value:
        nested = ((f"{path}.{k}", v) for k, v in value.items())  # amd-smi: {"xcp_0": [...], ...}
    else:
        if value is not None:
            ratio = f.with_unit(value, path, "ratio", "%")
            if ratio is not None:
                found.append(ratio)
        return
    if depth >= MAX_DEPTH:
        f.problem(path, "expected percentages per partition and engine, got deeper nesting")
        return
    for where, v in nested:
        _collect(f, v, where, found, depth + 1)
