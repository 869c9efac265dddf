"""Compatibility names: the core GPU signals also under the names existing dashboards query.

Opt-in per ``smi`` source (``compat: amd | dcgm | auto``; ``auto`` picks by GPU vendor). Names,
units and label names follow the exporters the dashboards were built for:

- AMD device-metrics-exporter (``gpu_*``; labels ``gpu_id, gpu_uuid, card_model, hostname`` and
  ``pod, namespace, container``): activity in percent, power in W, temperatures in Celsius,
  ``gpu_clock`` in MHz with ``clock_type`` (system, memory, soc, video), VRAM in MB (2^20 bytes,
  as amd-smi counts), energy in microjoules, ECC totals;
- NVIDIA dcgm-exporter (``DCGM_FI_DEV_*``; labels ``gpu, UUID, device, modelName, Hostname,
  pci_bus_id`` and ``pod, namespace, container``): utilisation in percent, framebuffer in MiB, power
  in W, temperatures in Celsius, SM and memory clocks in MHz, total energy in millijoules. A MIG
  device's series are labelled as dcgm-exporter labels them: ``gpu``, ``UUID`` and ``device`` of its
  parent GPU and ``GPU_I_ID`` its GPU instance (two compute instances of one GPU instance share
  those labels there too: the newest reading wins).

The Slurm jobs on a GPU (docs/jobs.md, "Slurm") are labelled as those exporters label them: bare
job ids in ``hpc_job`` (dcgm-exporter) and ``job_id``, with ``job_user`` and ``job_partition``
(device-metrics-exporter); several jobs on one GPU are one comma-joined value, where dcgm-exporter
copies the series once per job.

Every compatibility metric is a gauge, even where the original is a counter, so that its exposed
name is exactly the original one (Prometheus clients add ``_total`` to counters). ``device`` is
``nvidia<index>`` (dcgm-exporter uses the device minor number, which usually equals the index).

These definitions are deliberately not registered with ``signals.define``: the registry holds
AACO's own ``aaco_*`` namespace (and generates the table of docs/metrics.md); the borrowed names
are listed in the prose of docs/metrics.md instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from aaco.analyzers.telemetry_series import Series
from aaco.contract import telemetry as m
from aaco.contract.signals import MetricDef, MetricPoint

AMD_LABELS: Final = (
    "gpu_id",
    "gpu_uuid",
    "card_model",
    "hostname",
    "pod",
    "namespace",
    "container",
    "job_id",
    "job_user",
    "job_partition",
)
DCGM_LABELS: Final = (
    "gpu",
    "UUID",
    "device",
    "modelName",
    "Hostname",
    "pci_bus_id",
    "GPU_I_ID",
    "pod",
    "namespace",
    "container",
    "hpc_job",
)


def _amd(name: str, unit: str, description: str, extra: tuple[str, ...] = ()) -> MetricDef:
    return MetricDef(
        name, name, "gauge", unit, f"AMD device-metrics-exporter compatible: {description}", AMD_LABELS + extra
    )


def _dcgm(name: str, unit: str, description: str) -> MetricDef:
    return MetricDef(name, name, "gauge", unit, f"dcgm-exporter compatible: {description}", DCGM_LABELS)


@dataclass(frozen=True)
class Rule:
    """Render series of ``metric`` (with series attribute ``attr``, if given) as ``target`` x ``factor``."""

    metric: str
    attr: str | None
    target: MetricDef
    factor: float
    clock_type: str = ""


MIB = float(m.MIB)
AMD_RULES: Final = (
    Rule(m.UTILIZATION, None, _amd("gpu_gfx_activity", "%", "graphics engine activity (0-100)."), 100.0),
    Rule(m.MEMORY_UTILIZATION, None, _amd("gpu_umc_activity", "%", "memory controller activity (0-100)."), 100.0),
    Rule(m.POWER, None, _amd("gpu_power_usage", "W", "GPU power usage in watts."), 1.0),
    Rule(m.TEMPERATURE, "edge", _amd("gpu_edge_temperature", "Cel", "edge temperature in Celsius."), 1.0),
    Rule(m.TEMPERATURE, "junction", _amd("gpu_junction_temperature", "Cel", "junction (hotspot) temperature."), 1.0),
    Rule(m.TEMPERATURE, "memory", _amd("gpu_memory_temperature", "Cel", "memory temperature in Celsius."), 1.0),
    Rule(m.MEMORY_USAGE, None, _amd("gpu_used_vram", "MiBy", "VRAM in use, in MB (2^20 bytes)."), 1 / MIB),
    Rule(m.MEMORY_LIMIT, None, _amd("gpu_total_vram", "MiBy", "VRAM size, in MB (2^20 bytes)."), 1 / MIB),
    Rule(m.ENERGY, None, _amd("gpu_energy_consumed", "uJ", "energy consumed, in microjoules."), 1e6),
    Rule(m.ERRORS, "corrected", _amd("gpu_ecc_correct_total", "{error}", "correctable ECC errors."), 1.0),
    Rule(m.ERRORS, "uncorrected", _amd("gpu_ecc_uncorrect_total", "{error}", "uncorrectable ECC errors."), 1.0),
)
_AMD_CLOCK = _amd("gpu_clock", "MHz", "clock by clock_type (system, memory, soc, video), in MHz.", ("clock_type",))
AMD_RULES_CLOCK: Final = tuple(
    Rule(m.CLOCK, ours, _AMD_CLOCK, 1e-6, theirs)
    for ours, theirs in (("graphics", "system"), ("memory", "memory"), ("soc", "soc"), ("video", "video"))
)
AMD_FREE_VRAM: Final = _amd("gpu_free_vram", "MiBy", "VRAM free, in MB (2^20 bytes).")

DCGM_RULES: Final = (
    Rule(m.UTILIZATION, None, _dcgm("DCGM_FI_DEV_GPU_UTIL", "%", "GPU utilization (in %)."), 100.0),
    Rule(m.MEMORY_UTILIZATION, None, _dcgm("DCGM_FI_DEV_MEM_COPY_UTIL", "%", "Memory utilization (in %)."), 100.0),
    Rule(m.MEMORY_USAGE, None, _dcgm("DCGM_FI_DEV_FB_USED", "MiBy", "Framebuffer memory used (in MiB)."), 1 / MIB),
    Rule(m.POWER, None, _dcgm("DCGM_FI_DEV_POWER_USAGE", "W", "Power draw (in W)."), 1.0),
    Rule(
        m.ENERGY,
        None,
        _dcgm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "mJ", "Total energy consumption since boot (in mJ)."),
        1000.0,
    ),
    Rule(m.TEMPERATURE, "edge", _dcgm("DCGM_FI_DEV_GPU_TEMP", "Cel", "GPU temperature (in C)."), 1.0),
    Rule(m.TEMPERATURE, "memory", _dcgm("DCGM_FI_DEV_MEMORY_TEMP", "Cel", "Memory temperature (in C)."), 1.0),
    Rule(m.CLOCK, "sm", _dcgm("DCGM_FI_DEV_SM_CLOCK", "MHz", "SM clock frequency (in MHz)."), 1e-6),
    Rule(m.CLOCK, "memory", _dcgm("DCGM_FI_DEV_MEM_CLOCK", "MHz", "Memory clock frequency (in MHz)."), 1e-6),
)
DCGM_FB_FREE: Final = _dcgm("DCGM_FI_DEV_FB_FREE", "MiBy", "Framebuffer memory free (in MiB).")


def _flavour(mode: str, vendor: str) -> str:
    if mode == "auto":
        return {"amd": "amd", "nvidia": "dcgm"}.get(vendor, "")
    return mode


def _amd_labels(s: Series) -> dict[str, str]:
    lb = s.labels
    return {
        "gpu_id": lb["gpu"],
        "gpu_uuid": lb["gpu_uuid"],
        "card_model": lb["model"],
        "hostname": lb["node"],
        "pod": lb["pod"],
        "namespace": lb["namespace"],
        "container": lb["container"],
        "job_id": _job_ids(lb),
        "job_user": lb.get("job_user", ""),
        "job_partition": lb.get("job_partition", ""),
    }


def _dcgm_labels(s: Series) -> dict[str, str]:
    lb = s.labels
    domain, _, rest = s.pci_bus.partition(":")
    mig = bool(lb.get("parent_uuid"))
    gpu = lb["gpu"].split("/", 1)[0] if mig else lb["gpu"]
    return {
        "gpu": gpu,
        "UUID": lb["parent_uuid"] if mig else lb["gpu_uuid"],
        "device": f"nvidia{gpu}",
        "modelName": lb["model"],
        "Hostname": lb["node"],
        "pci_bus_id": f"{domain.rjust(8, '0')}:{rest}".upper() if rest else "",
        "GPU_I_ID": lb.get("gpu_instance", "") if mig else "",
        "pod": lb["pod"],
        "namespace": lb["namespace"],
        "container": lb["container"],
        "hpc_job": _job_ids(lb),
    }


def _job_ids(labels: Mapping[str, str]) -> str:
    """The Slurm job ids of a series' ``job`` label (``slurm-81230,slurm-81234`` -> ``81230,81234``)."""
    return ",".join(j.removeprefix("slurm-") for j in labels.get("job", "").split(",") if j)


