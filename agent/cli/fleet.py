"""``aaco fleet``: questions asked of the lakes of many nodes at once, on DuckDB in process (docs/fleet.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any

import typer

from aaco.agent.cli.common import AsJson, fail, out_console, table

fleet_app = typer.Typer(
    help="Query the lake of a fleet of nodes (per node, per model, outliers).", no_args_is_help=True
)

LakeUrl = Annotated[
    str, typer.Option("--lake", "-l", help="The lake: a directory (or file://) holding every node's parts.")
]
Since = Annotated[
    str | None,
    typer.Option("--since", help="Only events of the last DURATION (e.g. 30m, 24h, 7d).", metavar="DURATION"),
]


def _query(lake: str, since: str | None, ask: Callable[[Any], Any]) -> Any:
    """Open the lake, ask one question, and turn a bad lake or duration into one error line (exit 2)."""
    from aaco.agent.fleet.lake import FleetError, FleetLake, parse_duration

    try:
        since_ns = parse_duration(since) if since else None  # a usage error before any reading
        con = FleetLake.open(lake).connect(since_ns)
    except FleetError as exc:
        raise fail(exc) from None
    with con:
        return ask(con)


def _print(rows: Any, as_json: bool, columns: list[tuple[str, str]], title: str) -> None:
    if as_json:
        typer.echo(json.dumps(rows, default=str))
        return
    items = rows["nodes"] if isinstance(rows, dict) else rows
    out = table(
        *(c for c, _ in columns), right={c for c, k in columns if k not in ("node", "model", "models")}, title=title
    )
    for row in items:
        out.add_row(*(_cell(row.get(k)) for _, k in columns))
    out_console.print(out)


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return ", ".join(map(str, v))
    return str(v)


@fleet_app.command("summary")
def summary(lake: LakeUrl, since: Since = None, as_json: AsJson = False) -> None:
    """Per node: kernels, iterations and models."""
    from aaco.agent.fleet import queries

    rows = _query(lake, since, queries.summary)
    _print(
        rows,
        as_json,
        [("node", "node"), ("kernels", "kernels"), ("iterations", "iterations"), ("models", "models")],
        "fleet",
    )


@fleet_app.command("nodes")
def nodes(lake: LakeUrl, since: Since = None, as_json: AsJson = False) -> None:
    """Per node: kernels, devices, GPU busy seconds and the time span covered."""
    from aaco.agent.fleet import queries

    rows = _query(lake, since, queries.nodes)
    cols = [
        ("node", "node"),
        ("kernels", "kernels"),
        ("devices", "devices"),
        ("busy s", "busy_s"),
        ("span s", "span_s"),
    ]
    _print(rows, as_json, cols, "nodes")


@fleet_app.command("models")
def models(lake: LakeUrl, since: Since = None, as_json: AsJson = False) -> None:
    """Per model and node: iterations, latency p50/p95/p99 and kernels per iteration."""
    from aaco.agent.fleet import queries

    rows = _query(lake, since, queries.models)
    cols = [
        ("model", "model"),
        ("node", "node"),
        ("iterations", "iterations"),
        ("p50 s", "p50_s"),
        ("p95 s", "p95_s"),
        ("p99 s", "p99_s"),
        ("kernels/iter", "kernels_per_iteration"),
    ]
    _print(rows, as_json, cols, "models")


@fleet_app.command("outliers")
def outliers(lake: LakeUrl, since: Since = None, as_json: AsJson = False) -> None:
    """Nodes whose p95 latency for a model sits far from the fleet's (modified z-score, docs/fleet.md)."""
    from aaco.agent.fleet import queries

    rows = _query(lake, since, queries.outliers)
    cols = [
        ("model", "model"),
        ("node", "node"),
        ("p95 s", "p95_s"),
        ("fleet median p95 s", "fleet_median_p95_s"),
        ("modified z", "modified_z"),
        ("nodes", "nodes"),
    ]
    _print(rows, as_json, cols, "outliers")
