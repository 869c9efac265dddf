"""Which Slurm jobs run on which GPU (docs/jobs.md, "Slurm"): prolog-written mapping files, GPU processes' environment.

Three ways, merged per GPU (job ids in the union of what each says; a job's user and partition
from whichever knows them):

- **dcgm-exporter's job mapping directory** (its ``--hpc-job-mapping-dir``,
  ``internal/pkg/transformation/hpc.go``), read unchanged so that existing prolog scripts work:
  one file per GPU named by its index (``0``, ``1``) or, for a MIG instance, ``<gpu>.<gpu
  instance id>`` (``0.1``; other names and directories skipped), each holding job ids one per
  line (blank lines skipped here; dcgm-exporter keeps them as empty jobs). dcgm-exporter has no
  default directory.
- **AMD device-metrics-exporter's directory** (``/var/run/exporter/``, written by its
  ``slurm-prolog.sh``, read by ``pkg/exporter/scheduler/slurm.go``): one file per GPU named by its
  index, holding a JSON object of the job's ``SLURM_JOB_ID``, ``SLURM_JOB_USER``,
  ``SLURM_JOB_PARTITION``, ``SLURM_CLUSTER_NAME``, ``SLURM_JOB_GPUS`` and ``CUDA_VISIBLE_DEVICES``
  (the job's GPUs, comma-separated, modulo 128). As AMD's reader does, the job goes to every GPU
  its ``CUDA_VISIBLE_DEVICES`` names (else ``SLURM_JOB_GPUS``, else the file's name).
- **The environment of GPU processes**: a process with ``/dev/nvidia<N>`` or
  ``/dev/dri/renderD<M>`` open (``/proc/<pid>/fd``; N is the device's minor number, taken as the
  GPU's index, M - 128 likewise, as AMD's prolog does) and ``SLURM_JOB_ID`` in its
  ``/proc/<pid>/environ`` runs that job on that GPU; ``SLURM_JOB_USER`` (else ``USER``) and
  ``SLURM_JOB_PARTITION`` name its user and partition. Without the MIG capability files this
  cannot tell a MIG instance: such jobs go to the whole GPU's key.

A GPU is keyed by (index, GPU instance id or None). Several jobs on one key are listed together,
ordered by job id (numerically), the first ``MAX_JOBS`` only, comma-joined in the attributes (one
series per GPU, where dcgm-exporter copies every series once per job). Mapping files are read and
processes scanned every ``refresh_s``; an unreadable file or process is skipped.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Final

from aaco.agent.sources.jobs import read_environ
from aaco.contract.jobs import ATTR_JOB, ATTR_JOB_PARTITION, ATTR_JOB_USER, slurm_job_name
from aaco.contract.telemetry import GpuIdentity

log = logging.getLogger("aaco.sources.smi.slurm")

AMD_JOB_DIR: Final = Path("/var/run/exporter")  # device-metrics-exporter's globals.SlurmDir
MAX_JOBS: Final = 4  # jobs named on one GPU at most (bounded label values)
MAX_FILE_BYTES: Final = 64 * 1024  # of one mapping file
MAX_FILES: Final = 1024  # mapping files read per directory
MAX_ID_CHARS: Final = 64
_DCGM_NAME = re.compile(r"^(\d+)(?:\.(\d+))?$")
_NVIDIA_NODE = re.compile(r"^nvidia(\d+)$")
_RENDER_NODE = re.compile(r"^dri/renderD(\d+)$")

GpuKey = tuple[str, str | None]  # (GPU index, GPU instance id for a MIG instance)


@dataclass(frozen=True)
class SlurmJob:
    """A Slurm job as a mapping file or a process environment names it."""

    id: str
    user: str = ""
    partition: str = ""


def clean(value: object) -> str:
    """A job id, user or partition as a label value: printable, no commas (the joiner), bounded; "" for a non-string."""
    text = value if isinstance(value, str) else ""
    return "".join(ch for ch in text if ch.isprintable() and ch != ",").strip()[:MAX_ID_CHARS]


def _files(directory: Path) -> list[Path]:
    try:
        names = sorted(os.listdir(directory))[:MAX_FILES]
    except OSError:
        return []
    return [directory / n for n in names]


def _read(path: Path) -> str | None:
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as fh:
            return fh.read(MAX_FILE_BYTES).decode(errors="replace")
    except OSError:
        return None


def read_dcgm_dir(directory: Path) -> dict[GpuKey, list[SlurmJob]]:
    """dcgm-exporter's job mapping directory: (GPU index, GPU instance id or None) -> the jobs its file lists."""
    out: dict[GpuKey, list[SlurmJob]] = {}
    for path in _files(directory):
        m = _DCGM_NAME.match(path.name)
        text = _read(path) if m else None
        if m is None or text is None:
            continue
        ids = [clean(line) for line in text.splitlines()]
        jobs = [SlurmJob(i) for i in dict.fromkeys(ids) if i]
        if jobs:
            out[(str(int(m.group(1))), None if m.group(2) is None else str(int(m.group(2))))] = jobs
    return out


