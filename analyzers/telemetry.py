"""GPU telemetry as metrics: the latest reading of every series, per GPU and pod.

The ``smi`` source publishes long-form ``telemetry`` rows (one per reading); this analyzer keeps
the latest value of each series and renders it under its registered definition, so the same
readings reach Prometheus (``aaco_gpu_*``, base units) and OTLP (the OpenTelemetry names). A
series is one metric of one GPU (node, index, UUID) from one source, with its distinguishing
attribute (sensor, clock, throttle reason, error type); its labels (model, pod, namespace,
container) are those of its latest reading, so a GPU that moves to another pod changes labels
instead of leaving a frozen series behind. Series not updated for ``stale_after_s`` of data time
are forgotten; at most ``max_series`` are kept (further ones are dropped and counted, as are rows
of metrics this analyzer does not know).

Prometheus label names cannot hold dots, so OpenTelemetry's ``error.type`` is ``error_type``
there; the other labels are ``node, gpu, gpu_uuid, model, pod, namespace, container`` and, on a MIG
device or an AMD partition, ``parent_uuid, gpu_instance, compute_instance`` (docs/shared-gpus.md)
and the Slurm jobs on the GPU, ``job, job_user, job_partition`` (docs/jobs.md, "Slurm"; ``job``
needs ``honor_labels``, as the jobs metrics do) (empty, so absent to Prometheus, when not known).
With ``compat`` set on a source, its readings are also rendered under AMD device-metrics-exporter
or dcgm-exporter names (``telemetry_compat``).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveFloat, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.analyzers.layout import LayoutCache
from aaco.analyzers.telemetry_activity import DEFINITIONS as ACTIVITY_DEFINITIONS
from aaco.analyzers.telemetry_compat import compat_points
from aaco.analyzers.telemetry_health import DEFINITIONS as HEALTH_DEFINITIONS
from aaco.analyzers.telemetry_series import BASE_LABELS, Series
from aaco.contract import telemetry as m
from aaco.contract.config_base import StrictModel
from aaco.contract.gpu_processes import PROCESS_METRICS
from aaco.contract.jobs import ATTR_JOB, ATTR_JOB_PARTITION, ATTR_JOB_USER
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricDef, MetricPoint, define

# The columns that say which series a row is (and its labels); the rest are its value and time.
_LAYOUT_COLUMNS: Final = ("node", "device", "metric", "gpu_uuid", "source", "attributes")


def _gpu_metric(otel: str, prom: str, kind: str, unit: str, description: str, extra: str = "") -> MetricDef:
    return define(otel, prom, kind, unit, description, BASE_LABELS + ((extra,) if extra else ()))  # type: ignore[arg-type]


UTILIZATION = _gpu_metric(
    m.UTILIZATION,
    "aaco_gpu_utilization_ratio",
    "gauge",
    "1",
    "Share of time the GPU's graphics/compute engine was busy.",
)
MEMORY_UTILIZATION = _gpu_metric(
    m.MEMORY_UTILIZATION,
    "aaco_gpu_memory_utilization_ratio",
    "gauge",
    "1",
    "Share of time the GPU's memory controller was busy.",
)
MEMORY_USAGE = _gpu_metric(m.MEMORY_USAGE, "aaco_gpu_memory_usage_bytes", "gauge", "By", "GPU memory (VRAM) in use.")
MEMORY_LIMIT = _gpu_metric(m.MEMORY_LIMIT, "aaco_gpu_memory_limit_bytes", "gauge", "By", "GPU memory (VRAM) size.")
POWER = _gpu_metric(m.POWER, "aaco_gpu_power_watts", "gauge", "W", "GPU (socket / board) power draw.")
POWER_LIMIT = _gpu_metric(
    m.POWER_LIMIT,
    "aaco_gpu_power_limit_watts",
    "gauge",
    "W",
    "Power cap the GPU is held to (its enforced power limit).",
)
ENERGY = _gpu_metric(m.ENERGY, "aaco_gpu_energy_joules", "counter", "J", "Energy the GPU consumed (its own counter).")
TEMPERATURE = _gpu_metric(
    m.TEMPERATURE,
    "aaco_gpu_temperature_celsius",
    "gauge",
    "Cel",
    "GPU temperature by sensor: edge (NVIDIA: the core sensor), junction (hotspot), memory.",
    "sensor",
)
CLOCK = _gpu_metric(
    m.CLOCK,
    "aaco_gpu_clock_hertz",
    "gauge",
    "Hz",
    "Current clock by domain: graphics, sm, memory, soc, fabric, video, decode, dcef.",
    "clock",
)
CLOCK_MAX = _gpu_metric(m.CLOCK_MAX, "aaco_gpu_clock_max_hertz", "gauge", "Hz", "Highest clock of a domain.", "clock")
THROTTLE = _gpu_metric(
    m.THROTTLE,
    "aaco_gpu_throttle_active",
    "gauge",
    "1",
    "1 while the GPU is throttled for a reason: power, thermal, current, other (0 when not).",
    "reason",
)
ERRORS = _gpu_metric(
    m.ERRORS,
    "aaco_gpu_errors",
    "counter",
    "{error}",
    "GPU errors by type (OpenTelemetry error.type): ECC corrected, uncorrected; lost (times the GPU went missing).",
    "error_type",
)
UP = _gpu_metric(
    m.UP, "aaco_gpu_up", "gauge", "1", "1 while the GPU answers its telemetry backend, 0 when it vanished."
)


def _gauge(otel: str, prom: str, description: str, extra: str = "") -> MetricDef:
    """A GPU gauge in its reading's unit (``contract.telemetry.UNITS``)."""
    return _gpu_metric(otel, prom, "gauge", m.UNITS[otel], description, extra)


