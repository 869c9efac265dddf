"""Progress of long commands on stderr: bars at a terminal, a few plain lines when piped, or nothing.

A terminal gets rich's live bars (cleared when done); a pipe or a log file gets one line when a task
starts, one at most every ``PLAIN_EVERY_S`` while it runs, and one when it ends, so a CI log shows
that work is moving without a line per step.
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
    """Progress as plain lines on stderr: a task's start, every ``every_s`` while it moves, its end."""

    def __init__(self, every_s: float = PLAIN_EVERY_S) -> None:
        self._every_s = every_s
        self._lock = threading.Lock()
        self._tasks: dict[str, list[float]] = {}  # task -> [done, total (-1: unknown), started, last printed]

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def start(self, task: str, total: int | None) -> None:
        """Say a task began."""
        now = time.monotonic()
        with self._lock:
            self._tasks[task] = [0, -1 if total is None else total, now, now]
        print_note(f"{task}: {self._count(0, total)}")

    def advance(self, task: str, steps: int = 1) -> None:
        """Count steps; say where the task is if the last line is ``every_s`` old."""
        now = time.monotonic()
        with self._lock:
            state = self._tasks.get(task)
            if state is None:
                return
            state[0] += steps
            if now - state[3] < self._every_s:
                return
            state[3] = now
            line = f"{task}: {self._count(state[0], state[1])}"
        print_note(line)

    def finish(self, task: str) -> None:
        """Say a task ended, with its count and time."""
        with self._lock:
            state = self._tasks.pop(task, None)
        if state is not None:
            done, total, started, _ = state
            print_note(f"{task}: {self._count(done, total)}, done in {time.monotonic() - started:.1f} s")

    @staticmethod
    def _count(done: float, total: float | None) -> str:
        return f"{int(done)}/{int(total)}" if total is not None and total >= 0 else f"{int(done)}"


def progress_for(enabled: bool) -> RichProgress | PlainProgress | None:
    """Bars when stderr is a terminal, plain lines when it is not, None when ``enabled`` is false."""
    if not enabled:
        return None
    return RichProgress(err_console) if err_console.is_terminal else PlainProgress()
