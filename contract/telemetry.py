"""What every GPU telemetry backend produces: GPUs, their readings, and the problems met on the way.

A backend returns a ``Snapshot``: one ``GpuSample`` per GPU it could read (its identity and its
readings, already in base units with their OpenTelemetry names) and the ``FieldProblem``s it met
(a value that is not a number, a section of the wrong shape), each naming the file or backend and
the field, so that bad input is reported precisely while the good readings around it are kept.
``to_table`` turns readings into the long-form ``telemetry`` Arrow schema (one row per reading).

Names and units (docs/metrics.md): OpenTelemetry hardware semantic conventions where
they exist, ``aaco.gpu.*`` where they do not; UCUM units; ratios 0..1, bytes, watts, joules, hertz.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa

from aaco.contract.schemas import ATTRS, TELEMETRY

# metric name -> unit. The telemetry analyzer maps each to its Prometheus definition.
UTILIZATION: Final = "hw.gpu.utilization"  # ratio of time the graphics/compute engine was busy
MEMORY_UTILIZATION: Final = "aaco.gpu.memory.utilization"  # ratio of time the memory controller was busy
MEMORY_USAGE: Final = "hw.gpu.memory.usage"
MEMORY_LIMIT: Final = "hw.gpu.memory.limit"
POWER: Final = "hw.power"
POWER_LIMIT: Final = "aaco.gpu.power.limit"  # the power cap the GPU is held to (enforced limit)
ENERGY: Final = "hw.energy"
TEMPERATURE: Final = "hw.temperature"  # attribute sensor: edge | junction | memory
CLOCK: Final = "aaco.gpu.clock.frequency"  # attribute clock: graphics | sm | memory | soc | video | ...
CLOCK_MAX: Final = "aaco.gpu.clock.max"
THROTTLE: Final = "aaco.gpu.throttle.active"  # attribute reason: power | thermal | current | other
ERRORS: Final = "hw.errors"  # attribute error.type: corrected | uncorrected | lost
UP: Final = "aaco.gpu.up"
FAN_SPEED: Final = "hw.fan.speed"  # revolutions per minute; attribute fan: 0, 1, ...
FAN_SPEED_RATIO: Final = "hw.fan.speed_ratio"  # share of the fan's full speed; attribute fan
VOLTAGE: Final = "hw.voltage"  # volts; attribute sensor: graphics | soc | memory
PSTATE: Final = "aaco.gpu.pstate"  # NVIDIA performance state: 0 for P0 (the fastest) .. 15
DPM_LEVEL: Final = "aaco.gpu.dpm.level"  # AMD current DPM level of a clock domain (0: the slowest); attribute clock
PCIE_LINK_GENERATION: Final = "aaco.gpu.pcie.link.generation"  # the PCIe link's current generation (1..6)
PCIE_LINK_WIDTH: Final = "aaco.gpu.pcie.link.width"  # the PCIe link's current width in lanes
# Health (docs/health.md). ECC counts since the driver loaded (NVIDIA's volatile counters, amdgpu's
# ras/*_err_count) by memory location or RAS block: dram, sram (NVIDIA); umc, gfx, sdma, mmhub, xgmi_wafl ... (AMD)
ECC_CORRECTED: Final = "aaco.gpu.ecc.corrected"  # attribute block
ECC_UNCORRECTED: Final = "aaco.gpu.ecc.uncorrected"  # attribute block
RETIRED_PAGES: Final = "aaco.gpu.memory.retired_pages"  # attribute cause: single_bit | double_bit (NVIDIA), ecc (AMD)
RETIRED_PAGES_PENDING: Final = "aaco.gpu.memory.retired_pages.pending"  # pages waiting for a reset to retire
REMAPPED_ROWS: Final = "aaco.gpu.memory.remapped_rows"  # attribute cause: correctable | uncorrectable
ROW_REMAP_PENDING: Final = "aaco.gpu.memory.row_remap.pending"  # 1 while a remap waits for a GPU reset
ROW_REMAP_FAILURE: Final = "aaco.gpu.memory.row_remap.failure"  # 1 once a row could not be remapped
PCIE_REPLAYS: Final = "aaco.gpu.pcie.replays"  # PCIe link replays (retransmissions) since the driver loaded
NVLINK_ERRORS: Final = "aaco.gpu.nvlink.errors"  # attribute error.type: crc_flit | crc_data | replay | recovery
XID_ERRORS: Final = "aaco.gpu.xid.errors"  # attribute xid: NVIDIA XID errors the kernel logged (docs/health.md)
# Activity counters (docs/health.md, "Activity"): shares of the sample's interval, 0..1, from profiling
# counters (NVML GPM on Hopper and later, amdsmi's activity) rather than "a kernel ran" utilisation
SM_ACTIVE: Final = "aaco.gpu.sm.active"  # share of SM cycles with at least one warp resident (DCGM SM_ACTIVE)
SM_OCCUPANCY: Final = "aaco.gpu.sm.occupancy"  # resident warps over the SMs' maximum (DCGM SM_OCCUPANCY)
GRAPHICS_ACTIVE: Final = "aaco.gpu.graphics.active"  # the graphics/compute engine busy (GR_ENGINE_ACTIVE, AMD GFX)
TENSOR_ACTIVE: Final = "aaco.gpu.tensor.active"  # tensor cores (NVIDIA) or matrix cores (AMD MFMA) busy
DRAM_ACTIVE: Final = "aaco.gpu.dram.active"  # device memory interface busy (DCGM DRAM_ACTIVE, AMD UMC)
MEDIA_ACTIVE: Final = "aaco.gpu.media.active"  # video encode/decode engines busy (AMD MM, NVIDIA NVDEC/NVENC)
PCIE_THROUGHPUT: Final = "aaco.gpu.pcie.throughput"  # bytes per second; attribute direction: transmit | receive
NVLINK_THROUGHPUT: Final = "aaco.gpu.nvlink.throughput"  # bytes per second over all links; attribute direction
COUNTERS_PAUSED: Final = "aaco.gpu.counters.paused"  # 1 while activity sampling is paused; attribute reason
# Per process on a GPU (contract/gpu_processes.py, docs/shared-gpus.md): measured per process, never the device's
PROCESS_UTILIZATION: Final = "aaco.gpu.process.utilization"  # its share of the SMs' (NVIDIA) or GFX engine's (AMD) time
PROCESS_MEMORY_UTILIZATION: Final = "aaco.gpu.process.memory.utilization"  # its share of the memory controller's time
PROCESS_MEMORY_USAGE: Final = "aaco.gpu.process.memory.usage"  # device memory it holds
ATTR_XID_LAST: Final = "aaco.xid.last_ns"  # on XID rows: the last one's time (epoch ns), "" when the log had none

UNITS: Final[dict[str, str]] = {
    UTILIZATION: "1",
    MEMORY_UTILIZATION: "1",
    MEMORY_USAGE: "By",
    MEMORY_LIMIT: "By",
    POWER: "W",
    POWER_LIMIT: "W",
    ENERGY: "J",
    TEMPERATURE: "Cel",
    CLOCK: "Hz",
    CLOCK_MAX: "Hz",
    THROTTLE: "1",
    ERRORS: "{error}",
    UP: "1",
    FAN_SPEED: "rpm",
    FAN_SPEED_RATIO: "1",
    VOLTAGE: "V",
    PSTATE: "1",
    DPM_LEVEL: "1",
    PCIE_LINK_GENERATION: "1",
    PCIE_LINK_WIDTH: "{lane}",
    ECC_CORRECTED: "{error}",
    ECC_UNCORRECTED: "{error}",
    RETIRED_PAGES: "{page}",
    RETIRED_PAGES_PENDING: "{page}",
    REMAPPED_ROWS: "{row}",
    ROW_REMAP_PENDING: "1",
    ROW_REMAP_FAILURE: "1",
    PCIE_REPLAYS: "{replay}",
    NVLINK_ERRORS: "{error}",
    XID_ERRORS: "{error}",
    SM_ACTIVE: "1",
    SM_OCCUPANCY: "1",
    GRAPHICS_ACTIVE: "1",
    TENSOR_ACTIVE: "1",
    DRAM_ACTIVE: "1",
    MEDIA_ACTIVE: "1",
    PCIE_THROUGHPUT: "By/s",
    NVLINK_THROUGHPUT: "By/s",
    COUNTERS_PAUSED: "1",
    PROCESS_UTILIZATION: "1",
    PROCESS_MEMORY_UTILIZATION: "1",
    PROCESS_MEMORY_USAGE: "By",
}

# The attribute that distinguishes series of one metric on one GPU.
SERIES_ATTRIBUTE: Final[dict[str, str]] = {
    TEMPERATURE: "sensor",
    CLOCK: "clock",
    CLOCK_MAX: "clock",
    THROTTLE: "reason",
    ERRORS: "error.type",
    FAN_SPEED: "fan",
    FAN_SPEED_RATIO: "fan",
    VOLTAGE: "sensor",
    DPM_LEVEL: "clock",
    ECC_CORRECTED: "block",
    ECC_UNCORRECTED: "block",
    RETIRED_PAGES: "cause",
    REMAPPED_ROWS: "cause",
    NVLINK_ERRORS: "error.type",
    XID_ERRORS: "xid",
    PCIE_THROUGHPUT: "direction",
    NVLINK_THROUGHPUT: "direction",
    COUNTERS_PAUSED: "reason",
}

THROTTLE_REASONS: Final = ("power", "thermal", "current", "other")

# Identity and placement attributes carried in every row's attribute map (OpenTelemetry names).
ATTR_MODEL: Final = "hw.model"
ATTR_VENDOR: Final = "hw.vendor"
ATTR_PCI: Final = "pci.bus_id"
ATTR_POD: Final = "k8s.pod.name"
ATTR_NAMESPACE: Final = "k8s.namespace.name"
ATTR_CONTAINER: Final = "k8s.container.name"
# A logical device (a MIG instance, an AMD partition; docs/shared-gpus.md): its parent GPU and its instance ids
ATTR_PARENT_UUID: Final = "aaco.gpu.parent_uuid"
ATTR_GPU_INSTANCE: Final = "aaco.gpu.gpu_instance"
ATTR_COMPUTE_INSTANCE: Final = "aaco.gpu.compute_instance"

MIB: Final = 1024 * 1024


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """Who a GPU is: its index on the node (the ``device`` column and ``gpu`` label) and what else is known.

    A logical device carved out of a GPU (docs/shared-gpus.md) is a GPU of its own whose ``parent``
    names the physical GPU's index (and ``parent_uuid`` its UUID): an NVIDIA MIG device, index
    ``<parent>/<gpu_instance>/<compute_instance>`` (``0/3/0``: the GPU instance and compute instance
    ids, NVIDIA's own address of a MIG device, ``MIG-GPU-<uuid>/3/0``, the same from nvidia-smi and
    NVML, where the MIG device *index* is an enumeration order), its ``uuid`` the ``MIG-...`` UUID
    where the backend gives one; an AMD partition (XCP), index ``<parent>/<partition>`` with
    ``gpu_instance`` the partition's number. Device-wide readings (power, temperature, clocks, the
    GPU's utilisation, PCIe, ECC totals) stay on the parent; a logical device has its own.
    """

    index: str
    uuid: str = ""
    pci_bus: str = ""  # normalised: dddd:bb:dd.f, lower case
    model: str = ""
    vendor: str = ""  # amd | nvidia
    parent: str = ""  # a logical device's physical GPU (its index); "" for a physical GPU
    parent_uuid: str = ""
    gpu_instance: str = ""  # NVIDIA MIG GPU instance id; AMD partition number
    compute_instance: str = ""  # NVIDIA MIG compute instance id


@dataclass(frozen=True, slots=True)
class Reading:
    """One value of one metric, in base units, with its series attribute (sensor, clock, reason, ...)."""

    metric: str
    value: float
    attrs: tuple[tuple[str, str], ...] = ()

    @property
    def unit(self) -> str:
        """The metric's UCUM unit."""
        return UNITS[self.metric]