FAN_SPEED = _gauge(m.FAN_SPEED, "aaco_gpu_fan_speed_rpm", "Fan speed in revolutions per minute, by fan.", "fan")
FAN_SPEED_RATIO = _gauge(
    m.FAN_SPEED_RATIO,
    "aaco_gpu_fan_speed_ratio",
    "Fan speed as a share of its full speed (NVIDIA: of the board's maximum noise-tolerant speed, may pass 1), by fan.",
    "fan",
)
VOLTAGE = _gauge(m.VOLTAGE, "aaco_gpu_voltage_volts", "GPU voltage by rail: graphics (core), soc, memory.", "sensor")
PSTATE = _gauge(m.PSTATE, "aaco_gpu_pstate", "NVIDIA performance state: 0 for P0 (the fastest) up to 15 (P15).")
DPM_LEVEL = _gauge(
    m.DPM_LEVEL,
    "aaco_gpu_dpm_level",
    "AMD current DPM level of a clock domain (0: its slowest level): graphics, memory, soc, fabric, dcef.",
    "clock",
)
PCIE_LINK_GENERATION = _gauge(
    m.PCIE_LINK_GENERATION,
    "aaco_gpu_pcie_link_generation",
    "Current PCIe link generation (1 to 6; many GPUs lower it at idle to save power).",
)
PCIE_LINK_WIDTH = _gauge(m.PCIE_LINK_WIDTH, "aaco_gpu_pcie_link_width", "Current PCIe link width in lanes.")

SERIES = define(
    "aaco.telemetry.series", "aaco_telemetry_series", "gauge", "{series}", "GPU telemetry series kept by the analyzer."
)
SERIES_DROPPED = define(
    "aaco.telemetry.series_dropped",
    "aaco_telemetry_series_dropped",
    "counter",
    "{series}",
    "Telemetry readings not kept: max_series (the series cap was reached), unknown_metric.",
    ("reason",),
)

DEFINITIONS: Final[dict[str, MetricDef]] = {
    m.UTILIZATION: UTILIZATION,
    m.MEMORY_UTILIZATION: MEMORY_UTILIZATION,
    m.MEMORY_USAGE: MEMORY_USAGE,
    m.MEMORY_LIMIT: MEMORY_LIMIT,
    m.POWER: POWER,
    m.POWER_LIMIT: POWER_LIMIT,
    m.ENERGY: ENERGY,
    m.TEMPERATURE: TEMPERATURE,
    m.CLOCK: CLOCK,
    m.CLOCK_MAX: CLOCK_MAX,
    m.THROTTLE: THROTTLE,
    m.ERRORS: ERRORS,
    m.UP: UP,
    m.FAN_SPEED: FAN_SPEED,
    m.FAN_SPEED_RATIO: FAN_SPEED_RATIO,
    m.VOLTAGE: VOLTAGE,
    m.PSTATE: PSTATE,
    m.DPM_LEVEL: DPM_LEVEL,
    m.PCIE_LINK_GENERATION: PCIE_LINK_GENERATION,
    m.PCIE_LINK_WIDTH: PCIE_LINK_WIDTH,
    **HEALTH_DEFINITIONS,
    **ACTIVITY_DEFINITIONS,
}


