"""Errors a user can act on: each names the file (or flag) at fault and what to do about it."""

from __future__ import annotations

import os


class AacoError(Exception):
    """A problem with the user's input, reported as one line without a traceback (CLI exit 2).

    ``subject`` is the file, flag or config path at fault; ``hint`` says how to fix it.
    """

    def __init__(self, message: str, *, subject: str | os.PathLike[str] | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.subject = os.fspath(subject) if subject is not None else None
        self.hint = hint

    def __str__(self) -> str:
        text = f"{self.subject}: {self.message}" if self.subject else self.message
        return f"{text} ({self.hint})" if self.hint else text


class ConfigError(AacoError):
    """A configuration that does not validate; ``problems`` lists every error with its path."""

    def __init__(self, path: str | os.PathLike[str] | None, problems: list[str]) -> None:
        where = os.fspath(path) if path is not None else "<config>"
        super().__init__(f"{len(problems)} error(s) in configuration", subject=where)
        self.problems = problems

    def __str__(self) -> str:
        lines = [f"{self.subject}: {len(self.problems)} error(s) in configuration"]
        lines += [f"  {self.subject}: {p}" for p in self.problems]
        return "\n".join(lines)


class TraceFormatError(AacoError):
    """A trace file that cannot be read or recognised at all (bad rows inside a good file are skipped)."""
