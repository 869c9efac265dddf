"""Which distributed job a traced process belongs to (docs/jobs.md, "Job identity"), as the sources see it.

- **The process environment** (``process_job``, ``environ_job``): ``/proc/<pid>/environ`` of the
  captured process (``capture``) or of the process a spooled trace names, if it still runs here
  (``trace_dir``): ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` (torchrun, torch.distributed.launch,
  Kubeflow's PyTorchJob, DeepSpeed and Accelerate set them), else ``GROUP_RANK`` x
  ``LOCAL_WORLD_SIZE`` + ``LOCAL_RANK``, else Slurm's ``SLURM_PROCID``, ``SLURM_NTASKS``,
  ``SLURM_LOCALID``; the job from ``TORCHELASTIC_RUN_ID`` (unless torchrun's default ``none``),
  else ``slurm-<SLURM_JOB_ID>``, else ``MASTER_ADDR:MASTER_PORT``. The file is read up to
  ``ENVIRON_BYTES``; a process that is gone or not readable gives nothing. A spooled trace may be
  days old and its pid reused since: its process is only believed when it started before the
  trace's first profiled step (``started_before_ns``, from ``/proc/<pid>/stat`` and the boot time).
- **The pod's owner** (Kubeflow's ``training.kubeflow.org/job-name``, JobSet's, a batch Job's)
  is a label of the pod: only the API server has the labels (the kubelet's pod-resources API,
  which ``smi/pods`` reads, gives the pod's name, namespace and containers only), and the agent
  does not talk to the API server, so this layer is not filled.
- **A job with no name** (``JobRegistry``): a source names the job of a rank trace that says only
  its backend and world size by ``contract.jobs``' rule, file by file as they arrive: a trace
  whose profiled span overlaps a recent job of the same backend and world size joins it (and
  widens it); another starts a new job named from its own first step. At most ``max_jobs`` recent
  jobs are remembered (the oldest ending first forgotten). A replay knows all its files at once
  and ``preset``s the names ``derive_jobs`` gives them together (``job_scan``), so it names a job
  from its earliest rank whatever the order of its files.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path

from aaco.contract.jobs import MIN_WORLD, JobFields, derived_name

ENVIRON_BYTES = 1 << 20  # of /proc/<pid>/environ
JOB_FILE = ".aaco-job"  # in a capture window's directory: the captured process's job (hidden: never a trace)
MAX_JOB_CHARS = 256
_MAX_INT = 1 << 31
_SLACK_NS = 2_000_000_000  # the boot time is whole seconds, the start time clock ticks


def _int(env: dict[str, str], key: str) -> int | None:
    v = env.get(key, "").strip()
    return int(v) if v.isascii() and v.isdigit() and int(v) < _MAX_INT else None


def _name(value: str | None) -> str | None:
    text = "".join(ch for ch in (value or "") if ch.isprintable()).strip()[:MAX_JOB_CHARS]
    return text or None


def environ_job(env: dict[str, str]) -> JobFields:
    """The job fields a process environment gives (see the module doc); empty when it gives none."""
    rank, world, local = _int(env, "RANK"), _int(env, "WORLD_SIZE"), _int(env, "LOCAL_RANK")
    group, local_world = _int(env, "GROUP_RANK"), _int(env, "LOCAL_WORLD_SIZE")
    if rank is None and None not in (group, local_world, local):
        rank = group * local_world + local  # type: ignore[operator]
    rank = rank if rank is not None else _int(env, "SLURM_PROCID")
    world = world if world is not None else _int(env, "SLURM_NTASKS")
    local = local if local is not None else _int(env, "SLURM_LOCALID")
    run_id = _name(env.get("TORCHELASTIC_RUN_ID"))
    slurm = _name(env.get("SLURM_JOB_ID"))
    master = _name(env.get("MASTER_ADDR")), _name(env.get("MASTER_PORT"))
    if run_id is not None and run_id != "none":
        job: str | None = run_id
    elif slurm is not None:
        job = f"slurm-{slurm}"
    elif None not in master:
        job = f"{master[0]}:{master[1]}"
    else:
        job = None
    if rank is not None and world is not None and rank >= world:
        rank = None
    return JobFields(job=job, rank=rank, world_size=world or None, local_rank=local)


def read_environ(pid: int, proc: Path = Path("/proc")) -> dict[str, str] | None:
    """A process's environment (the first ``ENVIRON_BYTES``), None if it is gone or not readable."""
    try:
        with open(proc / str(pid) / "environ", "rb") as fh:
            raw = fh.read(ENVIRON_BYTES)
    except OSError:
        return None
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq and key:
            env.setdefault(key.decode(errors="replace"), value.decode(errors="replace"))
    return env