@dataclass(frozen=True)
class TelemetryResult:
    """The latest value of every series, and what was dropped."""

    series: tuple[Series, ...]
    dropped: Mapping[str, int]
    compat: Mapping[str, str]

    def to_dict(self) -> dict[str, Any]:
        """Per GPU: identity, pod, and its latest readings (``metric{attr}`` -> value)."""
        gpus: dict[tuple[str, ...], dict[str, Any]] = {}
        for s in self.series:
            key = (s.source, s.labels["node"], s.labels["gpu"], s.labels["gpu_uuid"])
            g = gpus.setdefault(key, {**s.labels, "source": s.source, "readings": {}})
            name = s.metric + (f"{{{m.SERIES_ATTRIBUTE[s.metric]}={s.attr}}}" if s.attr else "")
            g["readings"][name] = s.value
        return {"gpus": list(gpus.values()), "series": len(self.series), "dropped": dict(self.dropped)}

    def points(self) -> list[MetricPoint]:
        """Every series under its definition (plus compatibility names where asked), and the analyzer's counters."""
        newest: dict[tuple[MetricDef, tuple[tuple[str, str], ...]], tuple[int, MetricPoint]] = {}

        def put(point: MetricPoint, ts_ns: int) -> None:
            key = (point.metric, tuple(sorted(point.labels.items())))
            if key not in newest or newest[key][0] <= ts_ns:  # two sources, same labels: the newest wins
                newest[key] = (ts_ns, point)

        for s in self.series:
            d = DEFINITIONS[s.metric]
            put(MetricPoint(d, s.labels_for(d), s.value, s.ts_ns), s.ts_ns)
        for point, ts_ns in compat_points(self.series, self.compat):
            put(point, ts_ns)
        out = [p for _, p in newest.values()]
        out.append(MetricPoint(SERIES, {}, float(len(self.series))))
        for reason in ("max_series", "unknown_metric"):
            out.append(MetricPoint(SERIES_DROPPED, {"reason": reason}, float(self.dropped.get(reason, 0))))
        return out


class TelemetrySettings(StrictModel):
    """The latest reading of every GPU telemetry series."""

    max_series: PositiveInt = Field(10_000, description="Series kept at once (further ones are dropped, counted).")
    stale_after_s: PositiveFloat = Field(
        300.0,
        description="Series not updated for this long (data time) are forgotten; at least 10 smi intervals.",
    )


