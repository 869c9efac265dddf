"""The processes on each AMD GPU: ``amd-smi process --json`` and the AMD SMI library's process list.

Two JSON shapes are read. ROCm 6.2's (amdsmi's CHANGELOG): a list of ``{"gpu": N, "process_list":
[{"process_info": {"name", "pid", "mem_usage", "memory_usage": {"gtt_mem", "cpu_mem", "vram_mem"},
"usage": {"gfx", "enc"}}}]}`` (``process_info`` is a sentence when no process runs); and the one keyed
by process (ROCm 7): a list of ``{"pid", "name", "gpus": [{"gpu_index", "mem", "engine_usage":
{"gfx", "enc"}, "memory_usage": {...}, "cu_occupancy"}]}``. Values are ``{"value", "unit"}`` or plain
numbers (bytes, nanoseconds). The library's ``amdsmi_get_gpu_process_list(handle)`` gives the second
form's per-GPU fields as plain numbers (older libraries: handles for ``amdsmi_get_gpu_process_info``).

A process's device memory is its ``vram_mem`` (else ``mem``). Its GFX share is not a reading of the
driver but the growth of its GFX engine time (``gfx``, ns, counted since it opened the GPU) over the
wall time between two samples (``EngineRates``), so a process's first sample has none.
"""

from __future__ import annotations

import contextlib
import time
from collections import OrderedDict
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from aaco.agent.sources.smi.values import Fields, TelemetryFormatError, missing
from aaco.contract.gpu_processes import GpuProcess, ProcessSnapshot
from aaco.contract.telemetry import GpuIdentity, normalize_pci

FORMAT: Final = "amd-smi"
MAX_TRACKED: Final = 4096  # (GPU, pid) engine counters remembered


class EngineRates:
    """GFX engine time per (GPU, pid) between samples -> the share of wall time it was busy, 0..1."""

    def __init__(self, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._clock = clock
        self._last: OrderedDict[tuple[str, int], tuple[int, float]] = OrderedDict()

    def share(self, gpu: str, pid: int, busy_ns: float | None, now_ns: int | None = None) -> float | None:
        """The share since this process's previous sample on this GPU (None on its first, or without a count)."""
        if busy_ns is None:
            return None
        now = self._clock() if now_ns is None else now_ns
        before = self._last.pop((gpu, pid), None)
        self._last[(gpu, pid)] = (now, busy_ns)
        while len(self._last) > MAX_TRACKED:
            self._last.popitem(last=False)
        if before is None or now <= before[0] or busy_ns < before[1]:
            return None
        return min(1.0, (busy_ns - before[1]) / (now - before[0]))


def parse_processes(doc: Any, subject: str, rates: EngineRates | None = None) -> ProcessSnapshot:
    """Every GPU's processes in an ``amd-smi process --json`` document (either shape)."""
    if isinstance(doc, dict):
        doc = doc.get("process_data", doc.get("gpu_data", [doc]))
    if not isinstance(doc, list):
        raise TelemetryFormatError("not amd-smi process JSON: expected a list", subject=subject)
    f = Fields(subject)
    snap = ProcessSnapshot(FORMAT)
    for i, item in enumerate(doc):
        if not isinstance(item, dict):
            f.problem(f"[{i}]", "not an object")
        elif "process_list" in item:
            gpu = GpuIdentity(str(item.get("gpu", i)), vendor="amd")
            for j, entry in enumerate(item.get("process_list") or []):
                info = entry.get("process_info") if isinstance(entry, dict) else None
                if isinstance(info, dict):  # else a sentence: "No running processes detected"
                    p = _process(f, f"[{i}]/process_list[{j}]/process_info", gpu, info, info, rates)
                    if p is not None:
                        snap.processes.append(p)
        elif "gpus" in item:
            for j, per_gpu in enumerate(item.get("gpus") or []):
                if isinstance(per_gpu, dict):
                    gpu = GpuIdentity(str(per_gpu.get("gpu_index", j)), vendor="amd")
                    p = _process(f, f"[{i}]/gpus[{j}]", gpu, item, per_gpu, rates)
                    if p is not None:
                        snap.processes.append(p)
        else:
            f.problem(f"[{i}]", "neither process_list nor gpus: not amd-smi process JSON")
    snap.problems = f.problems
    return snap


def _process(
    f: Fields, path: str, gpu: GpuIdentity, who: dict[str, Any], use: dict[str, Any], rates: EngineRates | None
) -> GpuProcess | None:
    pid = f.num(_value(who.get("pid")), f"{path}/pid")
    if pid is None or pid <= 0 or pid != int(pid):
        return None
    memory = use.get("memory_usage") if isinstance(use.get("memory_usage"), dict) else {}
    vram = memory.get("vram_mem", use.get("mem", use.get("mem_usage")))
    engines = use.get("engine_usage", use.get("usage"))
    gfx = f.num(_value(engines.get("gfx")), f"{path}/engine_usage/gfx") if isinstance(engines, dict) else None
    name = who.get("name")
    return GpuProcess(
        gpu,
        int(pid),
        name="" if missing(name) or not isinstance(name, str) else name,
        utilization=rates.share(gpu.index, int(pid), gfx) if rates is not None else None,
        memory_bytes=None if missing(_value(vram)) else f.with_unit(vram, f"{path}/vram_mem", "by", "B"),
    )


def _value(v: Any) -> Any:
    return v.get("value") if isinstance(v, dict) else v


class AmdSmiProcessReader:
    """Every GPU's processes through the AMD SMI library."""

    def __init__(self, amdsmi: ModuleType) -> None:
        self.lib = amdsmi
        amdsmi.amdsmi_init(amdsmi.AmdSmiInitFlags.INIT_AMD_GPUS)
        self._open = True
        self.rates = EngineRates()

    def close(self) -> None:
        """Shut the library down (once)."""
        if self._open:
            self._open = False
            with contextlib.suppress(Exception):  # shutting down after a driver failure: nothing left to do
                self.lib.amdsmi_shut_down()

    def sample(self) -> ProcessSnapshot:
        """Every GPU's processes now, their GFX share since the previous sample."""
        lib = self.lib
        f = Fields("amdsmi")
        snap = ProcessSnapshot("amdsmi")
        for i, h in enumerate(lib.amdsmi_get_processor_handles()):
            where = f"gpu[{i}]"
            try:
                gpu = GpuIdentity(
                    str(i),
                    uuid=str(lib.amdsmi_get_gpu_device_uuid(h) or ""),
                    pci_bus=normalize_pci(str(lib.amdsmi_get_gpu_device_bdf(h) or "")),
                    vendor="amd",
                )
                listed = lib.amdsmi_get_gpu_process_list(h)
            except lib.AmdSmiLibraryException as exc:
                f.problem(where, f"amdsmi_get_gpu_process_list: {exc}")
                continue
            for j, item in enumerate(listed or []):
                info = item if isinstance(item, dict) else _info(lib, f, f"{where}/process[{j}]", h, item)
                if info is not None:
                    p = _process(f, f"{where}/process[{j}]", gpu, info, info, self.rates)
                    if p is not None:
                        snap.processes.append(p)
        snap.problems = f.problems
        return snap


def _info(lib: ModuleType, f: Fields, path: str, h: Any, process: Any) -> dict[str, Any] | None:
    try:
        info = lib.amdsmi_get_gpu_process_info(h, process)
    except lib.AmdSmiLibraryException as exc:
        f.problem(path, f"amdsmi_get_gpu_process_info: {exc}")
        return None
    return info if isinstance(info, dict) else None
