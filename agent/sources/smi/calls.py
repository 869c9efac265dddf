"""Every backend call under a deadline: a hung tool is killed, a hung library call is abandoned.

``run_tool`` runs a command line in its own process group and kills the whole group (SIGKILL)
when it overruns, so a wedged ``amd-smi`` or ``nvidia-smi`` (and anything it started) never
stalls the agent. ``TimedCaller`` runs an in-process call (a library, sysfs reads: both can block
in the kernel on a wedged GPU) in a worker thread and stops waiting at the deadline; a thread
that is stuck cannot be killed, so it is left to finish on its own, and while ``max_stuck`` such
threads are still out no new call is started (the sample is skipped and counted instead), which
keeps the number of threads bounded.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from aaco.agent.errors import AacoError

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


class TimedCaller:
    """Runs in-process calls with a deadline, abandoning (and counting) the ones that hang."""

    def __init__(self, name: str, max_stuck: int = 1) -> None:
        self.name = name
        self.max_stuck = max_stuck
        self._stuck = 0
        self._lock = threading.Lock()

    @property
    def stuck(self) -> int:
        """Calls that overran and have not returned yet."""
        with self._lock:
            return self._stuck

    def call(self, fn: Callable[[], T], timeout_s: float) -> T:
        """``fn()`` within ``timeout_s``, or ``BackendTimeoutError`` (also when earlier calls are still stuck)."""
        with self._lock:
            if self._stuck >= self.max_stuck:
                raise BackendTimeoutError(
                    f"{self._stuck} earlier call(s) still hung; not calling again", subject=self.name
                )
        box: dict[str, object] = {}
        done = threading.Event()
        overran = threading.Event()

        def work() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:  # handed to the caller's thread
                box["error"] = exc
            finally:
                with self._lock:
                    if overran.is_set():
                        self._stuck -= 1
                    done.set()

        thread = threading.Thread(target=work, name=f"aaco-{self.name}-call", daemon=True)
        thread.start()
        if not done.wait(timeout_s):
            with self._lock:
                if not done.is_set():
                    overran.set()
                    self._stuck += 1
            if overran.is_set():
                raise BackendTimeoutError(f"no answer within {timeout_s:g}s; call abandoned", subject=self.name)
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return box["value"]  # type: ignore[return-value]