@dataclass
class GpuSample:
    """Everything read from one GPU in one sample."""

    gpu: GpuIdentity
    readings: list[Reading] = field(default_factory=list)

    def add(self, metric: str, value: float | None, **attrs: str) -> None:
        """Add a reading; ``None`` and NaN (a value the tool did not have) are skipped."""
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        self.readings.append(Reading(metric, float(value), _attributes(tuple(attrs.items())) if attrs else ()))

    def has(self, metric: str, **attrs: str) -> bool:
        """True when a reading of ``metric`` with exactly these attributes is already present."""
        want = _attributes(tuple(attrs.items())) if attrs else ()
        return any(r.metric == metric and r.attrs == want for r in self.readings)


@functools.lru_cache(maxsize=1024)
def _attributes(items: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Keyword attributes as a reading holds them: sorted, ``error_type`` spelled ``error.type``.

    Keyword arguments cannot hold a dot, hence the spelling. Cached: every sample repeats the
    same few attribute sets (a sensor, a clock, a throttle reason) for every GPU.
    """
    return tuple(sorted((("error.type" if k == "error_type" else k), v) for k, v in items))


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """A value or section a backend could not use: where (file or backend), which field, why."""

    subject: str
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.subject}: field {self.field}: {self.message}"


@dataclass
class Snapshot:
    """One sample of every GPU a backend could read."""

    format: str
    gpus: list[GpuSample] = field(default_factory=list)
    problems: list[FieldProblem] = field(default_factory=list)


def normalize_pci(bus: str) -> str:
    """``00000000:01:00.0`` (nvidia-smi), ``0000:83:00.0`` (amdgpu) -> ``0000:83:00.0`` (lower case)."""
    bus = bus.strip().lower()
    if not bus:
        return ""
    domain, sep, rest = bus.partition(":")
    if not sep:
        return bus
    if rest.count(":") == 0:  # bb:dd.f without a domain
        return f"0000:{bus}"
    return f"{domain[-4:].rjust(4, '0')}:{rest}"


def to_table(
    samples: Iterable[GpuSample],
    *,
    ts_ns: int,
    node: str,
    source: str,
    extra: Mapping[str, Mapping[str, str]] | None = None,
) -> pa.RecordBatch:
    """Long-form ``telemetry`` rows: one per reading, the GPU's identity (and ``extra[index]``) in attributes.

    A record batch of exactly the ``telemetry`` schema. The attribute maps are built as flat key and
    value columns with their offsets (not a list of pairs per row, which costs a Python object per
    entry twice over): a GPU's identity is the same for all its readings, only a reading's own
    attribute (sensor, clock, ...) is added to it.
    """
    devices: list[str] = []
    metrics: list[str] = []
    values: list[float] = []
    units: list[str] = []
    uuids: list[str | None] = []
    offsets = [0]
    keys: list[str] = []
    items: list[str] = []
    for s in samples:
        g = s.gpu
        ident = {ATTR_MODEL: g.model, ATTR_VENDOR: g.vendor, ATTR_PCI: g.pci_bus}
        if g.parent:
            ident[ATTR_PARENT_UUID] = g.parent_uuid
            ident[ATTR_GPU_INSTANCE] = g.gpu_instance
            ident[ATTR_COMPUTE_INSTANCE] = g.compute_instance
        ident = {k: v for k, v in ident.items() if v}
        if extra and s.gpu.index in extra:
            ident.update(extra[s.gpu.index])
        ident_keys, ident_items = list(ident), list(ident.values())
        uuid = s.gpu.uuid or None
        for r in s.readings:
            devices.append(s.gpu.index)
            metrics.append(r.metric)
            values.append(r.value)
            units.append(UNITS[r.metric])
            uuids.append(uuid)
            if r.attrs:
                merged = {**ident, **dict(r.attrs)}
                keys += merged
                items += merged.values()
            else:
                keys += ident_keys
                items += ident_items
            offsets.append(len(keys))
    n = len(metrics)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([ts_ns] * n, pa.int64()),
            pa.array([node] * n, pa.string()),
            pa.array(devices, pa.string()),
            pa.array(metrics, pa.string()),
            pa.array(values, pa.float64()),
            pa.array(units, pa.string()),
            pa.array(uuids, pa.string()),
            pa.MapArray.from_arrays(
                pa.array(offsets, pa.int32()), pa.array(keys, pa.string()), pa.array(items, pa.string()), type=ATTRS
            ),
            pa.array([source] * n, pa.string()),
        ],
        schema=TELEMETRY,
    )
