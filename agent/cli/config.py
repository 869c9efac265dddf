"""``aaco config check`` and ``aaco config example``: validate a configuration, print an annotated one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from aaco.agent.cli.common import AsJson, err_console, out_console

config_app = typer.Typer(help="Work with agent configuration files.", no_args_is_help=True)


@config_app.command("check")
def check(
    file: Annotated[Path, typer.Argument(help="The YAML configuration to validate.")],
    as_json: AsJson = False,
) -> None:
    """Validate a configuration (with AACO_* environment overrides) and list every error with its path."""
    from aaco.agent.config import load_config
    from aaco.contract.errors import ConfigError

    try:
        cfg = load_config(file)
    except ConfigError as exc:  # every error, one per line under the file's name
        if as_json:
            typer.echo(json.dumps({"file": str(file), "ok": False, "errors": exc.problems}))
        else:
            err_console.print(str(exc), highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(2) from None
    kinds = [s.type for s in cfg.sources]
    if as_json:
        typer.echo(json.dumps({"file": str(file), "ok": True, "node": cfg.node, "sources": kinds}))
        return
    out_console.print(f"{file}: ok (node {cfg.node}; sources: {', '.join(kinds) or 'none'})", highlight=False)


@config_app.command("example")
def example() -> None:
    """Print an annotated configuration with every key, its default and what it does."""
    from aaco.agent.config_doc import example_config

    typer.echo(example_config(), nl=False)
