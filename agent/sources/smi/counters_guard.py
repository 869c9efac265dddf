"""Backing off the activity counters (docs/health.md, "Activity") when something else needs them.

The activity readings (``ACTIVITY_METRICS``: NVML GPM, amdsmi's activity) are paused per GPU, with
``aaco.gpu.counters.paused{reason}`` 1 for the reason and 0 for the others, so that every series
exists while the counters are read:

- ``another_profiler``: a profiler runs on the node. Before a sample, at most every ``SCAN_EVERY_S``,
  the process table is read (``/proc/<pid>/comm``; ``cmdline`` only for a name that could be one:
  an interpreter, a name the kernel cut to 15 characters, or a profiler named with a subcommand).
  A ``profilers`` entry is a program name (``ncu``), or a name and the subcommand it must run, its
  first argument that is not an option (``dcgmi profile``, ``aaco capture``); the name is the
  process's own (``comm``), its ``argv[0]``, or the script an interpreter runs
  (``python3 /opt/rocm/bin/rocprofv3``).
  Pausing and resuming are logged once each, with the process's name and pid.
- ``busy``: a counter call answered that the counters are in use (NVML_ERROR_IN_USE,
  AMDSMI_STATUS_BUSY or RETRY); that sample only, retried at the next.
- ``off``: ``max_failures`` consecutive failures of another kind turned the GPU's counters off until
  the agent restarts or a reload changes the source's configuration (the source starts anew; a
  reload that leaves it unchanged keeps it running, counters off). Logged once.

The agent sees the processes of its own PID namespace: in a container, only with the host's
(``hostPID: true``) does it see a profiler another pod runs.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from aaco.contract.telemetry import (
    COUNTERS_PAUSED,
    DRAM_ACTIVE,
    GRAPHICS_ACTIVE,
    MEDIA_ACTIVE,
    NVLINK_THROUGHPUT,
    PCIE_THROUGHPUT,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    GpuSample,
)

log = logging.getLogger("aaco.sources.smi")

REASONS: Final = ("another_profiler", "busy", "off")
DEFAULT_PROFILERS: Final = (
    "ncu",
    "nsys",
    "nv-nsight-cu-cli",
    "rocprofv3",
    "rocprof",
    "rocprofv2",
    "rocprof-compute",
    "omniperf",
    "dcgmi profile",
    "aaco capture",
)
ACTIVITY_METRICS: Final = frozenset(
    {
        SM_ACTIVE,
        SM_OCCUPANCY,
        GRAPHICS_ACTIVE,
        TENSOR_ACTIVE,
        DRAM_ACTIVE,
        MEDIA_ACTIVE,
        PCIE_THROUGHPUT,
        NVLINK_THROUGHPUT,
    }
)
SCAN_EVERY_S: Final = 5.0
COMM_LEN: Final = 15  # TASK_COMM_LEN - 1: the kernel keeps the first 15 bytes of a program's name
INTERPRETERS: Final = ("python", "bash", "sh", "dash", "perl", "env")
MAX_GPUS: Final = 1024
MAX_CMDLINE: Final = 4096


@dataclass
class _Gpu:
    failures: int = 0
    off: bool = False
    busy: bool = False


def _is_interpreter(name: str) -> bool:
    return name in INTERPRETERS or name.startswith("python")


def _read(path: str, limit: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(limit)


class CountersGuard:
    """Says, per GPU and sample, whether the activity counters may be read, and publishes why not."""

    def __init__(
        self,
        profilers: Iterable[str],
        max_failures: int = 3,
        proc_root: Path = Path("/proc"),
        scan_every_s: float = SCAN_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rules: dict[str, tuple[str | None, ...]] = {}
        for entry in profilers:
            name, _, word = entry.strip().partition(" ")
            if name:
                self.rules[name] = (*self.rules.get(name, ()), word.strip() or None)
        self.max_failures = max_failures
        self.proc_root = proc_root
        self.scan_every_s = scan_every_s
        self.clock = clock
        self.profiler: tuple[str, int] | None = None  # (name, pid) of the profiler that pauses sampling
        self._scanned_at: float | None = None
        self._gpus: dict[str, _Gpu] = {}
        self._own_pid = os.getpid()

    # -- another profiler -------------------------------------------------------------------------

    def start_sample(self) -> None:
        """Once per sample, before any GPU: look for a profiler when the last look is ``scan_every_s`` old."""
        now = self.clock()
        if not self.rules or (self._scanned_at is not None and now - self._scanned_at < self.scan_every_s):
            return
        self._scanned_at = now
        found = self._find_profiler()
        if found is not None and self.profiler is None:
            log.info("activity counters paused: another profiler runs (%s, pid %d)", *found)
        elif found is None and self.profiler is not None:
            log.info("activity counters resumed: %s (pid %d) is gone", *self.profiler)
        self.profiler = found

    def _find_profiler(self) -> tuple[str, int] | None:
        try:
            entries = os.scandir(self.proc_root)
        except OSError:
            return None
        with entries:
            for entry in entries:
                if not entry.name.isdigit() or int(entry.name) == self._own_pid:
                    continue
                name = self._match(entry.path)
                if name is not None:
                    return name, int(entry.name)
        return None

    def _match(self, proc: str) -> str | None:
        """The profiler process ``proc`` (``/proc/<pid>``) is, or None; vanished processes are none."""
        try:
            comm = _read(f"{proc}/comm", 64).decode(errors="replace").strip()
        except OSError:
            return None
        cut = len(comm) >= COMM_LEN and any(name.startswith(comm) for name in self.rules)
        if comm in self.rules and self.rules[comm] == (None,):
            return comm
        if comm not in self.rules and not _is_interpreter(comm) and not cut:
            return None
        try:
            argv = [a.decode(errors="replace") for a in _read(f"{proc}/cmdline", MAX_CMDLINE).split(b"\0") if a]
        except OSError:
            return None
        programs = [(comm, argv[1:])]  # a program's name and the arguments after it
        if argv:
            programs.append((os.path.basename(argv[0]), argv[1:]))
            if _is_interpreter(programs[-1][0]):
                at = next((i for i, a in enumerate(argv[1:], 1) if not a.startswith("-")), len(argv))
                programs.append((os.path.basename(argv[at]) if at < len(argv) else "", argv[at + 1 :]))
        for name, args in programs:
            command = next((a for a in args if not a.startswith("-")), None)  # its first word: a subcommand
            if any(word is None or word == command for word in self.rules.get(name, ())):
                return name
        return None

    # -- per GPU ----------------------------------------------------------------------------------

    def _gpu(self, gpu: str) -> _Gpu:
        state = self._gpus.get(gpu)
        if state is None:
            if len(self._gpus) >= MAX_GPUS:
                self._gpus.clear()
            state = self._gpus[gpu] = _Gpu()
        return state

    def is_off(self, gpu: str) -> bool:
        """True once ``gpu``'s counters were turned off."""
        return self._gpu(gpu).off

    def paused(self, gpu: str) -> bool:
        """True when ``gpu``'s counters are not to be read this sample (off, or another profiler runs)."""
        return self._gpu(gpu).off or self.profiler is not None

    def busy(self, gpu: str) -> None:
        """A counter call said the counters are in use: paused for this sample."""
        self._gpu(gpu).busy = True

    def succeeded(self, gpu: str) -> None:
        """The counters answered: the count of consecutive failures starts again."""
        self._gpu(gpu).failures = 0

    def failed(self, gpu: str, message: str) -> None:
        """A counter call failed otherwise; the ``max_failures``-th in a row turns the GPU's counters off."""
        state = self._gpu(gpu)
        state.failures += 1
        if not state.off and state.failures >= self.max_failures:
            state.off = True
            log.warning(
                "activity counters of GPU %s turned off after %d failures in a row (last: %s); "
                "back on when the agent restarts or a reload changes this source's configuration",
                gpu,
                state.failures,
                message,
            )

    def reason(self, gpu: str) -> str | None:
        """Why ``gpu``'s counters are paused now (off, another_profiler, busy), or None."""
        state = self._gpu(gpu)
        if state.off:
            return "off"
        if self.profiler is not None:
            return "another_profiler"
        return "busy" if state.busy else None

    def publish(self, gpu: str, s: GpuSample) -> None:
        """Add ``aaco.gpu.counters.paused`` per reason to ``s``; while paused, take its activity readings out."""
        reason = self.reason(gpu)
        if reason is not None:
            strip(s)
        for r in REASONS:
            s.add(COUNTERS_PAUSED, float(r == reason), reason=r)
        self._gpu(gpu).busy = False


def strip(s: GpuSample) -> None:
    """Take the activity readings out of ``s``."""
    s.readings = [r for r in s.readings if r.metric not in ACTIVITY_METRICS]
