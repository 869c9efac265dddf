"""Run a command as a person does, at a terminal: a pseudo-terminal of a given size for stdin, stdout and stderr.

What comes back is what the person would see: the bytes the program wrote, with the terminal's own
control sequences (colours, cursor moves of a progress bar) taken out by ``screen_lines``.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import termios
import time
from dataclasses import dataclass
from pathlib import Path

# CSI sequences (colours, cursor moves, erase), OSC sequences (titles, links), and single-character
# escapes; what remains is the text the terminal shows.
_ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


@dataclass
class TerminalRun:
    """A finished command: its exit status, what it wrote (raw), the terminal's size."""

    args: list[str]
    returncode: int
    raw: str
    columns: int

    @property
    def text(self) -> str:
        """What was written, without control sequences, carriage returns folded as a terminal does."""
        return "\n".join(screen_lines(self.raw))

    def wide_lines(self) -> list[str]:
        """The lines wider than the terminal (a terminal would have wrapped or cut them)."""
        return [line for line in screen_lines(self.raw) if len(line) > self.columns]

    def describe(self) -> str:
        """For assertion messages: the command, its status and its screen."""
        return f"$ {' '.join(self.args)}  (exit {self.returncode}, {self.columns} columns)\n{self.text}"


def screen_lines(raw: str) -> list[str]:
    """The lines a terminal shows for ``raw``: escapes dropped, a carriage return starts the line over."""
    lines = []
    for line in _ESCAPES.sub("", raw).replace("\r\n", "\n").split("\n"):
        lines.append(line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r"))
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def run_in_terminal(
    args: list[str],
    *,
    columns: int = 80,
    rows: int = 24,
    timeout: float = 240.0,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> TerminalRun:
    """Run ``args`` with a pseudo-terminal of ``columns`` x ``rows`` as its controlling terminal; wait for it.

    COLUMNS, LINES and TERMINAL_WIDTH are removed from the environment (a terminal user has the
    terminal's size, not a variable); TERM is xterm-256color unless ``env`` says otherwise.
    """
    full_env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "TERMINAL_WIDTH", "NO_COLOR")}
    full_env.setdefault("TERM", "xterm-256color")
    full_env.update(env or {})
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    proc = subprocess.Popen(
        args, stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=full_env, start_new_session=True, close_fds=True
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                raise TimeoutError(f"{args} did not finish in {timeout} s; so far:\n{b''.join(chunks).decode()}")
            ready, _, _ = select.select([master], [], [], min(left, 0.5))
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: every holder of the slave side has closed it
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None and not _readable(master):
                break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        os.close(master)
    return TerminalRun(list(args), proc.returncode, b"".join(chunks).decode(errors="replace"), columns)


def _readable(fd: int) -> bool:
    ready, _, _ = select.select([fd], [], [], 0.05)
    return bool(ready)