def read_amd_dir(directory: Path) -> dict[GpuKey, list[SlurmJob]]:
    """device-metrics-exporter's Slurm directory: GPU index -> the job of the JSON file that names it."""
    out: dict[GpuKey, list[SlurmJob]] = {}
    for path in _files(directory):
        if not path.name.isdigit():
            continue
        text = _read(path)
        try:
            doc = json.loads(text) if text is not None else None
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            continue
        job = SlurmJob(
            clean(doc.get("SLURM_JOB_ID")), clean(doc.get("SLURM_JOB_USER")), clean(doc.get("SLURM_JOB_PARTITION"))
        )
        if not job.id:
            continue
        gpus = doc.get("CUDA_VISIBLE_DEVICES") or doc.get("SLURM_JOB_GPUS") or path.name
        for gpu in str(gpus).split(","):
            if gpu.strip().isdigit():
                jobs = out.setdefault((str(int(gpu) % 128), None), [])
                if job not in jobs:
                    jobs.append(job)
    return out


def device_index(target: str, dev_root: Path = Path("/dev")) -> str | None:
    """The GPU index a device node path names: ``/dev/nvidia3`` -> ``3``, ``/dev/dri/renderD129`` -> ``1``."""
    prefix = os.fspath(dev_root).rstrip("/") + "/"
    if not target.startswith(prefix):
        return None
    rest = target[len(prefix) :]
    if m := _NVIDIA_NODE.match(rest):
        return str(int(m.group(1)))
    if (m := _RENDER_NODE.match(rest)) and int(m.group(1)) >= 128:
        return str(int(m.group(1)) - 128)
    return None


def gpu_processes(proc: Path = Path("/proc"), dev_root: Path = Path("/dev")) -> dict[int, set[str]]:
    """Process id -> the GPU indexes it holds open (``fd`` links to GPU device nodes); unreadable processes skipped."""
    out: dict[int, set[str]] = {}
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return out
    for pid in pids:
        fd_dir = proc / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd_dir / fd)
            except OSError:
                continue
            index = device_index(target, dev_root)
            if index is not None:
                out.setdefault(pid, set()).add(index)
    return out


def environment_job(env: Mapping[str, str]) -> SlurmJob | None:
    """The Slurm job a process environment names (``SLURM_JOB_ID``; its user, else ``USER``; its partition)."""
    job_id = clean(env.get("SLURM_JOB_ID"))
    if not job_id:
        return None
    return SlurmJob(job_id, clean(env.get("SLURM_JOB_USER") or env.get("USER")), clean(env.get("SLURM_JOB_PARTITION")))


def environment_jobs(proc: Path = Path("/proc"), dev_root: Path = Path("/dev")) -> dict[GpuKey, list[SlurmJob]]:
    """GPU index -> the Slurm jobs of the processes that hold it open (``SLURM_JOB_ID`` in their environment)."""
    out: dict[GpuKey, list[SlurmJob]] = {}
    for pid, gpus in sorted(gpu_processes(proc, dev_root).items()):
        job = environment_job(read_environ(pid, proc) or {})
        if job is None:
            continue
        for gpu in gpus:
            jobs = out.setdefault((gpu, None), [])
            if job not in jobs:
                jobs.append(job)
    return out


def _order(job: SlurmJob) -> tuple[int, int, str]:
    return (0, int(job.id), "") if job.id.isdigit() else (1, 0, job.id)


