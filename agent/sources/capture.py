"""The ``capture`` source: profile running GPU processes in windows, and ingest what the profiler writes.

A command template (placeholders ``{pid}``, ``{out}``, ``{duration_ms}``), for example ``rocprofv3
--attach {pid} --attach-duration-msec {duration_ms} --kernel-trace --output-format csv -d {out}``,
is run against GPU processes — those with ``/dev/kfd``, ``/dev/dri/renderD*`` or ``/dev/nvidia*``
open (``sched.targets.gpu_processes``) — or configured pids: every ``interval_s`` on a schedule, and
on demand (``request``: ``aaco capture --pid P``, which posts to the agent's ``/api/v1/capture``
with an admin credential, or an analyzer finding). Whoever asks, a window is only run for a process
the ``targets`` rule allows (a GPU process, or a listed pid; a thread id stands for its process) and
never for pid 1, a kernel thread (``PF_KTHREAD``, or a child of kthreadd), the agent itself:
``request`` answers a ``Request`` with the reason, and the rule is checked again as the window
starts (the pid may have been reused). Bounded: at most ``max_concurrent`` captures at once, at most
one per pid per ``min_gap_s``, at most ``max_queue`` waiting; each capture in its own process group,
killed when it outlives ``duration_ms`` plus ``timeout_s``. The template is split into arguments
once (``shlex``) and the placeholders are filled per argument: no shell is involved, so a pid or
path can never inject a command. What the command leaves in its output directory is read exactly
once (``ingest.ingest_file``: a file that fails is quarantined and the others read) and the
directory removed unless ``keep_outputs``. Every file is read within the source's limits
(``max_file_bytes``, ``max_gzip_ratio``, ``max_json_depth``: ``limits``). A window just
captured is live data (it sets ``aaco_source_lag_seconds``); the directories an earlier run left
behind are not.

A capture is named by its process: the kernels of a window take the model the target's command line
names (``/proc/<pid>/cmdline``, read as the window starts, through ``traces.model_names.model_from_command``:
``python3 train.py`` -> ``train``), unless the config names one, so every window of one process is
one model however the profiler names its files. The name is kept in the window's directory
(``MODEL_FILE``), so a directory left by an earlier run is named by its process too, never by
whatever process has its pid now; without it, the files name their model themselves. Its
distributed job (docs/jobs.md) is read from its environment (``/proc/<pid>/environ``: ``RANK``,
``WORLD_SIZE``, ``TORCHELASTIC_RUN_ID``..., ``jobs.process_job``) as the window starts and kept
beside it (``jobs.JOB_FILE``) likewise; ``job`` in the config names it instead, and the job's
name is the model of its rows unless ``model`` is configured.
"""

from __future__ import annotations

import enum
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, field_validator

from aaco.agent.sources.base import Source, SourceContext
from aaco.agent.sources.counters import publish_capture
from aaco.agent.sources.ingest import Quarantine, file_failed, ingest_file
from aaco.agent.sources.jobs import JobRegistry, process_job, save_job, saved_job
from aaco.agent.sources.limits_config import TraceLimitSettings
from aaco.agent.sources.sched.targets import gpu_processes, holds_gpu, tgid_of
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.files import expand_paths
from aaco.agent.sources.traces.limits import DEFAULT_MAX_BYTES
from aaco.agent.sources.traces.model_names import MAX_MODEL_CHARS, model_from_command
from aaco.agent.sources.traces.parse import ITERATIONS_FIRST
from aaco.contract.errors import TraceFormatError
from aaco.contract.jobs import JobFields, resolve
from aaco.contract.signals import define

log = logging.getLogger("aaco.sources.capture")
_CAPTURE_DIR = re.compile(r"^(\d+)-\d+$")  # <pid>-<epoch ms>, one per capture window
MODEL_FILE = ".aaco-model"  # in a window's directory: the captured process's model (hidden: never a trace)
CMDLINE_BYTES = 64 * 1024  # of /proc/<pid>/cmdline: model_from_command looks at the first words only
PF_KTHREAD = 0x00200000  # in the flags of /proc/<pid>/stat (include/linux/sched.h)
KTHREADD = 2  # the kernel thread every other kernel thread is a child of
NEVER = frozenset({1, KTHREADD})  # init and kthreadd: never captured, whatever the targets say
PMC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.:\[\]]*$")  # SQ_WAVES, TCC_HIT[0], smsp__cycles_active.avg

