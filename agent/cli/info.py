"""``aaco metrics`` and ``aaco version``: what the agent exports, and the versions it runs with."""

from __future__ import annotations

import json
import platform
from typing import TYPE_CHECKING, Annotated

import typer

from aaco.agent.cli.common import AsJson, out_console
from aaco.agent.cli.tables import wrap_text
from aaco.contract.version import version as aaco_version

if TYPE_CHECKING:
    from aaco.contract.signals import MetricDef


def metrics(
    markdown: Annotated[bool, typer.Option("--markdown", help="Print the table of docs/metrics.md.")] = False,
    as_json: AsJson = False,
) -> None:
    """List every metric the agent exports: Prometheus and OpenTelemetry names, type, unit, labels.

    One block per metric: its Prometheus name, type and unit on the first line, then its OpenTelemetry
    name and labels, then what it measures.
    """
    from rich.text import Text

    from aaco.agent.metrics_doc import all_metrics, markdown_table, prom_exposed_name

    if markdown:
        typer.echo(markdown_table())
        return
    defs = all_metrics()
    if as_json:
        typer.echo(json.dumps([_metric_doc(m, prom_exposed_name(m)) for m in defs]))
        return
    for n, m in enumerate(defs):
        head = Text(prom_exposed_name(m), style="bold")
        head.append(f"  {m.kind}  {m.unit}", style="default")
        if n:
            out_console.print()
        out_console.print(head, overflow="fold")
        labels = ", ".join(m.labels) or "none"
        for line in (f"OpenTelemetry {m.otel_name}; labels: {labels}", m.description):
            for part in wrap_text(out_console, line, out_console.width - 2):
                out_console.print(f"  {part}", soft_wrap=True, highlight=False, markup=False)


def _metric_doc(m: MetricDef, exposed: str) -> dict[str, object]:
    return {
        "prometheus": exposed,
        "opentelemetry": m.otel_name,
        "type": m.kind,
        "unit": m.unit,
        "labels": list(m.labels),
        "description": m.description,
    }


def version(as_json: AsJson = False) -> None:
    """Print the versions of AACO and of the runtimes it uses."""
    import onnxruntime
    import pyarrow

    doc = {
        "aaco": aaco_version(),
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "pyarrow": pyarrow.__version__,
    }
    if as_json:
        typer.echo(json.dumps(doc))
        return
    out_console.print(
        f"aaco {doc['aaco']} (python {doc['python']}, onnxruntime {doc['onnxruntime']}, pyarrow {doc['pyarrow']})",
        highlight=False,
    )
