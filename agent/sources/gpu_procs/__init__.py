"""The ``gpu_processes`` source: each GPU's processes, what each used, and the workload it belongs to.

Every ``interval_s`` (fixed rate) a backend (``backends``: NVML, AMD SMI, nvidia-smi, amd-smi, or a
capture) lists the processes on every GPU and logical device (MIG instance, partition) with what the
driver measured for each alone: SM or GFX share, memory-controller share, device memory. Each pid is
mapped to its workload (``workloads``): its container and pod through its cgroup and the kubelet's
log directories (and the pod-resources API for a pod of several containers), its Slurm job through
its environment. The rows (``contract.gpu_processes``) are published as a ``telemetry`` batch; the
``workloads`` analyzer sums them per workload and apportions each GPU's energy. The agent needs the
host's PID namespace (``hostPID``) for the pids the driver reports to be its own.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from aaco.agent.sources.base import Source, SourceContext
from aaco.agent.sources.gpu_procs.backends import open_backend
from aaco.agent.sources.gpu_procs.workloads import KubeletLogs, WorkloadResolver
from aaco.agent.sources.smi import pods
from aaco.agent.sources.smi.backends import Backend, BackendOptions, open_for
from aaco.agent.sources.smi.calls import BackendError
from aaco.agent.sources.smi.pods import DEFAULT_SOCKET, GPU_RESOURCES, Owner, PodAttribution
from aaco.agent.sources.smi.tracker import FixedRate
from aaco.agent.sources.smi.values import TelemetryFormatError
from aaco.contract.config_base import StrictModel
from aaco.contract.gpu_processes import MAX_NAME_CHARS, GpuProcess, ProcessSnapshot, to_rows
from aaco.contract.telemetry import GpuIdentity

log = logging.getLogger("aaco.sources.gpu_processes")

ProcessBackendName = Literal["auto", "amdsmi", "amd-smi", "nvml", "nvidia-smi", "file"]


class GpuProcessesSourceConfig(StrictModel):
    """The processes on every GPU and MIG device or partition, what each used, and its pod or Slurm job."""

    type: Literal["gpu_processes"] = "gpu_processes"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    backend: ProcessBackendName = Field(
        "auto",
        description="auto|amdsmi|amd-smi|nvml|nvidia-smi|file; auto takes the first that answers (amdsmi, amd-smi, "
        "nvml, nvidia-smi).",
    )
    interval_s: PositiveFloat = Field(2.0, description="Sampling interval in seconds (fixed rate).")
    timeout_s: PositiveFloat = Field(5.0, description="Deadline of every backend call; a tool that overruns is killed.")
    file: Path | None = Field(
        None,
        description="The capture the file backend reads at every sample: nvidia-smi -q -x, nvidia-smi pmon -s u, "
        "or amd-smi process --json output.",
    )
    samples: PositiveInt | None = Field(None, description="Samples to take; null samples until the agent stops.")
    max_processes: PositiveInt = Field(1024, description="Processes published per sample at most (the rest counted).")
    proc_root: Path = Field(Path("/proc"), description="The host's /proc (/host/proc in a container with hostPID).")
    kubelet_logs: Path | None = Field(
        Path("/var/log"),
        description="The directory holding the kubelet's containers/ and pods/ log directories, which name each "
        "container's pod; null: processes are not named by pod.",
    )
    kubelet_socket: Path | None = Field(
        DEFAULT_SOCKET,
        description="The kubelet's pod-resources socket, to tell which container of a pod holds a device; null: not "
        "asked.",
    )
    refresh_s: PositiveFloat = Field(10.0, description="How often the kubelet's directories and answer are read.")
    nvidia_smi: str = Field("nvidia-smi", description="The nvidia-smi command (name on PATH or path).")
    amd_smi: str = Field("amd-smi", description="The amd-smi command (name on PATH or path).")

    @field_validator("file", "proc_root", "kubelet_logs", "kubelet_socket")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        """Relative paths are taken against the working directory once, when the configuration loads."""
        return None if path is None else path.absolute()

    @model_validator(mode="after")
    def _file_with_file_backend(self) -> GpuProcessesSourceConfig:
        if self.backend == "file" and self.file is None:
            raise ValueError("backend file needs file: the capture to read")
        if self.file is not None and self.backend != "file":
            raise ValueError(f"file is only read by backend file (backend is {self.backend})")
        return self


class GpuProcessesSource(Source):
    """Lists every device's processes at a fixed rate and publishes them, with their workloads, as telemetry."""

    type = "gpu_processes"

    def __init__(self, config: GpuProcessesSourceConfig, name: str, options: BackendOptions | None = None) -> None:
        super().__init__(name)
        self.config = config
        self.finite = config.samples is not None
        self.options = options or BackendOptions(
            timeout_s=config.timeout_s, file=config.file, amd_smi=config.amd_smi, nvidia_smi=config.nvidia_smi
        )
        self.backend: Backend | None = None
        self.pods: PodAttribution | None = None
        logs = KubeletLogs(config.kubelet_logs, config.refresh_s) if config.kubelet_logs is not None else None
        self.resolver = WorkloadResolver(config.proc_root, logs, self._holders)
        self.taken = 0

    def _holders(self, device: GpuIdentity) -> list[Owner]:
        return self.pods.holders(device) if self.pods is not None else []

    def run(self, ctx: SourceContext) -> None:
        """Sample until stopped (or ``samples`` taken); a backend that cannot be opened is a fatal problem."""
        cfg = self.config
        self.backend = open_for(ctx, self.name, cfg.backend, self.options, open_backend)
        if self.backend is None:
            return
        log.info("%s: GPU processes from %s every %gs", self.name, self.backend.name, cfg.interval_s)
        if cfg.kubelet_socket is not None:
            self.pods = pods.for_source(
                ctx,
                self.name,
                cfg.kubelet_socket,
                refresh_s=cfg.refresh_s,
                timeout_s=cfg.timeout_s,
                resources=GPU_RESOURCES,
            )
        rate = FixedRate(cfg.interval_s)
        try:
            rate.run(ctx.stop, lambda: self.sample_once(ctx), cfg.samples, lambda n: self._overrun(ctx, n))
        finally:
            self.backend.close()
            if self.pods is not None:
                self.pods.close()

    def _overrun(self, ctx: SourceContext, slots: int) -> None:
        interval = self.config.interval_s
        subject = self.backend.name if self.backend is not None else self.name
        message = f"a listing took longer than the {interval:g}s interval; skipped the slots it overran"
        ctx.problem(self.name, subject, "overrun", message, fatal=False, count=slots)

    def sample_once(self, ctx: SourceContext) -> int:
        """List the processes once and publish them; returns the rows published."""
        assert self.backend is not None
        ts = time.time_ns()
        try:
            snap: ProcessSnapshot = self.backend.sample()  # type: ignore[assignment]
        except (BackendError, TelemetryFormatError) as exc:
            reason = getattr(exc, "reason", "unreadable")
            ctx.problem(self.name, exc.subject or self.backend.name, reason, exc.message, fatal=False, count=1)
            return 0
        for p in snap.problems:
            ctx.problem(self.name, f"{p.subject}: field {p.field}", "malformed", p.message, fatal=False, count=1)
        processes = snap.processes
        if len(processes) > self.config.max_processes:
            ctx.problem(
                self.name,
                self.backend.name,
                "max_processes",
                f"more than {self.config.max_processes} GPU processes in one sample; the rest are not published",
                fatal=False,
                count=len(processes) - self.config.max_processes,
            )
            processes = processes[: self.config.max_processes]
        if self.pods is not None:
            self.pods.refresh_when_due()
        self.resolver.refresh()
        processes = [self._named(p) for p in processes]
        workloads = {p.pid: self.resolver.resolve(p.pid, p.device) for p in processes}
        table = to_rows(processes, workloads, ts_ns=ts, node=ctx.node, source=self.name)
        self.taken += 1
        if table.num_rows:
            ctx.publish(self.name, "telemetry", table, durable=False, live=True)
        return table.num_rows

    def _named(self, p: GpuProcess) -> GpuProcess:
        """The process with its executable's name from ``/proc/<pid>/comm`` when the backend gave none."""
        if p.name:
            return p
        try:
            with open(self.config.proc_root / str(p.pid) / "comm", encoding="utf-8", errors="replace") as fh:
                name = fh.read(MAX_NAME_CHARS).strip()
        except OSError:
            return p
        return replace(p, name=name)


def create(config: GpuProcessesSourceConfig, name: str) -> GpuProcessesSource:
    """Factory used by the source registry."""
    return GpuProcessesSource(config, name)
