"""The ``smi`` source: GPU telemetry of every GPU of the node, attributed to the pods that own them.

Clocks, power, temperature, utilisation, memory, throttling and errors; with ``activity``, the
activity counters (NVML GPM on Hopper and later, AMD's activity: ``nvml_gpm``, ``amd_activity``),
paused while another profiler runs or the counters are busy (``counters_guard``).

Backends (``backend``): ``amdsmi`` (the AMD SMI library), ``amd-smi`` / ``rocm-smi`` (the tools'
JSON), ``sysfs`` (amdgpu's files), ``nvml`` (nvidia-ml-py), ``nvidia-smi`` (its XML), ``file``
(any of those captured in a file, read again at every sample) and ``auto`` (the best present, see
``backends``). Every ``interval_s`` (fixed rate, no drift: ``tracker.FixedRate``) the backend is
read under ``timeout_s`` (``calls``: a hung tool is killed), GPUs that vanished are reported down
(``tracker.GpuTracker``), the kubelet's pod-resources API says which pod owns each GPU (``pods``),
and the readings are published as one ``telemetry`` batch. Telemetry is live (it cannot be
paused and read later), so it is offered to the bus: when the bus is full the batch is dropped
and counted, never waited for. Bad values are reported with the file and field at fault; the
readings around them are kept.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from aaco.agent.sources.base import Source, SourceContext
from aaco.agent.sources.smi import pods
from aaco.agent.sources.smi.backends import Backend, BackendName, BackendOptions, open_backend, open_for
from aaco.agent.sources.smi.calls import BackendError
from aaco.agent.sources.smi.counters_guard import DEFAULT_PROFILERS
from aaco.agent.sources.smi.pods import DEFAULT_SOCKET, GPU_RESOURCES, PodAttribution
from aaco.agent.sources.smi.slurm import SlurmAttribution
from aaco.agent.sources.smi.tracker import FixedRate, GpuTracker
from aaco.agent.sources.smi.values import TelemetryFormatError
from aaco.contract.config_base import StrictModel
from aaco.contract.telemetry import Snapshot, to_table

log = logging.getLogger("aaco.sources.smi")

Compat = Literal["off", "auto", "amd", "dcgm"]


class SmiSourceConfig(StrictModel):
    """GPU telemetry from AMD (amdsmi, amd-smi, rocm-smi, sysfs) and NVIDIA (NVML, nvidia-smi) GPUs, per pod."""

    type: Literal["smi"] = "smi"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    backend: BackendName = Field(
        "auto",
        description="auto|amdsmi|amd-smi|rocm-smi|sysfs|nvml|nvidia-smi|file; auto takes the best present "
        "(amdsmi, sysfs, amd-smi, rocm-smi, then nvml, nvidia-smi).",
    )
    interval_s: PositiveFloat = Field(1.0, description="Sampling interval in seconds (fixed rate).")
    timeout_s: PositiveFloat = Field(5.0, description="Deadline of every backend call; a tool that overruns is killed.")
    file: Path | None = Field(None, description="The capture the file backend reads at every sample.")
    sysfs_root: Path = Field(
        Path("/sys"), description="Directory that holds class/drm (/host/sys when a container mounts the host's /sys)."
    )
    samples: PositiveInt | None = Field(None, description="Samples to take; null samples until the agent stops.")
    max_gpus: PositiveInt = Field(64, description="GPUs tracked at most (bounds label sets).")
    compat: Compat = Field(
        "off",
        description="Also export the core signals under existing exporters' names: amd (device-metrics-exporter), "
        "dcgm (dcgm-exporter), auto (by GPU vendor), off.",
    )
    kubelet_socket: Path | None = Field(
        DEFAULT_SOCKET, description="The kubelet's pod-resources socket for per-pod labels; null: no attribution."
    )
    pod_refresh_s: PositiveFloat = Field(10.0, description="How often the pod -> GPU mapping is refreshed.")
    gpu_resources: list[str] = Field(
        list(GPU_RESOURCES), min_length=1, description="Extended resource names of GPUs in the kubelet's answer."
    )
    slurm_job_mapping_dir: Path | None = Field(
        None,
        description="dcgm-exporter's HPC job mapping directory (its --hpc-job-mapping-dir, no default): files named "
        "by GPU index or <gpu>.<gpu instance> listing job ids, written by Slurm prologs; null: not read.",
    )
    slurm_amd_job_dir: Path | None = Field(
        None,
        description="AMD device-metrics-exporter's Slurm directory (/var/run/exporter with its prolog): a JSON file "
        "per GPU with SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_PARTITION; null: not read.",
    )
    slurm_from_environment: bool = Field(
        False,
        description="Attribute GPUs to the Slurm jobs of the processes holding them open (SLURM_JOB_ID in "
        "/proc/<pid>/environ, the GPU from /proc/<pid>/fd); needs the host's PID namespace.",
    )
    slurm_refresh_s: PositiveFloat = Field(10.0, description="How often the GPU -> Slurm job mapping is refreshed.")
    proc_root: Path = Field(
        Path("/proc"), description="The host's /proc, for slurm_from_environment (/host/proc in a container)."
    )
    amd_smi: str = Field("amd-smi", description="The amd-smi command (name on PATH or path).")
    rocm_smi: str = Field("rocm-smi", description="The rocm-smi command (name on PATH or path).")
    nvidia_smi: str = Field("nvidia-smi", description="The nvidia-smi command (name on PATH or path).")
    activity: bool = Field(
        True,
        description="Sample the activity counters (SM, tensor, DRAM, media, PCIe and NVLink activity: NVML GPM on "
        "Hopper and later, amdsmi and amd-smi on AMD), paused while a profiler runs or the counters are busy.",
    )
    activity_max_failures: PositiveInt = Field(
        3,
        description="Consecutive failures after which a GPU's activity counters are turned off until the agent "
        "restarts or a reload changes this source's configuration.",
    )
    profilers: list[str] = Field(
        list(DEFAULT_PROFILERS),
        description="Programs that pause activity sampling while they run on the node; 'NAME WORD': only when "
        "running subcommand WORD (its first argument that is not an option).",
    )

    @field_validator("file", "sysfs_root", "kubelet_socket", "slurm_job_mapping_dir", "slurm_amd_job_dir", "proc_root")
    @classmethod
    def _absolute(cls, path: Path | None) -> Path | None:
        """Relative paths are taken against the working directory once, when the configuration loads.

        The process's working directory can change while the agent runs (bcc compiles eBPF programs
        in another directory), and a capture read every second must not go missing meanwhile.
        """
        return None if path is None else path.absolute()

    @model_validator(mode="after")
    def _file_with_file_backend(self) -> SmiSourceConfig:
        if self.backend == "file" and self.file is None:
            raise ValueError("backend file needs file: the capture to read")
        if self.file is not None and self.backend != "file":
            raise ValueError(f"file is only read by backend file (backend is {self.backend})")
        return self

    def backend_options(self) -> BackendOptions:
        """The options the backends take."""
        return BackendOptions(
            timeout_s=self.timeout_s,
            sysfs_root=self.sysfs_root,
            file=self.file,
            amd_smi=self.amd_smi,
            rocm_smi=self.rocm_smi,
            nvidia_smi=self.nvidia_smi,
            activity=self.activity,
            activity_max_failures=self.activity_max_failures,
            profilers=tuple(self.profilers),
        )


class SmiSource(Source):
    """Samples GPU telemetry at a fixed rate and publishes it as ``telemetry`` batches."""

    type = "smi"

    def __init__(self, config: SmiSourceConfig, name: str, options: BackendOptions | None = None) -> None:
        super().__init__(name)
        self.config = config
        self.finite = config.samples is not None
        self.options = options or config.backend_options()
        self.backend: Backend | None = None
        self.rate: FixedRate | None = None
        self.tracker = GpuTracker(config.max_gpus)
        self.pods: PodAttribution | None = None
        self.slurm = SlurmAttribution(
            mapping_dir=config.slurm_job_mapping_dir,
            amd_dir=config.slurm_amd_job_dir,
            from_environment=config.slurm_from_environment,
            proc_root=config.proc_root,
            refresh_s=config.slurm_refresh_s,
        )
        self.taken = 0

    def run(self, ctx: SourceContext) -> None:
        """Sample until stopped (or ``samples`` taken); a backend that cannot be opened is a fatal problem."""
        cfg = self.config
        self.backend = open_for(ctx, self.name, cfg.backend, self.options, open_backend)
        if self.backend is None:
            return
        log.info("%s: GPU telemetry from %s every %gs", self.name, self.backend.name, cfg.interval_s)
        if cfg.kubelet_socket is not None:
            self.pods = pods.for_source(
                ctx,
                self.name,
                cfg.kubelet_socket,
                refresh_s=cfg.pod_refresh_s,
                timeout_s=cfg.timeout_s,
                resources=cfg.gpu_resources,
            )
        self.rate = FixedRate(cfg.interval_s)
        try:
            self.rate.run(ctx.stop, lambda: self.sample_once(ctx), cfg.samples, lambda n: self._overrun(ctx, n))
        finally:
            self.backend.close()
            if self.pods is not None:
                self.pods.close()

    def _overrun(self, ctx: SourceContext, slots: int) -> None:
        interval = self.config.interval_s
        subject = self.backend.name if self.backend is not None else self.name
        message = f"a sample took longer than the {interval:g}s interval; skipped the slots it overran"
        ctx.problem(self.name, subject, "overrun", message, fatal=False, count=slots)

    def sample_once(self, ctx: SourceContext) -> int:
        """Read the backend once and publish what it gave; returns the rows published."""
        assert self.backend is not None
        ts = time.time_ns()
        snap: Snapshot | None
        try:
            snap = self.backend.sample()
        except (BackendError, TelemetryFormatError) as exc:
            snap = None
            reason = getattr(exc, "reason", "unreadable")
            ctx.problem(self.name, exc.subject or self.backend.name, reason, exc.message, fatal=False, count=1)
        if snap is not None:
            for p in snap.problems:
                ctx.problem(self.name, f"{p.subject}: field {p.field}", "malformed", p.message, fatal=False, count=1)
        samples, changes = self.tracker.update(snap)
        for gpu in changes.lost:
            ctx.problem(
                self.name,
                f"gpu {gpu.index}",
                "gpu_lost",
                f"GPU {gpu.index} ({gpu.model or gpu.uuid}) stopped answering: reported down",
                fatal=False,
                count=1,
            )
        for gpu in changes.back:
            log.info("%s: GPU %s is back", self.name, gpu.index)
        if changes.refused:
            ctx.problem(
                self.name,
                self.backend.name,
                "max_gpus",
                f"more than {self.config.max_gpus} GPUs; the rest are not tracked",
                fatal=False,
                count=changes.refused,
            )
        extra = self.pods.lookup([s.gpu for s in samples]) if self.pods is not None else {}
        for index, attrs in self.slurm.lookup([s.gpu for s in samples]).items():
            extra[index] = {**extra.get(index, {}), **attrs}
        table = to_table(samples, ts_ns=ts, node=ctx.node, source=self.name, extra=extra)
        self.taken += 1
        if table.num_rows:
            ctx.publish(self.name, "telemetry", table, durable=False, live=True)
        return table.num_rows


def create(config: SmiSourceConfig, name: str) -> SmiSource:
    """Factory used by the source registry."""
    return SmiSource(config, name)