def compat_points(series: Iterable[Series], compat: Mapping[str, str]) -> Iterator[tuple[MetricPoint, int]]:
    """(point, reading time) of every compatibility metric the sources' ``compat`` settings ask for."""
    if not compat:
        return
    memory: dict[tuple[str, str, str], dict[str, Series]] = {}
    for s in series:
        flavour = _flavour(compat.get(s.source, "off"), s.vendor)
        if flavour not in ("amd", "dcgm"):
            continue
        rules = AMD_RULES + AMD_RULES_CLOCK if flavour == "amd" else DCGM_RULES
        labels = _amd_labels(s) if flavour == "amd" else _dcgm_labels(s)
        for r in rules:
            if r.metric == s.metric and (r.attr is None or r.attr == s.attr):
                lb = {**labels, "clock_type": r.clock_type} if r.clock_type else labels
                yield MetricPoint(r.target, lb, s.value * r.factor, s.ts_ns), s.ts_ns
        if s.metric in (m.MEMORY_USAGE, m.MEMORY_LIMIT):
            memory.setdefault((flavour, s.source, s.labels["gpu"]), {})[s.metric] = s
    for (flavour, _, _), pair in memory.items():
        if len(pair) < 2:
            continue
        used, total = pair[m.MEMORY_USAGE], pair[m.MEMORY_LIMIT]
        free = max(0.0, total.value - used.value) / MIB
        target, labels = (AMD_FREE_VRAM, _amd_labels(used)) if flavour == "amd" else (DCGM_FB_FREE, _dcgm_labels(used))
        ts = max(used.ts_ns, total.ts_ns)
        yield MetricPoint(target, labels, free, ts), ts
