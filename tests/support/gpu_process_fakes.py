"""A double of nvidia-ml-py's process calls, fed from a recorded ``nvidia-smi pmon`` (not a test module).

``nvidia-smi pmon`` prints what ``nvmlDeviceGetProcessUtilization`` returns, one line per process and
sample; this double serves those recorded samples through NVML's API shape: running processes with
``usedGpuMemory`` (pmon's ``fb``), and per call of ``nvmlDeviceGetProcessUtilization`` the next
recorded sample (its driver timestamp one second after the previous), with ``NOT_FOUND`` when none is
newer than ``lastSeenTimeStamp``. ``pids`` maps recorded pids to others (the live processes of a test).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

NOT_SUPPORTED, NOT_FOUND = 3, 6
NO_INSTANCE = 0xFFFFFFFF


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


def pmon_samples(path: Path) -> list[list[dict[str, Any]]]:
    """The recorded samples of GPU 0: a new sample starts where a pid repeats."""
    samples: list[list[dict[str, Any]]] = [[]]
    for line in path.read_text().splitlines():
        cells = line.split()
        if line.startswith("#") or len(cells) < 8 or not cells[1].isdigit() or cells[0] != "0":
            continue
        row = {
            "pid": int(cells[1]),
            "sm": 0 if cells[3] == "-" else int(cells[3]),
            "mem": 0 if cells[4] == "-" else int(cells[4]),
            "fb_mib": int(cells[7]),
        }
        if any(r["pid"] == row["pid"] for r in samples[-1]):
            samples.append([])
        samples[-1].append(row)
    return samples


def fake_nvml(
    samples: list[list[dict[str, Any]]],
    pids: Mapping[int, int],
    uuid: str = "GPU-c5533cd4-5a60-059e-348d-b6d7466932e4",
) -> types.ModuleType:
    """One GPU (``uuid``) running the recorded processes named in ``pids``, as their new pids."""
    mod = types.ModuleType("pynvml")
    mod.NVMLError = NVMLError
    state = {"released": 0}
    t0_us = 1_700_000_000_000_000

    def util(h: object, last_seen: int) -> list[Any]:
        k = state["released"]
        state["released"] = min(k + 1, len(samples) - 1)
        out = [
            types.SimpleNamespace(
                pid=pids[r["pid"]],
                timeStamp=t0_us + j * 1_000_000,
                smUtil=r["sm"],
                memUtil=r["mem"],
                encUtil=0,
                decUtil=0,
            )
            for j in range(k + 1)
            for r in samples[j]
            if r["pid"] in pids and t0_us + j * 1_000_000 > last_seen
        ]
        if not out:
            raise NVMLError(NOT_FOUND)
        return out

    def running(h: object) -> list[Any]:
        latest = {r["pid"]: r for sample in samples for r in sample}
        return [
            types.SimpleNamespace(
                pid=pids[p], usedGpuMemory=r["fb_mib"] * 2**20, gpuInstanceId=NO_INSTANCE, computeInstanceId=NO_INSTANCE
            )
            for p, r in latest.items()
            if p in pids
        ]

    def unsupported(*_a: object) -> None:
        raise NVMLError(NOT_SUPPORTED)

    mod.nvmlInit = lambda: None
    mod.nvmlShutdown = lambda: None
    mod.nvmlDeviceGetCount = lambda: 1
    mod.nvmlDeviceGetHandleByIndex = lambda i: "gpu0"
    mod.nvmlDeviceGetUUID = lambda h: uuid
    mod.nvmlDeviceGetName = lambda h: "NVIDIA L4"
    mod.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:01:00.0")
    mod.nvmlDeviceGetMigMode = unsupported
    mod.nvmlDeviceGetComputeRunningProcesses = running
    mod.nvmlDeviceGetGraphicsRunningProcesses = lambda h: []
    mod.nvmlDeviceGetMPSComputeRunningProcesses = lambda h: []
    mod.nvmlDeviceGetProcessUtilization = util
    return mod
