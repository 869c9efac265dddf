"""Which processes the ``sched`` source traces: GPU processes, configured pids and cgroups, itself.

- GPU processes: any process with an open file descriptor on ``/dev/kfd`` (ROCm),
  ``/dev/dri/renderD*`` (DRM render nodes) or ``/dev/nvidia*`` (CUDA), found through the
  ``/proc/<pid>/fd`` links (reading another user's needs root; unreadable ones are skipped).
- configured pids (a thread id stands for its process);
- cgroup v2 directories, e.g. a pod's ``/sys/fs/cgroup/kubepods.slice/.../pod<uid>``: every
  process in ``cgroup.procs`` of the directory and its descendants (a relative path is taken under
  ``/sys/fs/cgroup``);
- the agent's own process, when asked (the demo's ONNX Runtime workload runs inside it).

Everything is bounded: at most ``max_processes`` targets (the lowest pids win; the rest are
counted), at most ``MAX_CGROUP_DIRS`` cgroup directories walked, at most ``MAX_FDS`` links read
per process.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

from aaco.agent.sources.sched.proc import alive

GPU_DEVICE_PATTERNS = ("/dev/kfd", "/dev/dri/renderD*", "/dev/nvidia*")
CGROUP_ROOT = Path("/sys/fs/cgroup")
MAX_CGROUP_DIRS = 4096
MAX_FDS = 65536


def holds_gpu(pid: int, proc: Path = Path("/proc")) -> bool:
    """True if process ``pid`` has a GPU device open (False when its fds cannot be read)."""
    fd_dir = proc / str(pid) / "fd"
    try:
        with os.scandir(fd_dir) as it:
            for i, entry in enumerate(it):
                if i >= MAX_FDS:
                    break
                try:
                    target = os.readlink(entry.path)
                except OSError:
                    continue
                if target.startswith("/dev/") and any(fnmatch.fnmatchcase(target, p) for p in GPU_DEVICE_PATTERNS):
                    return True
    except OSError:
        return False
    return False


def gpu_processes(proc: Path = Path("/proc")) -> set[int]:
    """Every process with a GPU device open."""
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return set()
    return {pid for pid in pids if holds_gpu(pid, proc)}


def tgid_of(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The process (tgid) of a pid or thread id, or None when it does not exist."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def cgroup_processes(path: Path) -> set[int] | None:
    """Processes in a cgroup v2 directory and its descendants, or None when it does not exist."""
    root = path if path.is_absolute() else CGROUP_ROOT / path
    if not (root / "cgroup.procs").is_file():
        return None
    out: set[int] = set()
    walked = 0
    for dirpath, _dirs, files in os.walk(root):
        walked += 1
        if walked > MAX_CGROUP_DIRS:
            break
        if "cgroup.procs" in files:
            try:
                out.update(int(x) for x in Path(dirpath, "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
    return out


@dataclass
class Resolution:
    """One resolution of the targets: the tgids, and what could not be found."""

    tgids: set[int] = field(default_factory=set)
    missing_pids: list[int] = field(default_factory=list)
    missing_cgroups: list[Path] = field(default_factory=list)
    over_cap: int = 0
    gpu: int = 0


@dataclass
class TargetResolver:
    """Resolves the configured targets to tgids, on demand (the source calls it every few seconds)."""

    pids: list[int] = field(default_factory=list)
    cgroups: list[Path] = field(default_factory=list)
    gpu: bool = True
    include_self: bool = False
    max_processes: int = 1024
    proc: Path = Path("/proc")

    def resolve(self) -> Resolution:
        """The current targets."""
        res = Resolution()
        found: set[int] = set()
        for pid in self.pids:
            tgid = tgid_of(pid, self.proc)
            if tgid is None or not alive(tgid, self.proc):
                res.missing_pids.append(pid)
            else:
                found.add(tgid)
        for cg in self.cgroups:
            procs = cgroup_processes(cg)
            if procs is None:
                res.missing_cgroups.append(cg)
            else:
                found |= procs
        if self.gpu:
            gpu = gpu_processes(self.proc)
            res.gpu = len(gpu)
            found |= gpu
        if self.include_self:
            found.add(os.getpid())
        ordered = sorted(found)
        res.tgids = set(ordered[: self.max_processes])
        res.over_cap = max(0, len(ordered) - self.max_processes)
        return res