def merge(*layers: dict[GpuKey, list[SlurmJob]]) -> dict[GpuKey, list[SlurmJob]]:
    """Per key, the union of the layers' jobs (ordered by id); a job's user and partition from the first that knows."""
    out: dict[GpuKey, list[SlurmJob]] = {}
    for key in {k for layer in layers for k in layer}:
        by_id: dict[str, SlurmJob] = {}
        for layer in layers:
            for job in layer.get(key, []):
                old = by_id.get(job.id)
                if old is None:
                    by_id[job.id] = job
                else:
                    by_id[job.id] = replace(old, user=old.user or job.user, partition=old.partition or job.partition)
        out[key] = sorted(by_id.values(), key=_order)
    return out


def attributes(jobs: list[SlurmJob], max_jobs: int = MAX_JOBS) -> dict[str, str]:
    """The job attributes of one GPU: the first ``max_jobs`` jobs' names, users and partitions, comma-joined."""
    jobs = sorted(jobs, key=_order)[:max_jobs]

    def join(values: Iterable[str]) -> str:
        return ",".join(dict.fromkeys(v for v in values if v))

    attrs = {
        ATTR_JOB: join(slurm_job_name(j.id) for j in jobs),
        ATTR_JOB_USER: join(j.user for j in jobs),
        ATTR_JOB_PARTITION: join(j.partition for j in jobs),
    }
    return {k: v for k, v in attrs.items() if v}


def default_key(gpu: GpuIdentity) -> GpuKey:
    """A GPU's key: (its index, None); a MIG device's (its parent GPU's index, its GPU instance id)."""
    return (gpu.parent, gpu.gpu_instance or None) if gpu.parent else (gpu.index, None)


class SlurmAttribution:
    """GPU -> the Slurm jobs on it, from mapping directories and process environments, refreshed every ``refresh_s``."""

    def __init__(
        self,
        *,
        mapping_dir: Path | None = None,
        amd_dir: Path | None = None,
        from_environment: bool = False,
        proc_root: Path = Path("/proc"),
        dev_root: Path = Path("/dev"),
        refresh_s: float = 10.0,
        max_jobs: int = MAX_JOBS,
        key: Callable[[GpuIdentity], GpuKey] = default_key,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.mapping_dir = mapping_dir
        self.amd_dir = amd_dir
        self.from_environment = from_environment
        self.proc_root = proc_root
        self.dev_root = dev_root
        self.refresh_s = refresh_s
        self.max_jobs = max_jobs
        self.key = key
        self._clock = clock
        self._next = -1e18
        self._jobs: dict[GpuKey, list[SlurmJob]] = {}
        self._missing: set[Path] = set()
        self.refreshes = 0

    @property
    def enabled(self) -> bool:
        """True when any way of attributing is configured."""
        return self.mapping_dir is not None or self.amd_dir is not None or self.from_environment

    def _dir(
        self, directory: Path | None, read: Callable[[Path], dict[GpuKey, list[SlurmJob]]]
    ) -> dict[GpuKey, list[SlurmJob]]:
        if directory is None:
            return {}
        if not directory.is_dir():
            if directory not in self._missing:
                log.info("no Slurm job mapping directory at %s (yet): no jobs from it", os.fspath(directory))
            self._missing.add(directory)
            return {}
        self._missing.discard(directory)
        return read(directory)

    def refresh(self) -> None:
        """Read the mapping directories and scan the processes now."""
        self._next = self._clock() + self.refresh_s
        env = environment_jobs(self.proc_root, self.dev_root) if self.from_environment else {}
        self._jobs = merge(self._dir(self.mapping_dir, read_dcgm_dir), self._dir(self.amd_dir, read_amd_dir), env)
        self.refreshes += 1

    def jobs(self, index: str, instance: str | None = None) -> list[SlurmJob]:
        """The jobs on GPU ``index`` (or its GPU instance ``instance``), as of the latest refresh."""
        return list(self._jobs.get((index, instance), []))

    def lookup(self, gpus: Iterable[GpuIdentity]) -> dict[str, dict[str, str]]:
        """GPU index -> job attributes, for the GPUs that run a job (refreshing when due)."""
        if not self.enabled:
            return {}
        if self._clock() >= self._next:
            self.refresh()
        out = {}
        for g in gpus:
            jobs = self._jobs.get(self.key(g))
            if jobs:
                out[g.index] = attributes(jobs, self.max_jobs)
        return out
