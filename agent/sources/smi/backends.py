"""The telemetry backends behind one interface, and ``auto``'s choice among them.

``auto`` takes the best backend present, AMD first: the AMD SMI library (complete, in-process),
then sysfs (in-process, no tool needed; most readings), then the ``amd-smi`` and ``rocm-smi``
tools (complete, but a process per sample); for NVIDIA, NVML, then ``nvidia-smi``. A library or
tool counts as present when it answers one sample. Every call runs under ``timeout_s``
(``calls``): a tool is killed, an in-process call abandoned.

With ``activity`` on, the NVML, AMD SMI and ``amd-smi`` backends also give the activity counters,
each behind one ``counters_guard.CountersGuard`` (``profilers``, ``activity_max_failures``,
``proc_root``); off (the default here; the ``smi`` source turns it on), they give none.
"""

from __future__ import annotations

import importlib
import os
import shutil
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Final, Literal

import orjson

from aaco.agent.sources.smi.amd_smi import parse_amd_smi, parse_identities
from aaco.agent.sources.smi.amdsmi_lib import AmdSmiReader
from aaco.agent.sources.smi.calls import BackendError, TimedCaller, run_tool
from aaco.agent.sources.smi.capture import read_capture
from aaco.agent.sources.smi.counters_guard import ACTIVITY_METRICS, DEFAULT_PROFILERS, CountersGuard, strip
from aaco.agent.sources.smi.nvidia_smi import parse_nvidia_smi
from aaco.agent.sources.smi.nvml import NvmlReader
from aaco.agent.sources.smi.rocm_smi import parse_rocm_smi
from aaco.agent.sources.smi.sysfs import SysfsReader, amd_cards
from aaco.agent.sources.smi.sysfs_tree import DirTree
from aaco.agent.sources.smi.values import TelemetryFormatError
from aaco.contract.telemetry import GpuIdentity, Snapshot

if TYPE_CHECKING:
    from aaco.agent.sources.base import SourceContext

BackendName = Literal["auto", "amdsmi", "amd-smi", "rocm-smi", "sysfs", "nvml", "nvidia-smi", "file"]
BACKENDS: Final = ("auto", "amdsmi", "amd-smi", "rocm-smi", "sysfs", "nvml", "nvidia-smi", "file")
AUTO_ORDER: Final = ("amdsmi", "sysfs", "amd-smi", "rocm-smi", "nvml", "nvidia-smi")
ROCM_SMI_ARGS: Final = (
    "--showtemp",
    "--showpower",
    "--showmaxpower",
    "--showclocks",
    "--showuse",
    "--showmemuse",
    "--showmeminfo",
    "vram",
    "--showproductname",
    "--showbus",
    "--showuniqueid",
    "--showid",
    "--showfan",
    "--showvoltage",
    "--showreplaycount",
    "--json",
)
IDENTITY_REFRESH_S: Final = 60.0
# sysfs files kept open between samples (about 16 per GPU; beyond this they are opened per read), far
# below the usual limit of 1024 open files.
MAX_OPEN_FILES: Final = 512


@dataclass
class BackendOptions:
    """What the backends need: deadline, paths, tool names, and (for tests) modules to use instead of imports."""

    timeout_s: float = 5.0
    sysfs_root: Path = Path("/sys")
    file: Path | None = None
    amd_smi: str = "amd-smi"
    rocm_smi: str = "rocm-smi"
    nvidia_smi: str = "nvidia-smi"
    modules: Mapping[str, ModuleType] = field(default_factory=dict)
    activity: bool = False
    activity_max_failures: int = 3
    profilers: tuple[str, ...] = DEFAULT_PROFILERS
    proc_root: Path = Path("/proc")

    def counters_guard(self) -> CountersGuard | None:
        """The back-off of a backend's activity counters; None with ``activity`` off."""
        if not self.activity:
            return None
        return CountersGuard(self.profilers, max_failures=self.activity_max_failures, proc_root=self.proc_root)


class Backend(ABC):
    """One way of reading every GPU of the node."""

    name: str

    @abstractmethod
    def sample(self) -> Snapshot:
        """Read every GPU once (raises ``BackendError`` / ``TelemetryFormatError`` when nothing could be read)."""

    def close(self) -> None:  # noqa: B027 - most backends hold nothing to release
        """Release what the backend holds (a library session)."""


