"""Progress of long commands on stderr: bars at a terminal, a few plain lines when piped, or nothing.

A terminal gets rich's live bars (cleared when done); a pipe or a log file gets a line every
``PLAIN_EVERY_S`` while a task runs and one when it ends (none for a task shorter than that), so a CI
log shows that long work is moving without a line per step.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

from aaco.agent.cli.common import err_console, print_note, real_console

if TYPE_CHECKING:
    from rich.console import Console

PLAIN_EVERY_S = 5.0


class RichProgress:
    """Progress bars on stderr (rich), one per task; thread-safe."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=real_console(console),
            transient=True,
        )
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def start(self, task: str, total: int | None) -> None:
        """Begin a bar."""
        self._tasks[task] = self._progress.add_task(task, total=total)

    def advance(self, task: str, steps: int = 1) -> None:
        """Move a bar."""
        if task in self._tasks:
            self._progress.advance(self._tasks[task], steps)

    def finish(self, task: str) -> None:
        """Remove a finished bar."""
        tid = self._tasks.pop(task, None)
        if tid is not None:
            self._progress.remove_task(tid)


class PlainProgress:
    """Progress as plain lines on stderr, for work that lasts: every ``every_s`` while a task moves, then its end.

    A task over within ``every_s`` prints nothing.
    """

    def __init__(self, every_s: float = PLAIN_EVERY_S) -> None:
        self._every_s = every_s
        self._lock = threading.Lock()
        self._tasks: dict[str, _Task] = {}

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start(self, task: str, total: int | None) -> None:
        """Note when a task began."""
        with self._lock:
            self._tasks[task] = _Task(total, time.monotonic())

    def advance(self, task: str, steps: int = 1) -> None:
        """Count steps; say where the task is if it has run ``every_s`` since the last line (or its start)."""
        now = time.monotonic()
        with self._lock:
            state = self._tasks.get(task)
            if state is None:
                return
            state.done += steps
            if now - state.said < self._every_s:
                return
            state.said, state.lines = now, state.lines + 1
            line = f"{task}: {state.count()} ({now - state.started:.0f} s)"
        print_note(line)

    def finish(self, task: str) -> None:
        """Say a task ended, with its count and time, if anything was said of it before."""
        with self._lock:
            state = self._tasks.pop(task, None)
        if state is not None and state.lines:
            print_note(f"{task}: {state.count()}, done in {time.monotonic() - state.started:.1f} s")


class _Task:
    """A task's count, its total (None: unknown), when it started, when it was last said, how often."""

    def __init__(self, total: int | None, started: float) -> None:
        self.done = 0
        self.total = total
        self.started = started
        self.said = started
        self.lines = 0

    def count(self) -> str:
        return f"{self.done}/{self.total}" if self.total is not None else str(self.done)


def progress_for(enabled: bool) -> RichProgress | PlainProgress | None:
    """Bars when stderr is a terminal, plain lines when it is not, None when ``enabled`` is false."""
    if not enabled:
        return None
    return RichProgress(err_console) if err_console.is_terminal else PlainProgress()
