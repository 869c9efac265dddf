"""The processes of ``nvidia-smi -q -x`` (each ``<gpu>``'s ``<processes>``) and ``nvidia-smi pmon``'s utilisation.

The XML lists each process with ``pid``, ``type`` (``C`` compute, ``G`` graphics, ``C+G``, ``M``
an MPS server, ``M+C``), ``process_name`` and ``used_memory`` (``1005 MiB``; ``N/A`` on Windows and
under WDDM), and on a GPU in MIG mode its ``gpu_instance_id`` and ``compute_instance_id``: such a
process runs on the MIG device ``<gpu>/<gi>/<ci>`` (docs/shared-gpus.md), whose identity is the one
the ``smi`` source's XML reader gives it. ``pmon`` prints one line per process and GPU with its SM,
memory, encoder and decoder shares (``-`` when the process had none in the sample); its ``gpu``
column is the GPU's index.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any, Final

from aaco.agent.sources.smi.nvidia_smi import parse_nvidia_smi
from aaco.agent.sources.smi.values import Fields, TelemetryFormatError, missing
from aaco.contract.gpu_processes import GpuProcess, ProcessSnapshot
from aaco.contract.telemetry import GpuIdentity

FORMAT: Final = "nvidia-smi"
TYPES: Final = {"c": "compute", "g": "graphics", "c+g": "compute+graphics", "m": "mps", "m+c": "mps"}


def process_type(code: str) -> str:
    """``C``, ``G``, ``C+G``, ``M`` (nvidia-smi's and NVML's letters) -> compute, graphics, ..., other."""
    return TYPES.get(code.strip().lower(), "other")


def parse_processes(text: str | bytes, subject: str) -> ProcessSnapshot:
    """Every process of every GPU (and MIG device) in an ``nvidia-smi -q -x`` document."""
    devices = {s.gpu.index: s.gpu for s in parse_nvidia_smi(text, subject).gpus}
    root = ET.fromstring(text)  # parse_nvidia_smi refused anything that is not nvidia-smi XML
    f = Fields(subject)
    snap = ProcessSnapshot(FORMAT)
    for i, gpu in enumerate(root.findall("gpu")):
        for j, el in enumerate(gpu.findall("processes/process_info")):
            path = f"gpu[{i}]/processes/process_info[{j}]"
            pid = f.num(_text(el, "pid"), f"{path}/pid")
            if pid is None or pid != int(pid) or pid <= 0:
                if pid is not None:
                    f.problem(f"{path}/pid", f"not a process id: {pid:g}")
                continue
            gi, ci = _text(el, "gpu_instance_id"), _text(el, "compute_instance_id")
            index = str(i) if missing(gi) or missing(ci) else f"{i}/{gi}/{ci}"
            device = devices.get(index) or devices.get(str(i)) or GpuIdentity(str(i), vendor="nvidia")
            memory = _text(el, "used_memory")
            snap.processes.append(
                GpuProcess(
                    device,
                    int(pid),
                    name=_text(el, "process_name"),
                    type=process_type(_text(el, "type")),
                    memory_bytes=None if missing(memory) else f.with_unit(memory, f"{path}/used_memory", "by", "MiB"),
                )
            )
    snap.problems = f.problems
    return snap


_PMON_HEADER = re.compile(r"^#\s*gpu\s+pid\s+type\s", re.IGNORECASE)


def parse_pmon(text: str | bytes, subject: str) -> ProcessSnapshot:
    """``nvidia-smi pmon -s u`` (or ``-s um``) output: each process's SM and memory shares, and its memory.

    Several samples of one process (``-c N``, or a streamed capture) are averaged. A ``-`` in a
    listed process's ``sm`` or ``mem`` column is a share of 0 (the driver had no utilisation sample of
    that process: it did not run on the SMs); rows without a pid (``-``: no process on that GPU) are
    skipped. ``fb`` (``-s m``) is the process's device memory in MiB, the latest sample's.
    """
    raw = text.decode(errors="replace") if isinstance(text, bytes) else text
    lines = raw.splitlines()
    header = next((ln for ln in lines if _PMON_HEADER.match(ln)), None)
    if header is None:
        raise TelemetryFormatError("not nvidia-smi pmon output: no '# gpu pid type' header line", subject=subject)
    columns = header.lstrip("#").split()
    at = {name: columns.index(name) for name in ("gpu", "pid", "type", "sm", "mem", "fb", "command") if name in columns}
    if not {"sm", "mem"} <= set(at):
        raise TelemetryFormatError(
            "nvidia-smi pmon output without its sm and mem columns (run it with -s u)", subject=subject
        )
    f = Fields(subject)
    seen: dict[tuple[str, int], list[Any]] = {}  # (gpu, pid) -> [sm sum, mem sum, samples, type, fb, name]
    for n, line in enumerate(lines):
        cells = line.split()
        if line.startswith("#") or len(cells) < at["mem"] + 1 or not cells[at["pid"]].isdigit():
            continue
        acc = seen.setdefault((cells[at["gpu"]], int(cells[at["pid"]])), [0.0, 0.0, 0, "compute", None, ""])
        for k, name in enumerate(("sm", "mem")):
            cell = cells[at[name]]
            share = 0.0 if cell == "-" else f.num(cell, f"line {n + 1}/{name}")
            acc[k] += (share or 0.0) / 100.0
        acc[2] += 1
        acc[3] = process_type(cells[at["type"]]) if "type" in at else "compute"
        if "fb" in at and len(cells) > at["fb"] and cells[at["fb"]] != "-":
            acc[4] = f.with_unit(cells[at["fb"]], f"line {n + 1}/fb", "by", "MiB")
        if "command" in at and len(cells) > at["command"]:
            acc[5] = " ".join(cells[at["command"] :])
    snap = ProcessSnapshot("nvidia-smi pmon")
    for (gpu, pid), (sm, mem, count, kind, fb, name) in seen.items():
        snap.processes.append(
            GpuProcess(
                GpuIdentity(gpu, vendor="nvidia"),
                pid,
                name=name,
                type=kind,
                utilization=sm / count,
                memory_utilization=mem / count,
                memory_bytes=fb,
            )
        )
    snap.problems = f.problems
    return snap


def _text(el: ET.Element, tag: str) -> str:
    found = el.find(tag)
    return (found.text or "").strip() if found is not None else ""