CAPTURES = define(
    "aaco.capture.runs",
    "aaco_captures",
    "counter",
    "{capture}",
    "Capture windows by outcome (ok, failed, timeout) and refused requests by reason (refused_gone, "
    "refused_target, refused_forbidden, refused_already, refused_rate, refused_queue).",
    ("source", "outcome"),
)


class Outcome(enum.Enum):
    """What became of a capture request; a refusal is counted under ``REFUSED[outcome]``."""

    QUEUED = "queued"
    NO_SUCH_PROCESS = "no_such_process"
    NOT_A_TARGET = "not_a_target"
    FORBIDDEN = "forbidden"  # init, kthreadd, a kernel thread, the agent
    ALREADY = "already"
    RATE_LIMITED = "rate_limited"
    QUEUE_FULL = "queue_full"


REFUSED = {
    Outcome.NO_SUCH_PROCESS: "refused_gone",
    Outcome.NOT_A_TARGET: "refused_target",
    Outcome.FORBIDDEN: "refused_forbidden",
    Outcome.ALREADY: "refused_already",
    Outcome.RATE_LIMITED: "refused_rate",
    Outcome.QUEUE_FULL: "refused_queue",
}


@dataclass(frozen=True, slots=True)
class Request:
    """The answer to a capture request: its outcome, the process it names (a thread's is its process), and why."""

    outcome: Outcome
    pid: int
    detail: str

    @property
    def queued(self) -> bool:
        """True when a window was queued."""
        return self.outcome is Outcome.QUEUED


class CaptureConfig(TraceLimitSettings):
    """Profile GPU processes in capture windows with a command, and ingest what it writes."""

    type: Literal["capture"] = "capture"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    command: str = Field(..., description="Command template with {pid}, {out}, {duration_ms} (no shell).")
    out_dir: Path = Field(Path("/var/lib/aaco/captures"), description="Where each capture gets its directory.")
    duration_ms: PositiveInt = Field(2000, description="Length of a capture window.")
    interval_s: NonNegativeFloat = Field(300.0, description="Capture targets this often; 0: only on demand.")
    targets: Literal["gpu"] | list[PositiveInt] = Field(
        "gpu",
        description="Which processes may be captured, scheduled or on demand: 'gpu' (those with a GPU device open) "
        "or a list of pids (never 1 or 2).",
    )
    max_concurrent: PositiveInt = Field(1, description="Captures running at once.")
    min_gap_s: NonNegativeFloat = Field(60.0, description="At most one capture per pid this often.")
    max_queue: PositiveInt = Field(64, description="Capture requests waiting at most.")
    timeout_s: PositiveFloat = Field(60.0, description="Grace beyond duration_ms before the command is killed.")
    keep_outputs: bool = Field(False, description="Keep each capture's directory after ingesting it.")
    max_file_bytes: PositiveInt = Field(
        DEFAULT_MAX_BYTES, description="Ignore output files larger than this, on disk; refuse them decompressed."
    )
    model: str | None = Field(
        None,
        description="Model name for the iterations (default: what the captured process's command line names, "
        "else what the file names).",
    )
    pmc: list[list[str]] = Field(
        default_factory=list,
        description="Hardware counter groups, one profiling pass each: every window adds the next group in turn "
        "to its command as --pmc NAME... (rocprofv3), so N groups take N windows; the counter_collection.csv it "
        "writes lands in the counters dataset (docs/counters.md). Empty: no counters.",
    )
    job: str | None = Field(
        None,
        description="The distributed job the captured processes are ranks of (default: the captured process's "
        "environment, else the traces' own distributedInfo, docs/jobs.md); also their model unless model is set.",
    )

    @field_validator("command")
    @classmethod
    def _template(cls, v: str) -> str:
        try:
            args = shlex.split(v)
        except ValueError as exc:
            raise ValueError(f"cannot split the command: {exc}") from exc
        if not args:
            raise ValueError("empty command")
        if "{out}" not in v:
            raise ValueError("the command must write its output to {out}")
        return v

    @field_validator("pmc")
    @classmethod
    def _counter_names(cls, groups: list[list[str]]) -> list[list[str]]:
        for group in groups:
            if not group:
                raise ValueError("an empty counter group: give each pass at least one counter")
            bad = [name for name in group if not PMC_NAME.fullmatch(name)]
            if bad:
                raise ValueError(f"not counter names: {', '.join(map(repr, bad))}")
        return groups

    @field_validator("targets")
    @classmethod
    def _not_init(cls, v: Literal["gpu"] | list[int]) -> Literal["gpu"] | list[int]:
        if isinstance(v, list) and NEVER & set(v):
            raise ValueError(f"pids {sorted(NEVER)} (init, kthreadd) are never captured; remove them from targets")
        return v