class CaptureBackend(Backend):
    """``file``: a captured output or sysfs archive, read again at every sample."""

    name = "file"

    def __init__(self, path: Path, timeout_s: float) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._caller = TimedCaller(f"file {path}")

    def sample(self) -> Snapshot:
        """Parse the file as it is now."""
        return self._caller.call(lambda: read_capture(self.path), self.timeout_s)

    def close(self) -> None:
        """End the worker thread."""
        self._caller.close()


class SysfsBackend(Backend):
    """``sysfs``: amdgpu's files under ``root/class/drm``."""

    name = "sysfs"

    def __init__(self, root: Path, timeout_s: float) -> None:
        self.tree = DirTree(root, max_open=MAX_OPEN_FILES)
        self.reader = SysfsReader(self.tree)
        self.timeout_s = timeout_s
        self._caller = TimedCaller(f"sysfs {root}")

    def sample(self) -> Snapshot:
        """Read every AMD card (in a worker thread: a wedged GPU can block a read in the kernel)."""
        return self._caller.call(self.reader.sample, self.timeout_s)

    def close(self) -> None:
        """End the worker thread and close the files kept open."""
        self._caller.close()
        if self._caller.stuck == 0:  # a hung read still holds the tree
            self.reader.close()


class ToolBackend(Backend):
    """A command-line tool run once per sample, its output parsed."""

    def __init__(self, name: str, argv: list[str], parse: Callable[[bytes, str], Snapshot], timeout_s: float) -> None:
        self.name = name
        self.argv = argv
        self.parse = parse
        self.timeout_s = timeout_s

    def sample(self) -> Snapshot:
        """Run the tool and parse what it printed."""
        out = run_tool(self.argv, self.timeout_s)
        return self.parse(out, " ".join(self.argv))


class AmdSmiToolBackend(ToolBackend):
    """``amd-smi metric --json``; identities from ``amd-smi list`` / ``static --asic``, refreshed when GPUs change."""

    def __init__(self, tool: str, timeout_s: float, guard: CountersGuard | None = None) -> None:
        super().__init__("amd-smi", [tool, "metric", "--json"], self._parse, timeout_s)
        self.tool = tool
        self.guard = guard
        self.identities: dict[str, GpuIdentity] = {}
        self._identified_at = -1e18

    def _refresh_identities(self) -> None:
        self._identified_at = time.monotonic()
        subject = f"{self.tool} list --json"
        try:
            listed = orjson.loads(run_tool([self.tool, "list", "--json"], self.timeout_s))
            static = orjson.loads(run_tool([self.tool, "static", "--asic", "--json"], self.timeout_s))
            self.identities = parse_identities(listed, static, subject)
        except (BackendError, orjson.JSONDecodeError, TelemetryFormatError):
            self.identities = {}  # metrics without UUIDs are still metrics; retried after IDENTITY_REFRESH_S

    def _parse(self, out: bytes, subject: str) -> Snapshot:
        try:
            doc = orjson.loads(out)
        except orjson.JSONDecodeError as exc:
            raise TelemetryFormatError(f"invalid JSON: {exc}", subject=subject) from exc
        snap = parse_amd_smi(doc, subject, self.identities)
        unknown = any(g.gpu.index not in self.identities for g in snap.gpus)
        if unknown and time.monotonic() - self._identified_at > IDENTITY_REFRESH_S:
            self._refresh_identities()
            snap = parse_amd_smi(doc, subject, self.identities)
        if self.guard is not None:
            self.guard.start_sample()
        for s in snap.gpus:
            if self.guard is None:
                strip(s)
            elif any(r.metric in ACTIVITY_METRICS for r in s.readings):  # a GPU without them: no series
                self.guard.publish(s.gpu.uuid or s.gpu.index, s)
        return snap


def _json(parse: Callable[[Any, str], Snapshot]) -> Callable[[bytes, str], Snapshot]:
    def run(out: bytes, subject: str) -> Snapshot:
        try:
            doc = orjson.loads(out)
        except orjson.JSONDecodeError as exc:
            raise TelemetryFormatError(f"invalid JSON: {exc}", subject=subject) from exc
        return parse(doc, subject)

    return run


