"""The processes on each NVIDIA GPU through NVML, with what the driver measured per process.

Processes: ``nvmlDeviceGetComputeRunningProcesses``, ``...GraphicsRunningProcesses`` and
``...MPSComputeRunningProcesses`` (a process in several lists is one, of the combined type), each with
its ``usedGpuMemory`` (bytes; None where the driver does not say, as under WDDM) and, on a GPU in MIG
mode, its ``gpuInstanceId`` and ``computeInstanceId``: the process runs on the MIG device
``<gpu>/<gi>/<ci>`` (``nvml_mig``'s identity). Utilisation: ``nvmlDeviceGetProcessUtilization``
since the previous read (its ``lastSeenTimeStamp``), the driver's samples of each process's SM and
memory-controller shares averaged over the interval (``NOT_FOUND``: no process used the GPU since;
``NOT_SUPPORTED``: a MIG GPU or an old board, memory only). The module is passed in (tests use a
fake with nvidia-ml-py's API shape).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from aaco.agent.sources.smi.nvml_errors import NVML_ERROR_GPU_IS_LOST, NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED
from aaco.agent.sources.smi.nvml_mig import read_mig
from aaco.agent.sources.smi.values import Fields
from aaco.contract.gpu_processes import GpuProcess, ProcessSnapshot
from aaco.contract.telemetry import GpuIdentity, normalize_pci

FORMAT: Final = "nvml"
NO_INSTANCE: Final = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process not on a MIG device
MAX_PROCESSES: Final = 1024  # per GPU and sample: a bound against a driver's odd answer
_LISTS: Final = (
    ("nvmlDeviceGetComputeRunningProcesses", "compute"),
    ("nvmlDeviceGetGraphicsRunningProcesses", "graphics"),
    ("nvmlDeviceGetMPSComputeRunningProcesses", "mps"),
)


class _SkipError(Exception):
    """A query the GPU does not answer (not supported, nothing found): no value, no problem."""


class NvmlProcessReader:
    """Reads every GPU's processes and their utilisation."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        nvml.nvmlInit()
        self._open = True
        self._last_seen: dict[str, int] = {}  # GPU UUID -> newest utilisation sample's timestamp (us)

    def close(self) -> None:
        """Shut NVML down (once)."""
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()

    def _call(self, f: Fields, where: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self.nvml.NVMLError as exc:
            code = getattr(exc, "value", None)
            if code in (NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_NOT_FOUND):
                raise _SkipError from exc
            if code != NVML_ERROR_GPU_IS_LOST:  # a lost GPU: the smi source reports it; no processes here
                f.problem(where, f"{getattr(fn, '__name__', 'nvml')}: {exc}")
            raise _SkipError from exc

    def _q(self, f: Fields, where: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return self._call(f, where, fn, *args)
        except _SkipError:
            return None

    def sample(self) -> ProcessSnapshot:
        """Every GPU's processes now, with their utilisation since the previous sample."""
        n = self.nvml
        f = Fields("nvml")
        snap = ProcessSnapshot(FORMAT)
        for i in range(n.nvmlDeviceGetCount()):
            where = f"gpu[{i}]"
            h = self._q(f, where, n.nvmlDeviceGetHandleByIndex, i)
            if h is not None:
                snap.processes += self._gpu(f, where, i, h)
        snap.problems = f.problems
        return snap

    def _gpu(self, f: Fields, where: str, i: int, h: Any) -> list[GpuProcess]:
        n = self.nvml
        q = functools.partial(self._q, f, where)
        pci = q(n.nvmlDeviceGetPciInfo, h)
        gpu = GpuIdentity(
            str(i),
            uuid=_text(q(n.nvmlDeviceGetUUID, h) or ""),
            pci_bus=normalize_pci(_text(getattr(pci, "busId", "") or "")) if pci is not None else "",
            model=_text(q(n.nvmlDeviceGetName, h) or ""),
            vendor="nvidia",
        )
        migs = {(m.gpu.gpu_instance, m.gpu.compute_instance): m.gpu for m in read_mig(n, f, where, q, gpu, h)}
        found: dict[tuple[str, int], list[Any]] = {}  # (device index, pid) -> [device, types, memory]
        for fn_name, kind in _LISTS:
            fn = getattr(n, fn_name, None)
            listed = q(fn, h) if fn is not None else None
            for p in (listed or [])[:MAX_PROCESSES]:
                gi, ci = getattr(p, "gpuInstanceId", NO_INSTANCE), getattr(p, "computeInstanceId", NO_INSTANCE)
                device = gpu
                if gi is not None and gi != NO_INSTANCE and ci is not None and ci != NO_INSTANCE:
                    device = migs.get((str(int(gi)), str(int(ci)))) or gpu
                entry = found.setdefault((device.index, int(p.pid)), [device, [], None])
                entry[1].append(kind)
                used = getattr(p, "usedGpuMemory", None)
                if used is not None:
                    entry[2] = float(used)
        util = self._utilization(f, where, gpu, h) if not migs else {}
        out = []
        for (_index, pid), (device, kinds, memory) in found.items():
            sm, mem = util.pop(pid, (None, None))
            out.append(
                GpuProcess(device, pid, type=_kind(kinds), utilization=sm, memory_utilization=mem, memory_bytes=memory)
            )
        for pid, (sm, mem) in util.items():  # measured but already gone from the lists: its share still counts
            out.append(GpuProcess(gpu, pid, utilization=sm, memory_utilization=mem))
        return out

    def _utilization(self, f: Fields, where: str, gpu: GpuIdentity, h: Any) -> dict[int, tuple[float, float]]:
        """Per pid: (SM share, memory share), 0..1, averaged over the driver's samples since the last read."""
        key = gpu.uuid or where
        first = key not in self._last_seen
        try:
            samples = self._call(f, where, self.nvml.nvmlDeviceGetProcessUtilization, h, self._last_seen.get(key, 0))
        except _SkipError:
            return {}
        sums: dict[int, list[float]] = {}
        newest = self._last_seen.get(key, 0)
        for s in samples or []:
            acc = sums.setdefault(int(s.pid), [0.0, 0.0, 0])
            acc[0] += float(s.smUtil)
            acc[1] += float(s.memUtil)
            acc[2] += 1
            newest = max(newest, int(s.timeStamp))
        self._last_seen[key] = newest
        if first:
            return {}  # the driver's whole buffer, older than the interval: the next read starts here
        return {pid: (sm / n / 100.0, mem / n / 100.0) for pid, (sm, mem, n) in sums.items()}


def _kind(kinds: list[str]) -> str:
    if "mps" in kinds:
        return "mps"
    return "compute+graphics" if {"compute", "graphics"} <= set(kinds) else kinds[0]


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)
