"""The ``aaco`` command line: the typer app, its commands (one module per group) and ``main``.

Exit codes: 0 success; 1 an unexpected failure (a bug: the log says where); 2 bad usage or bad
input (a missing or corrupt file, a config that does not validate), reported as one clear line
naming the file and what is wrong, without a traceback; 3 (``aaco replay``) spans or metrics it was
asked to send over OTLP were dropped (upstream down or refusing, queue or byte budget full, shutdown
deadline), said with how many and why. Damaged input and lost data together exit 2 (the input is
the first thing to fix; both are said). ``aaco agent``, a daemon, stopped by a signal
exits 0 whatever input it met: bad input is counted, quarantined and logged as it is met, and a
non-zero status would read as a crash to the supervisor that stopped it (Kubernetes, systemd).

The command modules import ``aaco.agent.cli.common`` and never this package; they import what their
command runs (the config, the service, the sources) inside the command, so ``aaco --version`` and
``aaco --help`` load none of it.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from aaco.agent.cli import capture, fleet, graph, health, info, roofline, run, sched, telemetry, verdict
from aaco.agent.cli.common import widen_help
from aaco.agent.cli.config import config_app
from aaco.contract.version import version as aaco_version

HELP_FLAGS = frozenset(("-h", "--help"))


class _Group(TyperGroup):
    """The root command group: gives typer's help and error console its width only when it prints.

    ``widen_help`` imports typer's rich formatting (rich, markdown-it, pygments: ~7 MiB of RSS), so it
    runs when help may be printed (no arguments, or ``-h``/``--help`` anywhere: at worst an import too
    many) or when a usage error or abort is on its way to being printed, never for a command that runs.
    """

    def make_context(
        self, info_name: str | None, args: list[str], parent: typer.Context | None = None, **extra: Any
    ) -> Any:
        """Parse the root's options; widen first when help may follow."""
        if not args or not HELP_FLAGS.isdisjoint(args):
            widen_help()
        return _widening(super().make_context, info_name, args, parent, **extra)

    def invoke(self, ctx: typer.Context) -> Any:
        """Run the command; widen before a usage error or an abort is printed."""
        return _widening(super().invoke, ctx)


def _widening(call: Any, *args: Any, **kwargs: Any) -> Any:
    """``call(*args, **kwargs)``, widening typer's console when it raises what typer prints with it."""
    try:
        return call(*args, **kwargs)
    except (typer.TyperException, typer.Abort):
        widen_help()
        raise


app = typer.Typer(
    name="aaco",
    cls=_Group,
    help="AACO: GPU observability agent. Kernel traces, GPU telemetry and scheduler events become "
    "OpenTelemetry traces and metrics, Prometheus metrics and a Parquet lake, with analyzers that "
    "say where the time went and why latency changed.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    add_completion=True,
)


def _print_version(value: bool) -> None:
    """``--version``: print the version and exit, before any command or option is looked at."""
    if value:
        typer.echo(f"aaco {aaco_version()}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", "-V", is_eager=True, callback=_print_version, help="Print the version of AACO and exit."
        ),
    ] = False,
) -> None:
    """AACO: GPU observability agent."""


app.command(epilog=run.RUN_EPILOG)(run.run)
app.command(epilog=run.REPLAY_EPILOG)(run.replay)
app.command(epilog=run.AGENT_EPILOG)(run.agent)
app.command()(capture.capture)
app.command()(verdict.diff)
app.add_typer(verdict.baseline_app, name="baseline")
app.add_typer(fleet.fleet_app, name="fleet")
app.command()(sched.sched)
app.command()(telemetry.telemetry)
app.command()(health.health)
app.command()(roofline.roofline)
app.add_typer(config_app, name="config")
app.command()(graph.graph)
app.command()(info.metrics)
app.command()(info.version)


def main() -> None:
    """Console-script entry point."""
    app(prog_name="aaco")