class TelemetryAnalyzer(Analyzer):
    """Keeps the latest value of every GPU telemetry series (bounded, with a drop counter)."""

    name = "telemetry"
    kinds = frozenset({"telemetry"})

    def __init__(
        self, max_series: int = 10_000, stale_after_s: float = 300.0, compat: Mapping[str, str] | None = None
    ) -> None:
        self.max_series = max_series
        self.stale_after_ns = int(stale_after_s * 1e9)
        self.compat = dict(compat or {})
        self._series: dict[tuple[str, ...], Series] = {}
        self._dropped: Counter[str] = Counter()
        self._newest = 0
        # The last batch's identity columns and each row's series key (None: a metric not known):
        # a source sends the same rows sample after sample, so a batch that matches only moves values.
        self._layout: LayoutCache[list[tuple[str, ...] | None]] = LayoutCache(_LAYOUT_COLUMNS)

    def update(self, item: EventBatch) -> None:
        """Fold a telemetry batch in: the latest row of each series wins (per-process rows are the workloads')."""
        b = item.batch
        if b.num_rows and pc.any(per_process := pc.is_in(b.column("metric"), _process_metrics())).as_py():
            b = b.filter(pc.invert(per_process))
        if b.num_rows == 0:
            return
        layout = self._layout.layout(b)
        keys = self._layout.get(layout, item.source)
        if keys is None or not self._move(b, keys):
            self._fold(b, item.source, layout)
        horizon = self._newest - self.stale_after_ns
        stale = [k for k, s in self._series.items() if s.ts_ns < horizon]
        for k in stale:
            del self._series[k]

    def _move(self, b: pa.RecordBatch, keys: list[tuple[str, ...] | None]) -> bool:
        """Update the series of a batch laid out as the last one: values and times only; False if one is gone."""
        rows = [None if k is None else self._series.get(k) for k in keys]
        if any(s is None and k is not None for s, k in zip(rows, keys, strict=True)):
            return False  # a series expired since: the full fold finds out what to do
        for s, value, ts in zip(rows, b.column("value").to_pylist(), b.column("ts_ns").to_pylist(), strict=True):
            if s is None:
                self._dropped["unknown_metric"] += 1
            elif s.ts_ns <= ts:  # not an older reading arriving late
                s.value = float(value)
                s.ts_ns = ts
                self._newest = max(self._newest, ts)
        return True

    def _fold(self, b: pa.RecordBatch, item_source: str, layout: pa.RecordBatch) -> None:
        cols = {
            c: b.column(c).to_pylist() for c in ("ts_ns", "node", "device", "metric", "value", "gpu_uuid", "source")
        }
        attrs = b.column("attributes").to_pylist()
        keys: list[tuple[str, ...] | None] = []
        complete = True
        for i, metric in enumerate(cols["metric"]):
            if metric not in DEFINITIONS:
                self._dropped["unknown_metric"] += 1
                keys.append(None)
                continue
            a = dict(attrs[i] or ())
            attr = a.get(m.SERIES_ATTRIBUTE.get(metric, ""), "")
            source = cols["source"][i] or item_source
            uuid = cols["gpu_uuid"][i] or ""
            key = (source, cols["node"][i], cols["device"][i], uuid, metric, attr)
            keys.append(key)
            ts = cols["ts_ns"][i]
            old = self._series.get(key)
            if old is None and len(self._series) >= self.max_series:
                self._dropped["max_series"] += 1
                complete = False
                continue
            if old is not None and old.ts_ns > ts:
                continue  # an older reading arriving late
            self._series[key] = Series(
                metric,
                attr,
                {
                    "node": cols["node"][i],
                    "gpu": cols["device"][i],
                    "gpu_uuid": uuid,
                    "model": a.get(m.ATTR_MODEL, ""),
                    "pod": a.get(m.ATTR_POD, ""),
                    "namespace": a.get(m.ATTR_NAMESPACE, ""),
                    "container": a.get(m.ATTR_CONTAINER, ""),
                    "parent_uuid": a.get(m.ATTR_PARENT_UUID, ""),
                    "gpu_instance": a.get(m.ATTR_GPU_INSTANCE, ""),
                    "compute_instance": a.get(m.ATTR_COMPUTE_INSTANCE, ""),
                    "job": a.get(ATTR_JOB, ""),
                    "job_user": a.get(ATTR_JOB_USER, ""),
                    "job_partition": a.get(ATTR_JOB_PARTITION, ""),
                },
                float(cols["value"][i]),
                ts,
                source,
                a.get(m.ATTR_VENDOR, ""),
                a.get(m.ATTR_PCI, ""),
            )
            self._newest = max(self._newest, ts)
        # A batch with rows over the series cap is folded in full every time (its drops are counted).
        if complete:
            self._layout.put(layout, keys, item_source)
        else:
            self._layout.clear()

    def snapshot(self) -> TelemetryResult:
        """The latest values (an immutable copy)."""
        series = tuple(
            Series(s.metric, s.attr, dict(s.labels), s.value, s.ts_ns, s.source, s.vendor, s.pci_bus)
            for s in self._series.values()
        )
        return TelemetryResult(series, dict(self._dropped), dict(self.compat))


def create(s: TelemetrySettings, hints: AgentHints, max_models: int) -> TelemetryAnalyzer:
    """Series outlive ten samples of the slowest ``smi`` source; compatibility names as each asks."""
    stale = max(s.stale_after_s, 10 * hints.smi_interval_s)
    return TelemetryAnalyzer(max_series=s.max_series, stale_after_s=stale, compat=hints.smi_compat)


@functools.cache
def _process_metrics() -> pa.Array:
    """Built on first use: pyarrow's conversion of a list at import time would import pandas."""
    return pa.array(sorted(PROCESS_METRICS), pa.string())
