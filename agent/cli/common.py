"""What every ``aaco`` command shares: the consoles, error lines, logging, common options, tables, config loading.

Output to a terminal takes the terminal's width. Output to a pipe or a file (CI logs, scripts) is
``PIPED_WIDTH`` columns wide unless ``COLUMNS`` or ``TERMINAL_WIDTH`` say otherwise: rich would assume
80 and cut table cells and help text. Error and warning lines to a pipe or a file are never hard-wrapped: one
line per message, whatever the width, so a log reader or ``grep`` sees the whole message; at a
terminal they wrap between words, as the tables do (``aaco.agent.cli.tables``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, cast

import typer

from aaco.contract.errors import AacoError

if TYPE_CHECKING:  # the config models cost ~0.2 s to import: loaded by the commands that read a config
    from rich.console import Console

    from aaco.agent.cli.tables import FitTable
    from aaco.agent.config import AgentConfig

PIPED_WIDTH = 160  # columns for tables, help and usage errors when the stream is not a terminal

LOG_LEVEL_HELP = "debug, info, warning or error."
LogLevel = Annotated[str, typer.Option("--log-level", help=LOG_LEVEL_HELP)]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def piped_width(stream: IO[str]) -> int | None:
    """``PIPED_WIDTH`` when ``stream`` is not a terminal and neither COLUMNS nor TERMINAL_WIDTH is set, else None."""
    if stream.isatty() or os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH"):
        return None
    return PIPED_WIDTH


class _LazyConsole:
    """A rich ``Console`` made on first use.

    rich, with the markdown and syntax modules typer's help pulls in, is ~7 MiB of RSS: a command
    that prints nothing through it (``aaco agent``, a daemon that logs) never imports it.
    """

    def __init__(self, stderr: bool) -> None:
        self._stderr = stderr
        self._console: Console | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real(), name)

    def real(self) -> Console:
        """The console itself, made now if need be (rich's live display needs a true ``Console``)."""
        if self._console is None:
            from rich.console import Console

            stream = sys.stderr if self._stderr else sys.stdout
            self._console = Console(stderr=self._stderr, width=piped_width(stream))
        return self._console


def real_console(console: Console) -> Console:
    """``console`` itself when it is one of the lazy consoles above (rich's live display enters it as a context)."""
    return console.real() if isinstance(console, _LazyConsole) else console


out_console = cast("Console", _LazyConsole(stderr=False))
err_console = cast("Console", _LazyConsole(stderr=True))


def widen_help() -> None:
    """Give typer's help and usage-error console ``PIPED_WIDTH`` columns when stdout is a pipe.

    typer reads TERMINAL_WIDTH into ``rich_utils.MAX_WIDTH`` (its documented knob); when that is set,
    it is left alone.
    """
    import typer.rich_utils

    if typer.rich_utils.MAX_WIDTH is None:
        typer.rich_utils.MAX_WIDTH = piped_width(sys.stdout)


def _say(text: str, *, markup: bool) -> None:
    """One message on stderr: a single line to a pipe or a log; at a terminal, wrapped between words to its width."""
    err_console.print(text, highlight=False, markup=markup, soft_wrap=not err_console.is_terminal)


def print_error(message: object) -> None:
    """One ``error:`` line on stderr (the message is printed as text, not markup)."""
    from rich.markup import escape

    _say(f"[bold red]error:[/] {escape(str(message))}", markup=True)


def print_warning(message: object) -> None:
    """One ``warning:`` line on stderr (the message is printed as text, not markup)."""
    from rich.markup import escape

    _say(f"[yellow]warning:[/] {escape(str(message))}", markup=True)


def print_note(message: object) -> None:
    """One plain line on stderr: what a command did, beside its output on stdout."""
    _say(str(message), markup=False)


def fail(exc: AacoError) -> typer.Exit:
    """Print ``exc`` as one error line and return the exit (status 2, bad usage or bad input) to raise."""
    print_error(exc)
    return typer.Exit(2)


class _ConsoleHandler(logging.Handler):
    """Log records printed through the stderr console: wrapped to a terminal, and above its progress bars."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            _say(self.format(record), markup=False)
        except Exception:
            self.handleError(record)


def setup_logging(level: str) -> None:
    """Log to stderr at ``level``: through the console at a terminal, as plain lines to a pipe or a file."""
    handler: logging.Handler = _ConsoleHandler() if sys.stderr.isatty() else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper(), logging.INFO), handlers=[handler], force=True)


def table(*columns: str, right: Collection[str] = (), title: str | None = None) -> FitTable:
    """A table that fits the console (``aaco.agent.cli.tables``); ``right`` columns are numbers, right-justified."""
    from aaco.agent.cli.tables import FitTable

    return FitTable(*columns, right=right, title=title)


def load_config_or_exit(path: Path | None, overrides: Mapping[str, Any] | None = None) -> AgentConfig:
    """The agent's config from ``path`` (None: the embedded default) with ``overrides``; exit 2 naming what is wrong."""
    from aaco.agent.config import load_config

    try:
        return load_config(path, overrides)
    except AacoError as exc:
        raise fail(exc) from None
