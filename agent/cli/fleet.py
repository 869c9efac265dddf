"""``aaco fleet``: questions asked of the lakes of many nodes at once, on DuckDB in process (docs/fleet.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Final

import typer

from aaco.agent.cli.common import AsJson, fail, out_console, print_note, table

fleet_app = typer.Typer(
    help="Query the lake of a fleet of nodes (per node, per model, per training job, outliers).",
    no_args_is_help=True,
)

LakeUrl = Annotated[
    str,
    typer.Option(
        "--lake",
        "-l",
        help="The lake holding every node's parts: a directory, file://DIR, s3://BUCKET/PREFIX (AWS_ENDPOINT_URL, "
        "AWS_REGION, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the AWS credential chain), gs://BUCKET/PREFIX or "
        "abfs://CONTAINER@ACCOUNT/PREFIX.",
        metavar="URL",
    ),
]
Since = Annotated[
    str | None,
    typer.Option("--since", help="Only events of the last DURATION (e.g. 30m, 24h, 7d).", metavar="DURATION"),
]


def query_lake(lake: str, since: str | None, ask: Callable[[Any], Any]) -> Any:
    """Open the lake, ask one question, and turn a bad lake or duration into one error line (exit 2)."""
    from aaco.agent.cli.runner import keep_pandas_out

    keep_pandas_out()  # pyarrow's dataset module would import pandas (0.2 s); no fleet question uses it
    from aaco.agent.fleet.lake import FleetError, FleetLake, parse_duration

    try:
        since_ns = parse_duration(since) if since else None  # a usage error before any reading
        con = FleetLake.open(lake).connect(since_ns)
    except FleetError as exc:
        raise fail(exc) from None
    with con:
        return ask(con)


_TEXT = frozenset({"node", "model", "models", "family", "top_families", "op"})


def _print(
    rows: Any, as_json: bool, columns: list[tuple[str, str]], title: str, text: frozenset[str] = frozenset()
) -> None:
    if as_json:
        typer.echo(json.dumps(rows, default=str))
        return
    items = rows["nodes"] if isinstance(rows, dict) else rows
    if not items:
        print_note(f"{title}: nothing in the lake (for the time asked)")
        return
    out = table(
        *(c for c, _ in columns),
        right={c for c, k in columns if k not in _TEXT and k not in text},
        title=title,
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
        return ", ".join(_cell(x) for x in v)
    if isinstance(v, dict) and "family" in v:
        return v["family"] if v.get("share") is None else f"{v['family']} {v['share']:.0%}"
    return str(v)


@fleet_app.command("summary")
def summary(lake: LakeUrl, since: Since = None, as_json: AsJson = False) -> None:
    """Per node: kernels, iterations and models."""
    from aaco.agent.fleet import queries

    rows = query_lake(lake, since, queries.summary)
    _print(
        rows,
        as_json,
        [("node", "node"), ("kernels", "kernels"), ("iterations", "iterations"), ("models", "models")],
        "fleet",
    )


@fleet_app.command("nodes")
def nodes(lake: LakeUrl, since: Since = None, as_json: AsJson = False) -> None:
    """Per node: kernels, devices, GPU busy s, span, device active ratio, throttled share, top kernel families."""
    from aaco.agent.fleet import queries

    rows = query_lake(lake, since, queries.nodes)
    cols = [
        ("node", "node"),
        ("kernels", "kernels"),
        ("devices", "devices"),
        ("busy s", "busy_s"),
        ("span s", "span_s"),
        ("active", "active_ratio"),
        ("throttled", "throttled_share"),
        ("top families", "top_families"),
    ]
    _print(rows, as_json, cols, "nodes")


@fleet_app.command("models")
def models(
    lake: LakeUrl,
    since: Since = None,
    as_json: AsJson = False,
    by_version: Annotated[
        bool,
        typer.Option(
            "--by-version",
            help="One row per model, node and the versions in force (driver, ROCm, CUDA, ONNX Runtime, ...).",
        ),
    ] = False,
) -> None:
    """Per model and node: iterations, p50/p95/p99, kernels/iteration, KAR, activity, throttling, families."""
    from aaco.agent.fleet import queries

    if by_version:
        from aaco.contract.versions import FIELDS as VERSION_FIELDS

        rows = query_lake(lake, since, queries.models_by_version)
        cols = [("model", "model"), ("node", "node"), *((f, f) for f in VERSION_FIELDS if f != "aaco_version")]
        cols += [("iterations", "iterations"), ("p50 s", "p50_s"), ("p95 s", "p95_s"), ("p99 s", "p99_s")]
        _print(rows, as_json, cols, "models by version", text=frozenset(VERSION_FIELDS))
        return
    rows = query_lake(lake, since, queries.models)
    cols = [
        ("model", "model"),
        ("node", "node"),
        ("iterations", "iterations"),
        ("p50 s", "p50_s"),
        ("p95 s", "p95_s"),
        ("p99 s", "p99_s"),
        ("kernels/iter", "kernels_per_iteration"),
        ("KAR", "kar"),
        ("active", "active_ratio"),
        ("throttled", "throttled_share"),
        ("top families", "top_families"),
    ]
    _print(rows, as_json, cols, "models")


@fleet_app.command("families")
def families(lake: LakeUrl, since: Since = None, as_json: AsJson = False) -> None:
    """Per node, model and kernel family: kernels, GPU time and its share of the model's kernel time."""
    from aaco.agent.fleet import queries

    rows = query_lake(lake, since, queries.families)
    cols = [
        ("node", "node"),
        ("model", "model"),
        ("family", "family"),
        ("kernels", "kernels"),
        ("time s", "time_s"),
        ("share", "share"),
    ]
    _print(rows, as_json, cols, "kernel families")


