"""``aaco metrics`` and ``aaco version``: what the agent exports, and the versions it runs with."""

from __future__ import annotations

import platform
from typing import Annotated

import typer

from aaco.agent.cli.common import out_console, table
from aaco.contract.version import version as aaco_version


def metrics(
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the table of docs/metrics.md.")] = False,
) -> None:
    """List every metric the agent exports: Prometheus and OpenTelemetry names, type, unit, labels."""
    from aaco.agent.metrics_doc import all_metrics, markdown_table, prom_exposed_name

    if markdown:
        typer.echo(markdown_table())
        return
    out = table("prometheus", "type", "unit", "labels", "description")
    for m in all_metrics():
        out.add_row(prom_exposed_name(m), m.kind, m.unit, ",".join(m.labels), m.description)
    out_console.print(out)


def version() -> None:
    """Print the versions of AACO and of the runtimes it uses."""
    import onnxruntime
    import pyarrow

    out_console.print(
        f"aaco {aaco_version()} (python {platform.python_version()}, onnxruntime {onnxruntime.__version__}, "
        f"pyarrow {pyarrow.__version__})",
        highlight=False,
    )