class LibraryBackend(Backend):
    """A vendor library (NVML, AMD SMI) opened once, sampled in a worker thread with a deadline.

    The reader is the smi source's (``NvmlReader``, ``AmdSmiReader``) unless ``make_reader`` makes
    another from the module (the ``gpu_processes`` source's).
    """

    def __init__(
        self, name: str, module: str, opts: BackendOptions, make_reader: Callable[[ModuleType], Any] | None = None
    ) -> None:
        self.name = name
        self.timeout_s = opts.timeout_s
        self._caller = TimedCaller(name)
        reader_class = NvmlReader if name == "nvml" else AmdSmiReader

        def open_reader() -> Any:
            mod = opts.modules.get(module) or importlib.import_module(module)
            return make_reader(mod) if make_reader is not None else reader_class(mod, opts.counters_guard())

        try:
            self.reader = self._caller.call(open_reader, opts.timeout_s)
        except BackendError:
            raise
        except Exception as exc:  # ImportError, the library's own errors: the backend is not present
            raise BackendError(f"{type(exc).__name__}: {exc}", subject=name, reason="missing") from exc

    def sample(self) -> Any:
        """One sample through the library (the reader's: a ``Snapshot`` of the smi readers)."""
        try:
            return self._caller.call(self.reader.sample, self.timeout_s)
        except BackendError:
            raise
        except Exception as exc:
            raise BackendError(f"{type(exc).__name__}: {exc}", subject=self.name) from exc

    def close(self) -> None:
        """Shut the library down."""
        if self._caller.stuck == 0:
            self.reader.close()
        self._caller.close()


def open_backend(name: str, opts: BackendOptions) -> Backend:
    """The backend ``name`` (``auto``: the best present); ``BackendError`` says why none could be opened."""
    if name == "auto":
        reasons = []
        for candidate in AUTO_ORDER:
            try:
                backend = _open(candidate, opts)
                snap = backend.sample()
            except (BackendError, TelemetryFormatError) as exc:
                reasons.append(f"{candidate}: {exc.message}")
                continue
            if snap.gpus:
                return backend
            backend.close()
            reasons.append(f"{candidate}: no GPU")
        raise BackendError(
            "no GPU telemetry backend found (" + "; ".join(reasons) + ")", subject="auto", reason="missing"
        )
    return _open(name, opts)


def capture_file(opts: BackendOptions) -> Path:
    """The ``file`` backend's capture; ``BackendError`` when none is set or it is not there."""
    if opts.file is None:
        raise BackendError("the file backend needs a capture file", subject="file", reason="config")
    if not opts.file.is_file():
        raise BackendError("no such capture file", subject=os.fspath(opts.file), reason="missing")
    return opts.file


def _open(name: str, opts: BackendOptions) -> Backend:
    if name == "file":
        return CaptureBackend(capture_file(opts), opts.timeout_s)
    if name == "sysfs":
        if not amd_cards(DirTree(opts.sysfs_root)) and not (opts.sysfs_root / "class" / "drm").is_dir():
            raise BackendError(f"no {os.fspath(opts.sysfs_root / 'class' / 'drm')}", subject="sysfs", reason="missing")
        return SysfsBackend(opts.sysfs_root, opts.timeout_s)
    if name in ("nvml", "amdsmi"):
        return LibraryBackend(name, "pynvml" if name == "nvml" else "amdsmi", opts)
    tool = {"amd-smi": opts.amd_smi, "rocm-smi": opts.rocm_smi, "nvidia-smi": opts.nvidia_smi}.get(name)
    if tool is None:
        raise BackendError(f"unknown backend {name!r} (known: {', '.join(BACKENDS)})", subject=name, reason="config")
    path = shutil.which(tool)
    if path is None:
        raise BackendError(f"{tool} not found on PATH", subject=name, reason="missing")
    if name == "amd-smi":
        return AmdSmiToolBackend(path, opts.timeout_s, opts.counters_guard())
    if name == "rocm-smi":
        return ToolBackend(name, [path, *ROCM_SMI_ARGS], _json(parse_rocm_smi), opts.timeout_s)
    return ToolBackend(name, [path, "-q", "-x"], parse_nvidia_smi, opts.timeout_s)


def open_for(
    ctx: SourceContext, source: str, name: str, opts: BackendOptions, opener: Callable[[str, BackendOptions], Backend]
) -> Backend | None:
    """``opener(name, opts)`` for a source; None, with a fatal problem of the source, when none could be opened."""
    try:
        return opener(name, opts)
    except (BackendError, TelemetryFormatError) as exc:
        reason = getattr(exc, "reason", "unreadable")
        ctx.problem(source, exc.subject or source, reason, exc.message, fatal=True, count=1)
        return None
