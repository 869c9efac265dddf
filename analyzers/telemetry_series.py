"""One GPU telemetry series as the telemetry analyzer keeps it (shared with the compatibility names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from aaco.contract.signals import MetricDef

# parent_uuid, gpu_instance, compute_instance: a logical device's (a MIG device, an AMD partition;
# docs/shared-gpus.md), empty (absent to Prometheus) on a physical GPU; bounded by the devices
# job, job_user, job_partition: the Slurm jobs on the GPU (docs/jobs.md, "Slurm"), at most 4 comma-joined
BASE_LABELS: Final = (
    "node",
    "gpu",
    "gpu_uuid",
    "model",
    "pod",
    "namespace",
    "container",
    "parent_uuid",
    "gpu_instance",
    "compute_instance",
    "job",
    "job_user",
    "job_partition",
)


@dataclass(slots=True)
class Series:
    """The latest reading of one series."""

    metric: str
    attr: str  # the value of the metric's series attribute ("" when it has none)
    labels: dict[str, str]  # BASE_LABELS
    value: float
    ts_ns: int
    source: str
    vendor: str
    pci_bus: str

    def labels_for(self, metric: MetricDef) -> dict[str, str]:
        """Labels of this series under ``metric`` (the base labels plus its series attribute)."""
        extra = {k: self.attr for k in metric.labels if k not in self.labels}
        return {**self.labels, **extra}
