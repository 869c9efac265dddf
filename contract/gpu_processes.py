"""The processes on each GPU and what each was measured to use (docs/shared-gpus.md, "Per process").

A backend of the ``gpu_processes`` source returns a ``ProcessSnapshot``: one ``GpuProcess`` per
(device, pid), the device being the GPU or the logical device (MIG instance, partition) the
process runs on, with what the driver measured for that process alone: its share of the SMs' or
GFX engine's time, of the memory controller's time, and the device memory it holds (None where
not measured). ``to_rows`` makes them ``telemetry`` rows (``PROCESS_*`` metrics) whose attributes
name the process and the workload it belongs to (``Workload``: its pod, container, Slurm job).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa

from aaco.contract.jobs import ATTR_JOB, ATTR_JOB_PARTITION, ATTR_JOB_USER
from aaco.contract.telemetry import (
    ATTR_CONTAINER,
    ATTR_NAMESPACE,
    ATTR_POD,
    PROCESS_MEMORY_USAGE,
    PROCESS_MEMORY_UTILIZATION,
    PROCESS_UTILIZATION,
    FieldProblem,
    GpuIdentity,
    GpuSample,
    Reading,
    to_table,
)

PROCESS_METRICS: Final = frozenset({PROCESS_UTILIZATION, PROCESS_MEMORY_UTILIZATION, PROCESS_MEMORY_USAGE})
ATTR_PID: Final = "process.pid"
ATTR_PROCESS_NAME: Final = "process.executable.name"
ATTR_PROCESS_TYPE: Final = "aaco.gpu.process.type"  # compute | graphics | compute+graphics | mps
ATTR_CONTAINER_ID: Final = "container.id"
ATTR_POD_UID: Final = "k8s.pod.uid"
MAX_NAME_CHARS: Final = 128


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process on one device and what was measured for it alone (None: not measured)."""

    device: GpuIdentity
    pid: int
    name: str = ""
    type: str = "compute"
    utilization: float | None = None  # 0..1
    memory_utilization: float | None = None  # 0..1
    memory_bytes: float | None = None


@dataclass
class ProcessSnapshot:
    """One reading of every device's processes, and the problems met on the way."""

    format: str
    processes: list[GpuProcess] = field(default_factory=list)
    problems: list[FieldProblem] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Workload:
    """What a process belongs to: its container and pod, its Slurm job (each "" when not known)."""

    pod: str = ""
    namespace: str = ""
    container: str = ""
    pod_uid: str = ""
    container_id: str = ""
    job: str = ""
    job_user: str = ""
    job_partition: str = ""

    def attributes(self) -> dict[str, str]:
        """The non-empty ones, under their OpenTelemetry (and AACO) attribute names."""
        named = {
            ATTR_POD: self.pod,
            ATTR_NAMESPACE: self.namespace,
            ATTR_CONTAINER: self.container,
            ATTR_POD_UID: self.pod_uid,
            ATTR_CONTAINER_ID: self.container_id,
            ATTR_JOB: self.job,
            ATTR_JOB_USER: self.job_user,
            ATTR_JOB_PARTITION: self.job_partition,
        }
        return {k: v for k, v in named.items() if v}


def to_rows(
    processes: Iterable[GpuProcess],
    workloads: Mapping[int, Workload],
    *,
    ts_ns: int,
    node: str,
    source: str,
) -> pa.RecordBatch:
    """``telemetry`` rows: per process, each measured value with the process and its workload as attributes."""
    samples = []
    for p in processes:
        attrs = {ATTR_PID: str(p.pid), ATTR_PROCESS_TYPE: p.type}
        if p.name:
            attrs[ATTR_PROCESS_NAME] = p.name[:MAX_NAME_CHARS]
        attrs.update(workloads.get(p.pid, Workload()).attributes())
        items = tuple(sorted(attrs.items()))
        readings = [
            Reading(metric, float(value), items)
            for metric, value in (
                (PROCESS_UTILIZATION, p.utilization),
                (PROCESS_MEMORY_UTILIZATION, p.memory_utilization),
                (PROCESS_MEMORY_USAGE, p.memory_bytes),
            )
            if value is not None
        ]
        if readings:
            samples.append(GpuSample(p.device, readings))
    return to_table(samples, ts_ns=ts_ns, node=node, source=source)