@fleet_app.command("outliers")
def outliers(lake: LakeUrl, since: Since = None, as_json: AsJson = False) -> None:
    """Nodes whose p95 latency for a model sits far from the fleet's (modified z-score, docs/fleet.md)."""
    from aaco.agent.fleet import queries

    rows, scope = query_lake(lake, since, lambda con: (queries.outliers(con), queries.outlier_scope(con)))
    if not rows and not as_json:
        print_note(_no_outliers(scope, queries.MIN_NODES))
        return
    cols = [
        ("model", "model"),
        ("node", "node"),
        ("p95 s", "p95_s"),
        ("fleet median p95 s", "fleet_median_p95_s"),
        ("modified z", "modified_z"),
        ("nodes", "nodes"),
    ]
    _print(rows, as_json, cols, "outliers")


def _no_outliers(scope: dict[str, int], min_nodes: int) -> str:
    """Why ``fleet outliers`` found none: no latency at all, too few nodes per model, or every node near the fleet."""
    if not scope:
        return "no outliers: no model has iterations (latency) in the lake"
    judged = {m: n for m, n in scope.items() if n >= min_nodes}
    few = ", ".join(f"{m} on {n} node(s)" for m, n in scope.items() if n < min_nodes)
    if not judged:
        return f"no outliers: too few nodes to compare ({min_nodes} needed per model): {few}"
    nodes = ", ".join(f"{m} on {n} nodes" for m, n in judged.items())
    return f"no outliers: every node's p95 is near the fleet's ({nodes})" + (
        f"; too few nodes to compare {few}" if few else ""
    )


@fleet_app.command("jobs")
def jobs(lake: LakeUrl, since: Since = None, as_json: AsJson = False) -> None:
    """Per training job: ranks and nodes, step p50/p95, HTA's breakdown, overlap and critical path, collectives."""
    from aaco.agent.fleet import jobs as fleet_jobs

    doc = query_lake(lake, since, fleet_jobs.jobs)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    if not doc["jobs"]:
        print_note("jobs: no distributed job in the lake (rows with a job and a rank, for the time asked)")
    for i, job in enumerate(doc["jobs"]):
        if i:
            out_console.print()
        _print_job(job)
    if doc["slurm_jobs"]:
        if doc["jobs"]:
            out_console.print()
        _print(doc["slurm_jobs"], False, _SLURM_COLUMNS, "Slurm jobs on GPUs", _SLURM_TEXT)


_RANK_COLUMNS: Final = [
    ("rank", "rank"),
    ("node", "node"),
    ("step p50 s", "step_p50_s"),
    ("step p95 s", "step_p95_s"),
    ("idle %", "idle_pct"),
    ("compute %", "compute_pct"),
    ("non-compute %", "non_compute_pct"),
    ("overlap %", "comm_comp_overlap_pct"),
    ("straggler", "straggler"),
]
_BOUNDS: Final = ("cpu", "compute", "comm", "launch", "gap")
_SLURM_COLUMNS: Final = [
    ("job", "job"),
    ("user", "user"),
    ("partition", "partition"),
    ("nodes", "nodes"),
    ("GPUs", "gpus"),
    ("utilisation", "utilization"),
    ("power W", "power_w"),
]
_SLURM_TEXT: Final = frozenset({"job", "user", "partition", "nodes", "gpus"})


def _pct2(row: dict[str, Any]) -> dict[str, Any]:
    """Percentages to HTA's two decimals for the eye (``--json`` keeps them whole)."""
    return {k: round(v, 2) if k.endswith("_pct") and isinstance(v, float) else v for k, v in row.items()}


def _print_job(job: dict[str, Any]) -> None:
    """One job: a heading, its ranks, their critical paths, its collectives."""
    stragglers = ", ".join(map(str, job["stragglers"])) or "none"
    out_console.print(
        f"job {job['job']}: world size {job['world_size'] or '?'}, {job['backend'] or 'backend ?'}, "
        f"{len(job['ranks'])} rank(s) on {', '.join(job['nodes'])}; stragglers: {stragglers}",
        markup=False,
        highlight=False,
    )
    ranks = [_pct2({**r, "straggler": "yes" if r["rank"] in job["stragglers"] else ""}) for r in job["ranks"]]
    _print(ranks, False, _RANK_COLUMNS, "ranks", frozenset({"straggler"}))
    paths = [_pct2({"rank": r["rank"], **r["critical_path"]}) for r in job["ranks"] if r["critical_path"]]
    if paths:
        cols = [("rank", "rank"), ("steps", "steps"), ("path p50 s", "length_p50_s")]
        _print(paths, False, [*cols, *((f"{b} %", f"{b}_pct") for b in _BOUNDS)], "critical path (HTA)")
    if job["collectives"]:
        cols = [("op", "op"), ("count", "count"), ("time s", "time_s"), ("bus GB/s", "bus_bandwidth_gbps")]
        _print(job["collectives"], False, cols, "collectives")
