"""The ``gpu_processes`` source's backends: where each device's process list comes from.

``nvml`` and ``amdsmi`` (the libraries, in process, under a deadline like the ``smi`` source's),
``nvidia-smi`` (``-q -x`` for the processes and their memory, then ``pmon -c 1 -s u`` for their
SM and memory shares, merged by GPU and pid; ``pmon`` refused, as on a MIG GPU, leaves the shares
out), ``amd-smi`` (``process --json``), ``file`` (any of those captured, recognised by content,
read again at every sample), ``auto`` (the first of amdsmi, amd-smi, nvml, nvidia-smi that answers).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Final

import orjson

from aaco.agent.sources.gpu_procs import amd, nvidia_smi
from aaco.agent.sources.gpu_procs.nvml import NvmlProcessReader
from aaco.agent.sources.smi.backends import Backend, BackendOptions, LibraryBackend, capture_file
from aaco.agent.sources.smi.calls import BackendError, run_tool
from aaco.agent.sources.smi.capture import load
from aaco.agent.sources.smi.values import TelemetryFormatError
from aaco.contract.gpu_processes import ProcessSnapshot
from aaco.contract.telemetry import FieldProblem

BACKENDS: Final = ("auto", "amdsmi", "amd-smi", "nvml", "nvidia-smi", "file")
AUTO_ORDER: Final = ("amdsmi", "amd-smi", "nvml", "nvidia-smi")


def parse_capture(data: bytes, subject: str, rates: amd.EngineRates | None = None) -> ProcessSnapshot:
    """A captured process listing: ``nvidia-smi -q -x``, ``nvidia-smi pmon``, or ``amd-smi process --json``."""
    head = data[:4096].lstrip()
    if head.startswith((b"<?xml", b"<nvidia_smi_log", b"<!DOCTYPE nvidia_smi_log")):
        return nvidia_smi.parse_processes(data, subject)
    if head.startswith(b"#"):
        return nvidia_smi.parse_pmon(data, subject)
    if head.startswith((b"[", b"{")):
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise TelemetryFormatError(f"invalid or truncated JSON: {exc}", subject=subject) from exc
        return amd.parse_processes(doc, subject, rates)
    raise TelemetryFormatError(
        "not a process listing: expected nvidia-smi XML, nvidia-smi pmon output or amd-smi process JSON",
        subject=subject,
    )


class FileBackend(Backend):
    """``file``: a captured listing, read again at every sample."""

    name = "file"

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rates = amd.EngineRates()

    def sample(self) -> ProcessSnapshot:  # type: ignore[override]
        """Read and parse the capture."""
        return parse_capture(load(self.path), os.fspath(self.path), self.rates)


class NvidiaSmiBackend(Backend):
    """``nvidia-smi -q -x`` and ``nvidia-smi pmon -c 1 -s u``."""

    name = "nvidia-smi"

    def __init__(self, tool: str, timeout_s: float) -> None:
        self.tool = tool
        self.timeout_s = timeout_s

    def sample(self) -> ProcessSnapshot:  # type: ignore[override]
        """The processes, then their shares."""
        snap = nvidia_smi.parse_processes(run_tool([self.tool, "-q", "-x"], self.timeout_s), f"{self.tool} -q -x")
        if not snap.processes:
            return snap
        argv = [self.tool, "pmon", "-c", "1", "-s", "u"]
        try:
            shares = nvidia_smi.parse_pmon(run_tool(argv, self.timeout_s), " ".join(argv))
        except (BackendError, TelemetryFormatError) as exc:
            snap.problems.append(FieldProblem(" ".join(argv), "pmon", exc.message))
            return snap
        by_key = {(p.device.index, p.pid): p for p in shares.processes}
        snap.processes = [
            replace(p, utilization=s.utilization, memory_utilization=s.memory_utilization)
            if (s := by_key.get((p.device.index.split("/", 1)[0], p.pid))) is not None
            else p
            for p in snap.processes
        ]
        return snap


class AmdSmiBackend(Backend):
    """``amd-smi process --json``."""

    name = "amd-smi"

    def __init__(self, tool: str, timeout_s: float) -> None:
        self.argv = [tool, "process", "--json"]
        self.timeout_s = timeout_s
        self.rates = amd.EngineRates()

    def sample(self) -> ProcessSnapshot:  # type: ignore[override]
        """Run the tool and parse what it printed."""
        subject = " ".join(self.argv)
        out = run_tool(self.argv, self.timeout_s)
        try:
            doc = orjson.loads(out)
        except orjson.JSONDecodeError as exc:
            raise TelemetryFormatError(f"invalid JSON: {exc}", subject=subject) from exc
        return amd.parse_processes(doc, subject, self.rates)


def open_backend(name: str, opts: BackendOptions) -> Backend:
    """The backend ``name`` (``auto``: the first present that answers); ``BackendError`` says why none opened."""
    if name != "auto":
        return _open(name, opts)
    reasons = []
    for candidate in AUTO_ORDER:
        try:
            backend = _open(candidate, opts)
            backend.sample()
        except (BackendError, TelemetryFormatError) as exc:
            reasons.append(f"{candidate}: {exc.message}")
            continue
        return backend
    raise BackendError("no GPU process backend found (" + "; ".join(reasons) + ")", subject="auto", reason="missing")


def _open(name: str, opts: BackendOptions) -> Backend:
    if name == "file":
        return FileBackend(capture_file(opts))
    if name == "nvml":
        return LibraryBackend(name, "pynvml", opts, make_reader=NvmlProcessReader)
    if name == "amdsmi":
        return LibraryBackend(name, "amdsmi", opts, make_reader=amd.AmdSmiProcessReader)
    tool = {"amd-smi": opts.amd_smi, "nvidia-smi": opts.nvidia_smi}.get(name)
    if tool is None:
        raise BackendError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})", subject=name, reason="config")
    path = shutil.which(tool)
    if path is None:
        raise BackendError(f"{tool} not found on PATH", subject=name, reason="missing")
    return AmdSmiBackend(path, opts.timeout_s) if name == "amd-smi" else NvidiaSmiBackend(path, opts.timeout_s)
