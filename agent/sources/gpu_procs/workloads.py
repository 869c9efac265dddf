"""Which workload a GPU process belongs to: its container and pod through its cgroup, its Slurm job.

A process's ``/proc/<pid>/cgroup`` names its container's cgroup, with the pod's UID and the
container's ID in it whatever the cgroup driver and runtime:

- cgroupfs driver: ``/kubepods/burstable/pod<uid>/<container id>`` (``/kubepods/pod<uid>/...`` for
  Guaranteed pods);
- systemd driver: ``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice/
  cri-containerd-<id>.scope`` (``crio-<id>.scope``, ``docker-<id>.scope``).

The kubelet names the pod and container in its log directories (the CRI logging layout):
``/var/log/containers/<pod>_<namespace>_<container>-<container id>.log`` and
``/var/log/pods/<namespace>_<pod>_<uid>/<container>/``; neither names can hold ``_`` (DNS labels and
subdomains), so both parse unambiguously. A container ID found in the first gives pod, namespace
and container; else the pod UID found in the second gives pod and namespace, and the container
when the pod has one container directory, or when exactly one of its containers was given the
process's device (the pod-resources API's answer, ``holders``). The directories are listed every
``refresh_s``. ``SLURM_JOB_ID``, ``SLURM_JOB_USER`` (else ``USER``) and ``SLURM_JOB_PARTITION`` in the
process's environment name its Slurm job. Answers are cached per pid and start time (a reused pid
is a new process), at most ``MAX_CACHED``.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Final

from aaco.agent.sources.jobs import process_start_ns, read_environ
from aaco.agent.sources.smi.pods import Owner
from aaco.agent.sources.smi.slurm import SlurmJob, environment_job
from aaco.contract.gpu_processes import Workload
from aaco.contract.telemetry import GpuIdentity

MAX_CACHED: Final = 4096
MAX_LOG_ENTRIES: Final = 16384  # directory entries read per listing
CGROUP_BYTES: Final = 16 * 1024
_UID = r"([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
_POD_UID = re.compile(r"pod" + _UID + r"(?:\.slice)?(?:/|$)")
_CONTAINER_ID = re.compile(r"(?:^|/)(?:(?:cri-containerd|crio|docker|containerd|cri-o)-)?([0-9a-f]{64})(?:\.scope)?$")
_CONTAINER_LOG = re.compile(r"^([^_]+)_([^_]+)_(.+)-([0-9a-f]{64})\.log$")
_POD_LOG = re.compile(r"^([^_]+)_([^_]+)_" + _UID + r"$")


def cgroup_ids(text: str) -> tuple[str, str]:
    """(pod UID, container ID) named by a ``/proc/<pid>/cgroup`` document ("" for what it does not name)."""
    pod_uid = container_id = ""
    for line in text.splitlines():
        path = line.split(":", 2)[-1].strip()
        if not pod_uid and (m := _POD_UID.search(path)):
            pod_uid = m.group(1).replace("_", "-")
        if not container_id and (m := _CONTAINER_ID.search(path)):
            container_id = m.group(1)
    return pod_uid, container_id


class KubeletLogs:
    """Container ID -> (pod, namespace, container) and pod UID -> (pod, namespace, containers), from the log dirs."""

    def __init__(self, root: Path, refresh_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.root = root
        self.refresh_s = refresh_s
        self._clock = clock
        self._next = -1e18
        self.containers: dict[str, tuple[str, str, str]] = {}
        self.pods: dict[str, tuple[str, str, tuple[str, ...]]] = {}

    def refresh(self, force: bool = False) -> None:
        """List the directories again when due (or now)."""
        now = self._clock()
        if not force and now < self._next:
            return
        self._next = now + self.refresh_s
        self.containers = {}
        for name in _listing(self.root / "containers"):
            if m := _CONTAINER_LOG.match(name):
                self.containers[m.group(4)] = (m.group(1), m.group(2), m.group(3))
        self.pods = {}
        for name in _listing(self.root / "pods"):
            if m := _POD_LOG.match(name):
                inside = tuple(sorted(_listing(self.root / "pods" / name)))
                self.pods[m.group(3).replace("_", "-")] = (m.group(2), m.group(1), inside)


def _listing(directory: Path) -> list[str]:
    try:
        with os.scandir(directory) as it:
            out = []
            for entry in it:
                out.append(entry.name)
                if len(out) >= MAX_LOG_ENTRIES:
                    break
            return out
    except OSError:
        return []


class WorkloadResolver:
    """pid (on a device) -> its ``Workload``."""

    def __init__(
        self,
        proc_root: Path = Path("/proc"),
        logs: KubeletLogs | None = None,
        holders: Callable[[GpuIdentity], list[Owner]] | None = None,
    ) -> None:
        self.proc_root = proc_root
        self.logs = logs
        self.holders = holders or (lambda _device: [])
        self._cache: OrderedDict[tuple[int, int | None], Workload] = OrderedDict()

    def refresh(self) -> None:
        """Let the kubelet's log directories be listed again when due."""
        if self.logs is not None:
            self.logs.refresh()

    def resolve(self, pid: int, device: GpuIdentity) -> Workload:
        """The process's workload (an empty one for a process that is gone or belongs to none)."""
        key = (pid, process_start_ns(pid, self.proc_root))
        found = self._cache.get(key)
        if found is None:
            found = self._read(pid)
            self._cache[key] = found
            while len(self._cache) > MAX_CACHED:
                self._cache.popitem(last=False)
        if found.pod and not found.container:  # which of the pod's containers holds this device
            named = {o.container for o in self.holders(device) if (o.pod, o.namespace) == (found.pod, found.namespace)}
            if len(named) == 1:
                return Workload(**{**_fields(found), "container": named.pop()})
        return found

    def _read(self, pid: int) -> Workload:
        try:
            with open(self.proc_root / str(pid) / "cgroup", encoding="utf-8", errors="replace") as fh:
                pod_uid, container_id = cgroup_ids(fh.read(CGROUP_BYTES))
        except OSError:
            pod_uid = container_id = ""
        pod = namespace = container = ""
        if self.logs is not None and (pod_uid or container_id):
            if container_id in self.logs.containers:
                pod, namespace, container = self.logs.containers[container_id]
            elif pod_uid in self.logs.pods:
                pod, namespace, inside = self.logs.pods[pod_uid]
                container = inside[0] if len(inside) == 1 else ""
        job = environment_job(read_environ(pid, self.proc_root) or {}) or SlurmJob("")
        return Workload(pod, namespace, container, pod_uid, container_id, job.id, job.user, job.partition)


def _fields(w: Workload) -> dict[str, str]:
    return {name: getattr(w, name) for name in Workload.__slots__}