def process_start_ns(pid: int, proc: Path = Path("/proc")) -> int | None:
    """When a process started, epoch ns (``/proc/<pid>/stat`` field 22 and ``btime``); None if unknown."""
    boot = _boot_s(proc)
    try:
        stat = (proc / str(pid) / "stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        return None
    return None if boot is None else boot * 1_000_000_000 + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@functools.lru_cache(maxsize=8)
def _boot_s(proc: Path) -> int | None:
    """The boot time (``btime`` of ``/proc/stat``), read once per proc root: it does not change while the host runs."""
    try:
        lines = (proc / "stat").read_text().splitlines()
        return next(int(line.split()[1]) for line in lines if line.startswith("btime"))
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def process_job(pid: int, *, started_before_ns: int | None = None, proc: Path = Path("/proc")) -> JobFields | None:
    """The job fields of a running process's environment; None if unreadable, empty or not the trace's process.

    ``started_before_ns``: the process must have started before then (a spooled trace's first
    step), else its pid was reused and it is not the process that wrote the trace.
    """
    if pid <= 0:
        return None
    if started_before_ns is not None:
        started = process_start_ns(pid, proc)
        if started is None or started > started_before_ns + _SLACK_NS:
            return None
    env = read_environ(pid, proc)
    fields = environ_job(env) if env is not None else None
    return fields if fields is not None and fields.known() else None


def save_job(directory: Path, fields: JobFields | None) -> None:
    """Keep a captured process's job fields in its window's directory (``JOB_FILE``), read back by ``saved_job``."""
    if fields is not None and fields.known():
        (directory / JOB_FILE).write_text(json.dumps(fields.columns()) + "\n")


def saved_job(directory: Path) -> JobFields | None:
    """The job fields ``save_job`` kept, None if there are none or they cannot be read."""
    try:
        doc = json.loads((directory / JOB_FILE).read_text()[: 4 * MAX_JOB_CHARS])
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict):
        return None
    ints = {k: doc.get(k) for k in ("rank", "world_size", "local_rank")}
    ints = {k: v if type(v) is int and 0 <= v < _MAX_INT else None for k, v in ints.items()}
    job = doc.get("job")
    return JobFields(job=_name(job) if isinstance(job, str) else None, **ints)  # type: ignore[arg-type]


@dataclass
class _Job:
    name: str
    backend: str
    world_size: int
    start_ns: int
    end_ns: int


class JobRegistry:
    """The recent jobs a source named from their ranks (see the module doc); thread-safe."""

    def __init__(self, max_jobs: int = 256) -> None:
        self.max_jobs = max_jobs
        self._jobs: list[_Job] = []
        self._preset: dict[str, str] = {}
        self._lock = threading.Lock()

    def preset(self, names: dict[str, str]) -> None:
        """Names decided beforehand (a replay's ``derive_jobs`` over all its files), by the trace's identity."""
        with self._lock:
            self._preset.update(names)

    def name(self, key: str, backend: str, world_size: int, start_ns: int, end_ns: int) -> str | None:
        """The job of the rank trace ``key`` profiled over [start_ns, end_ns]; None for a world of one."""
        if world_size < MIN_WORLD or not backend:
            return None
        backend = backend.lower()
        with self._lock:
            if key in self._preset:
                return self._preset[key]
            joined = [
                j
                for j in self._jobs
                if (j.backend, j.world_size) == (backend, world_size) and j.start_ns <= end_ns and start_ns <= j.end_ns
            ]
            if joined:
                job = min(joined, key=lambda j: j.start_ns)
                job.start_ns, job.end_ns = min(job.start_ns, start_ns), max(job.end_ns, end_ns)
                return job.name
            job = _Job(derived_name(backend, world_size, start_ns), backend, world_size, start_ns, end_ns)
            self._jobs.append(job)
            if len(self._jobs) > self.max_jobs:
                self._jobs.remove(min(self._jobs, key=lambda j: j.end_ns))
            return job.name
