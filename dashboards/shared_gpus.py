"""Shared GPUs: who uses which GPU or slice, what each workload uses of it, its energy, the Slurm jobs on GPUs.

A workload is a pod (namespace, pod, container), a Slurm job, or a process outside both (by its
executable's name): the ``workloads`` analyzer's series, measured per process by the
``gpu_processes`` source (docs/shared-gpus.md), never the device's own readings copied per pod.
Slices are MIG devices and AMD partitions: devices with a parent GPU (``parent_uuid``). Energy per
workload is measured where a workload holds a whole GPU alone, else apportioned above idle by SM
share (Kepler's model); the rest is the GPU's idle energy.
"""

from __future__ import annotations

from typing import Final

from .lib import DEVICE, GPU, RATE, Q, Spec, bars, tbl, ts

UID: Final = "aaco-shared-gpus"
WHO: Final = "{{node}} gpu{{gpu}} {{namespace}}/{{pod}}{{job}}{{process}}"
SLICE: Final = f'{GPU}, parent_uuid!=""'


def spec(traces_plugin: str) -> Spec:
    """The dashboard's panels."""
    who = [
        tbl(
            "Workloads on each GPU and slice now",
            "Every pod, Slurm job or bare process with a process on a device (the gpu_processes source: NVML, AMD "
            "SMI, nvidia-smi, amd-smi), and how many processes it has there.",
            "short",
            [Q(f"aaco_gpu_workload_processes{{{GPU}}}", "", instant=True, table=True)],
            width=24,
        ),
        ts(
            "SM share by workload",
            "Share of the device's SM (NVIDIA) or GFX engine (AMD) time each workload's processes used, as the "
            "driver measured it per process; the shares of a time-sliced GPU add up to at most its utilisation.",
            "percentunit",
            [Q(f"aaco_gpu_workload_utilization_ratio{{{GPU}}}", WHO)],
            min_val=0,
            max_val=1,
            stack=True,
        ),
        ts(
            "Device memory by workload",
            "Device memory each workload's processes hold on the device (on a MIG device, out of its own slice).",
            "bytes",
            [Q(f"aaco_gpu_workload_memory_used_bytes{{{GPU}}}", WHO)],
            min_val=0,
            stack=True,
        ),
        ts(
            "Memory-controller share by workload",
            "Share of the device's memory-controller time each workload's processes used (NVIDIA; AMD does not "
            "measure it per process).",
            "percentunit",
            [Q(f"aaco_gpu_workload_memory_utilization_ratio{{{GPU}}}", WHO)],
            min_val=0,
            max_val=1,
            width=24,
        ),
    ]
    slices = [
        bars(
            "Memory used of each slice",
            "Each MIG device's or AMD partition's own memory used out of its own total (the GPU's power, "
            "temperature and utilisation stay on the GPU: docs/shared-gpus.md).",
            "percentunit",
            [
                Q(
                    f"aaco_gpu_memory_usage_bytes{{{SLICE}}} / aaco_gpu_memory_limit_bytes{{{SLICE}}}",
                    "{{node}} gpu{{gpu}}",
                )
            ],
            min_val=0,
            max_val=1,
            steps=(("green", None), ("orange", 0.8), ("red", 0.95)),
        ),
        tbl(
            "Slices and their GPU",
            "Each MIG device (GPU instance, compute instance) or AMD partition (its number as gpu_instance), the "
            "UUID of the GPU it is carved from, and whether it answers.",
            "short",
            [
                Q(
                    f"max by (node, gpu, parent_uuid, gpu_instance, compute_instance) (aaco_gpu_up{{{SLICE}}})",
                    "",
                    instant=True,
                    table=True,
                )
            ],
        ),
    ]
    energy = [
        ts(
            "Power by workload",
            "Each workload's share of its GPU's power, from its energy: measured (alone on a whole GPU), "
            "apportioned (above idle, by SM share) or the GPU's own idle (no workload labels).",
            "watt",
            [
                Q(
                    "sum by (node, gpu, namespace, pod, job, process, method) "
                    f"(rate(aaco_gpu_workload_energy_joules_total{{{GPU}}}[{RATE}]))",
                    WHO + " {{method}}",
                )
            ],
            min_val=0,
            stack=True,
        ),
        bars(
            "Energy by workload over the time range",
            "GPU energy each pod, Slurm job or process used over the dashboard's time range, idle energy left out.",
            "joule",
            [
                Q(
                    "sort_desc(sum by (namespace, pod, job, process) "
                    f'(increase(aaco_gpu_workload_energy_joules_total{{{GPU}, method!="idle"}}[$__range])))',
                    "{{namespace}}/{{pod}}{{job}}{{process}}",
                    instant=True,
                )
            ],
            min_val=0,
        ),
    ]
    jobs = [
        tbl(
            "Slurm jobs on GPUs",
            "The Slurm jobs each GPU runs (prolog mapping files in dcgm-exporter's or AMD's format, or the "
            "SLURM_JOB_ID of the processes holding it; docs/jobs.md, Slurm), with their user and partition.",
            "short",
            [
                Q(
                    f'max by (node, gpu, job, job_user, job_partition) (aaco_gpu_up{{{DEVICE}, job!=""}})',
                    "",
                    instant=True,
                    table=True,
                )
            ],
            width=24,
        ),
    ]
    return Spec(
        uid=UID,
        title="AACO / Shared GPUs",
        description="Who uses which GPU or slice (MIG devices, AMD partitions), each pod's, job's or process's "
        "SM share, memory and energy, and the Slurm jobs on the GPUs.",
        tags=("gpu", "shared"),
        rows=[
            ("Who uses which GPU", who),
            ("Slices", slices),
            ("Energy", energy),
            ("Slurm jobs", jobs),
        ],
    )
