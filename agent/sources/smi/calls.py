"""Every backend call under a deadline: a hung tool is killed, a hung library call is abandoned.

``run_tool`` runs a command line in its own process group and kills the whole group (SIGKILL)
when it overruns, so a wedged ``amd-smi`` or ``nvidia-smi`` (and anything it started) never
stalls the agent. ``TimedCaller`` runs an in-process call (a library, sysfs reads: both can block
in the kernel on a wedged GPU) in a worker thread and stops waiting at the deadline; a thread
that is stuck cannot be killed, so it is left to finish on its own, and while ``max_stuck`` such
threads are still out no new call is started (the sample is skipped and counted instead), which
keeps the number of threads bounded. The worker thread is kept for the next call (a thread per
call cost about 0.15 ms each second); an abandoned one ends when its call returns, and an idle one
after ``idle_s``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aaco.contract.errors import AacoError

T = TypeVar("T")

MAX_OUTPUT_BYTES = 32 * 1024 * 1024


class BackendError(AacoError):
    """A backend call failed (the tool exited non-zero, the library raised); ``reason`` names the cause."""

    def __init__(self, message: str, *, subject: str, reason: str = "backend") -> None:
        super().__init__(message, subject=subject)
        self.reason = reason


class BackendTimeoutError(BackendError):
    """A backend call overran its deadline (the tool was killed, or the library call abandoned)."""

    def __init__(self, message: str, *, subject: str) -> None:
        super().__init__(message, subject=subject, reason="timeout")


def run_tool(argv: Sequence[str], timeout_s: float) -> bytes:
    """Run ``argv``, return its standard output; kill its process group if it takes longer than ``timeout_s``."""
    tool = os.path.basename(argv[0])
    try:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as exc:
        raise BackendError(f"cannot run {argv[0]}: {exc.strerror or exc}", subject=tool, reason="missing") from exc
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise BackendTimeoutError(f"no answer within {timeout_s:g}s; killed", subject=" ".join(argv)) from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise BackendError(f"exited with status {proc.returncode}: {tail[0][:200]}", subject=" ".join(argv))
    if len(out) > MAX_OUTPUT_BYTES:
        raise BackendError(f"printed {len(out)} bytes, more than {MAX_OUTPUT_BYTES}", subject=" ".join(argv))
    return out


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):  # a process in uninterruptible sleep: reaped when it wakes
        proc.communicate(timeout=5.0)


@dataclass
class _Call:
    """One call handed to a worker thread, and what came of it."""

    fn: Callable[[], Any]
    done: threading.Event = field(default_factory=threading.Event)
    value: Any = None
    error: BaseException | None = None
    overran: bool = False


class TimedCaller:
    """Runs in-process calls with a deadline, abandoning (and counting) the ones that hang."""

    def __init__(self, name: str, max_stuck: int = 1, idle_s: float = 60.0) -> None:
        self.name = name
        self.max_stuck = max_stuck
        self.idle_s = idle_s
        self._stuck = 0
        self._lock = threading.Lock()
        self._idle: queue.SimpleQueue[_Call | None] | None = None  # the inbox of the waiting worker

    @property
    def stuck(self) -> int:
        """Calls that overran and have not returned yet."""
        with self._lock:
            return self._stuck

    def call(self, fn: Callable[[], T], timeout_s: float) -> T:
        """``fn()`` within ``timeout_s``, or ``BackendTimeoutError`` (also when earlier calls are still stuck)."""
        job = _Call(fn)
        with self._lock:
            if self._stuck >= self.max_stuck:
                raise BackendTimeoutError(
                    f"{self._stuck} earlier call(s) still hung; not calling again", subject=self.name
                )
            inbox, self._idle = self._idle, None
            if inbox is None:
                inbox = queue.SimpleQueue()
                threading.Thread(target=self._work, args=(inbox,), name=f"aaco-{self.name}-call", daemon=True).start()
            inbox.put(job)
        if not job.done.wait(timeout_s):
            with self._lock:
                if not job.done.is_set():
                    job.overran = True
                    self._stuck += 1
            if job.overran:
                raise BackendTimeoutError(f"no answer within {timeout_s:g}s; call abandoned", subject=self.name)
        if job.error is not None:
            raise job.error
        return job.value  # type: ignore[no-any-return]

    def close(self) -> None:
        """End the waiting worker thread (an abandoned one ends when its call returns)."""
        with self._lock:
            inbox, self._idle = self._idle, None
        if inbox is not None:
            inbox.put(None)

    def _work(self, inbox: queue.SimpleQueue[_Call | None]) -> None:
        while True:
            try:
                job = inbox.get(timeout=self.idle_s)
            except queue.Empty:
                with self._lock:
                    if self._idle is not inbox or not inbox.empty():
                        continue  # a call was just handed over
                    self._idle = None
                return
            if job is None:
                return
            try:
                job.value = job.fn()
            except BaseException as exc:  # handed to the caller's thread
                job.error = exc
            with self._lock:
                job.done.set()
                if job.overran:
                    self._stuck -= 1
                    return  # abandoned: a new worker took over; this one ends
                if self._idle is None:
                    self._idle = inbox
                    continue
            return  # another worker is already waiting