def with_options(args: list[str], options: list[str]) -> list[str]:
    """``options`` added to a command: before its ``--`` (where the profiled command starts), else at the end."""
    at = args.index("--") if "--" in args else len(args)
    return [*args[:at], *options, *args[at:]]


def process_model(pid: int) -> str | None:
    """The model a running process's command line names (``model_from_command``), None if it is gone or names none."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            raw = fh.read(CMDLINE_BYTES)
    except OSError:
        return None
    return model_from_command([a.decode(errors="replace") for a in raw.split(b"\0") if a])


def saved_model(out: Path) -> str | None:
    """The process's model kept in a window's directory (``MODEL_FILE``), None if there is none."""
    try:
        with open(out / MODEL_FILE, "rb") as fh:
            text = fh.read(4 * MAX_MODEL_CHARS).decode(errors="replace").strip()
    except OSError:
        return None
    return text[:MAX_MODEL_CHARS] or None


def forbidden(pid: int, proc: Path = Path("/proc")) -> str | None:
    """Why process ``pid`` may never be captured (init, kthreadd, a kernel thread, the agent), else None.

    A process that vanished is not forbidden (the caller finds it gone); one whose stat cannot be
    parsed is (it cannot be shown to be a user process).
    """
    if pid in NEVER:
        return f"pid {pid} is {'init' if pid == 1 else 'kthreadd'}"
    if pid == os.getpid():  # its children run with its own rights: attaching to them gains nothing
        return f"pid {pid} is this agent"
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session tty_nr tpgid flags ...": comm may hold spaces and parentheses
    fields = text.rpartition(")")[2].split()
    try:
        ppid, flags = int(fields[1]), int(fields[6])
    except (IndexError, ValueError):
        return f"pid {pid}: unreadable /proc/{pid}/stat"
    if flags & PF_KTHREAD or ppid == KTHREADD:
        return f"pid {pid} is a kernel thread"
    return None


def fill(arg: str, values: dict[str, str]) -> str:
    """One argument of the template with its placeholders filled."""
    for placeholder, value in values.items():
        arg = arg.replace(placeholder, value)
    return arg


class CaptureSource(Source):
    """Runs capture windows (scheduled and requested) and ingests their output."""

    type = "capture"

    def __init__(self, config: CaptureConfig, name: str) -> None:
        super().__init__(name)
        self.config = config
        self._queue: deque[tuple[int, str]] = deque()
        self._last: dict[int, float] = {}
        self._running: set[int] = set()
        self._lock = threading.Lock()
        self._pmc_turn = 0  # the counter group of the next window
        self._wake = threading.Event()
        self._ctx: SourceContext | None = None
        self.completed = 0
        self._jobs = JobRegistry()  # jobs named from their ranks (``jobs``)

    # -- requests -----------------------------------------------------------------------------------

    def request(self, pid: int, reason: str) -> Request:
        """Ask for a capture of ``pid`` (on demand or scheduled): queued, or refused with the reason (counted)."""
        pid, answer = self._check(pid)
        if answer is None:
            now = time.monotonic()
            with self._lock:
                last = self._last.get(pid)
                if pid in self._running or any(p == pid for p, _ in self._queue):
                    answer = Request(Outcome.ALREADY, pid, f"pid {pid} is already being captured")
                elif last is not None and now - last < self.config.min_gap_s:
                    answer = Request(
                        Outcome.RATE_LIMITED,
                        pid,
                        f"pid {pid} was captured {now - last:.0f}s ago (min_gap_s {self.config.min_gap_s:.0f})",
                    )
                elif len(self._queue) >= self.config.max_queue:
                    why = f"too many captures waiting (max_queue {self.config.max_queue})"
                    answer = Request(Outcome.QUEUE_FULL, pid, why)
                else:
                    self._queue.append((pid, reason))
                    answer = Request(Outcome.QUEUED, pid, "queued")
        if answer.queued:
            self._wake.set()
        else:
            self._count(REFUSED[answer.outcome])
        return answer

    def _check(self, pid: int) -> tuple[int, Request | None]:
        """The policy: the process ``pid`` names (its tgid), and None when it may be captured, else the refusal."""
        tgid = tgid_of(pid)
        if tgid is None:
            return pid, Request(Outcome.NO_SUCH_PROCESS, pid, f"no process with pid {pid}")
        why = forbidden(tgid)
        if why is not None:
            return tgid, Request(Outcome.FORBIDDEN, tgid, f"{why}: never captured")
        targets = self.config.targets
        if targets == "gpu":
            if not holds_gpu(tgid):
                return tgid, Request(Outcome.NOT_A_TARGET, tgid, f"pid {tgid} has no GPU device open (targets: gpu)")
        elif tgid not in targets:
            return tgid, Request(Outcome.NOT_A_TARGET, tgid, f"pid {tgid} is not in this source's targets {targets}")
        return tgid, None

    def _count(self, outcome: str) -> None:
        if self._ctx is not None:
            self._ctx.stats.inc(CAPTURES, 1, source=self.name, outcome=outcome)

    def _targets(self) -> set[int]:
        if self.config.targets == "gpu":
            return gpu_processes() - {os.getpid()}
        return {p for p in self.config.targets if Path(f"/proc/{p}").exists()}

    def _schedule(self) -> None:
        """One scheduled round: a window for every target (a refusal other than rate or already is said)."""
        for pid in sorted(self._targets()):
            answer = self.request(pid, "schedule")
            if answer.outcome in (Outcome.FORBIDDEN, Outcome.NOT_A_TARGET, Outcome.QUEUE_FULL):
                log.warning("capture: scheduled window refused: %s (source %s targets)", answer.detail, self.name)

    # -- the loop -----------------------------------------------------------------------------------

    def run(self, ctx: SourceContext) -> None:
        """Schedule, run and ingest captures until stopped."""
        self._ctx = ctx
        quarantine = Quarantine(ctx.quarantine)
        cfg = self.config
        self._recover(ctx, quarantine)
        next_round = time.monotonic() if cfg.interval_s > 0 else float("inf")
        with ThreadPoolExecutor(max_workers=cfg.max_concurrent, thread_name_prefix=f"aaco-{self.name}") as pool:
            while not ctx.stop.is_set():
                now = time.monotonic()
                if now >= next_round:
                    self._schedule()
                    next_round = now + cfg.interval_s
                while True:
                    with self._lock:
                        if not self._queue or len(self._running) >= cfg.max_concurrent:
                            break
                        pid, reason = self._queue.popleft()
                        self._running.add(pid)
                        self._last[pid] = time.monotonic()
                    pool.submit(self._capture, ctx, quarantine, pid, reason)
                self._wake.wait(min(1.0, max(0.05, next_round - time.monotonic())))
                self._wake.clear()

    def _recover(self, ctx: SourceContext, quarantine: Quarantine) -> None:
        """Ingest capture directories a previous run left behind (it stopped or crashed mid-ingest)."""
        if not self.config.out_dir.is_dir():
            return
        for out in sorted(self.config.out_dir.iterdir()):
            m = _CAPTURE_DIR.match(out.name)
            if not (out.is_dir() and m):
                continue
            log.info("capture: ingesting %s, left by an earlier run", out)
            model, job = self.config.model or saved_model(out), saved_job(out)
            self._ingest(ctx, quarantine, out, int(m.group(1)), live=False, model=model, job=job)
            if not self.config.keep_outputs:
                shutil.rmtree(out, ignore_errors=True)

    def _capture(self, ctx: SourceContext, quarantine: Quarantine, pid: int, reason: str) -> None:
        cfg = self.config
        out = cfg.out_dir / f"{pid}-{time.time_ns() // 1_000_000}"
        try:
            _, refused = self._check(pid)  # again: the pid may have ended, or been reused, while it waited
            if refused is not None:
                self._count(REFUSED[refused.outcome])
                log.warning("capture of pid %d (%s) not run: %s", pid, reason, refused.detail)
                return
            out.mkdir(parents=True, exist_ok=True)
            named = process_model(pid)  # now, while the process runs
            if named is not None:
                (out / MODEL_FILE).write_text(named + "\n")
            model = cfg.model or named
            job = process_job(pid)  # its environment, now, while it runs (kept for a later run, as its model)
            save_job(out, job)
            values = {"{pid}": str(pid), "{out}": os.fspath(out), "{duration_ms}": str(cfg.duration_ms)}
            args = with_options([fill(arg, values) for arg in shlex.split(cfg.command)], self._pmc_args())
            outcome = self._execute(ctx, args, pid, out)
            if outcome in ("ok", "failed"):  # a failed profiler may still have written something useful
                self._ingest(ctx, quarantine, out, pid, live=True, model=model, job=job)
            self._count(outcome)
            log.info("capture of pid %d (%s): %s", pid, reason, outcome)
        except Exception as exc:  # in a pool thread, where nobody would see it: one window fails, not the source
            self._count("failed")
            log.debug("capture of pid %d failed", pid, exc_info=exc)
            ctx.problem(
                self.name,
                os.fspath(out),
                "capture",
                f"capture of pid {pid} failed: {type(exc).__name__}: {exc}",
                fatal=False,
                count=1,
            )
        finally:
            with self._lock:
                self._running.discard(pid)
            if not cfg.keep_outputs:
                shutil.rmtree(out, ignore_errors=True)
            self.completed += 1
            self._wake.set()

    def _pmc_args(self) -> list[str]:
        """``--pmc`` and the next counter group in turn (nothing without groups)."""
        groups = self.config.pmc
        if not groups:
            return []
        with self._lock:
            group = groups[self._pmc_turn % len(groups)]
            self._pmc_turn += 1
        return ["--pmc", *group]

    def _execute(self, ctx: SourceContext, args: list[str], pid: int, out: Path) -> str:
        timeout = self.config.duration_ms / 1000 + self.config.timeout_s
        try:
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            ctx.problem(self.name, args[0], "capture", f"cannot run the capture command: {exc}", fatal=False, count=1)
            return "failed"
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            ctx.problem(
                self.name,
                os.fspath(out),
                "timeout",
                f"capture of pid {pid} killed after {timeout:.0f}s",
                fatal=False,
                count=1,
            )
            return "timeout"
        if proc.returncode != 0:
            tail = (err or b"").decode(errors="replace").strip().splitlines()[-3:]
            ctx.problem(
                self.name,
                args[0],
                "capture",
                f"capture of pid {pid} exited {proc.returncode}: " + " | ".join(tail),
                fatal=False,
                count=1,
            )
            return "failed"
        return "ok"

    def _ingest(
        self,
        ctx: SourceContext,
        quarantine: Quarantine,
        out: Path,
        pid: int,
        *,
        live: bool,
        model: str | None,
        job: JobFields | None = None,
    ) -> None:
        """Read every trace a window left in ``out``; ``model``, ``job``: the process's (None: the files say)."""
        cfg = self.config
        jobs = {"job": resolve(JobFields(job=cfg.job), job), "jobs": self._jobs, "model_configured": bool(cfg.model)}
        limits = cfg.trace_limits()
        files = []
        found = expand_paths([out])
        for skipped in found.not_read:  # beside the traces: the --pmc counters are read, the rest is not
            if skipped.path.name.endswith("counter_collection.csv"):
                publish_capture(ctx, self.name, skipped.path, model=model)
        for path in found.files:
            try:
                if path.stat().st_size <= cfg.max_file_bytes:
                    files.append(replace(identify(path), limits=limits))
            except (TraceFormatError, OSError):
                continue  # profilers leave logs and metadata beside their traces
            except Exception as exc:  # recognising it failed: that file is lost, not the window
                file_failed(ctx, self.name, path, exc, quarantine)
        files.sort(key=lambda tf: (tf.format not in ITERATIONS_FIRST, str(tf.path)))
        for tf in files:
            tctx = cfg.trace_context(tf, node=ctx.node, source=self.name, model=model, pid=pid, **jobs)
            # keyed by the capture (two windows can write identical bytes), so a crash mid-ingest resumes it
            key = f"{self.name}:{out.name}:{tf.path.relative_to(out)}"
            ingest_file(ctx, self.name, tf, tctx, quarantine, key=key, max_bytes=cfg.max_file_bytes, live=live)


def create(config: CaptureConfig, name: str) -> CaptureSource:
    """Factory used by the source registry."""
    return CaptureSource(config, name)
