"""``aaco baseline save`` and ``aaco diff``: a lake's performance baseline, and a session's regression verdict.

``aaco diff`` exits 1 on a significant regression (for CI), 0 otherwise, 2 on bad input (a missing
or damaged lake or baseline, named in one line, or a session of another model than the baseline's
without ``--allow-model-change``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from aaco.agent.cli.common import AsJson, fail, out_console, print_warning, table
from aaco.contract.errors import AacoError

baseline_app = typer.Typer(help="Record a lake's performance baseline for later aaco diff.", no_args_is_help=True)

NO_MACHINE_HELP = (
    "Do not complete the environment from this machine (driver, ROCm/CUDA, ONNX Runtime, CPU): "
    "use it when the lake was recorded elsewhere."
)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v * 1e3:.3f}"


@baseline_app.command("save")
def baseline_save(
    lake: Annotated[Path, typer.Argument(help="Lake directory written by aaco run or aaco replay.")],
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Baseline file to write (default: LAKE/baseline.json).")
    ] = None,
    model: Annotated[
        list[str] | None, typer.Option("--model", "-m", help="Only this model (repeatable; default: every model).")
    ] = None,
    no_machine: Annotated[bool, typer.Option("--no-machine", help=NO_MACHINE_HELP)] = False,
    as_json: AsJson = False,
) -> None:
    """Save the baseline of a lake.

    Per model: latency samples, kernel counts, time per kernel family, the bottleneck class.

    The environment: GPU, driver, ROCm/CUDA, ONNX Runtime versions, clocks.
    """
    from aaco.agent.verdict.baselines import BASELINE_FILE, build_baseline, save_baseline
    from aaco.agent.verdict.lake import read_lake

    try:
        doc = build_baseline(read_lake(lake), models=model or None, machine=not no_machine)
        path = out or (lake / BASELINE_FILE)
        save_baseline(doc, path)
    except AacoError as exc:
        raise fail(exc) from None
    if as_json:
        models = {
            name: {
                "iterations": m["iterations"],
                "p50_s": m["latency"]["p50_s"],
                "p95_s": m["latency"]["p95_s"],
                "kernels_per_iteration": m["kernels_per_iteration"],
                "bottleneck": m.get("bottleneck"),
            }
            for name, m in doc["models"].items()
        }
        env = {k: v["value"] for k, v in doc["environment"].items() if k != "clocks"}
        typer.echo(json.dumps({"baseline": str(path), "models": models, "environment": env}, default=str))
        return
    out_table = table(
        "model",
        "iterations",
        "p50 ms",
        "p95 ms",
        "kernels/it",
        "bottleneck",
        right={"iterations", "p50 ms", "p95 ms", "kernels/it"},
    )
    for name, m in doc["models"].items():
        b = m.get("bottleneck") or {}
        cls = f"{b.get('bottleneck_class')} ({b.get('confidence', 0):.2f})" if b else "-"
        out_table.add_row(
            name,
            str(m["iterations"]),
            _ms(m["latency"]["p50_s"]),
            _ms(m["latency"]["p95_s"]),
            f"{m['kernels_per_iteration']:.1f}",
            cls,
        )
    out_console.print(out_table)
    env_table = table("environment", "value")
    for k, v in doc["environment"].items():
        if k != "clocks":
            value = v["value"]
            env_table.add_row(k, ", ".join(map(str, value)) if isinstance(value, list) else str(value))
    out_console.print(env_table)
    out_console.print(f"baseline: {path}", highlight=False, soft_wrap=not out_console.is_terminal)


def model_changes(verdict: dict[str, Any]) -> list[tuple[str, str]]:
    """(baseline model, session model) for each compared pair whose names differ."""
    verdicts = verdict.get("models") or {verdict.get("model"): verdict}
    return [(v["baseline_model"], str(name)) for name, v in verdicts.items() if v.get("baseline_model")]


def diff(
    baseline: Annotated[
        Path,
        typer.Option(
            "--baseline", "-b", help="Baseline file from aaco baseline save, or a lake directory to take as baseline."
        ),
    ],
    session: Annotated[Path, typer.Option("--session", "-s", help="Lake directory of the session to judge.")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Also write the verdict JSON to this file.")] = None,
    model: Annotated[str | None, typer.Option("--model", "-m", help="Compare only this model.")] = None,
    alpha: Annotated[
        float, typer.Option("--alpha", min=1e-9, max=0.5, help="Significance level of the Mann-Whitney U test.")
    ] = 0.01,
    threshold_pct: Annotated[
        float,
        typer.Option("--threshold-pct", min=0.0, help="Smallest rise of the median latency (%) that is a regression."),
    ] = 5.0,
    no_machine: Annotated[bool, typer.Option("--no-machine", help=NO_MACHINE_HELP)] = False,
    allow_model_change: Annotated[
        bool,
        typer.Option(
            "--allow-model-change", help="Judge a session of another model than the baseline's (else exit 2)."
        ),
    ] = False,
) -> None:
    """Judge a session against a baseline: exit 1 on a significant regression, 0 otherwise, 2 on bad input.

    A session whose model is not the baseline's is bad input (exit 2) unless --allow-model-change.

    The verdict, as JSON: latency change with its bootstrap confidence interval and Mann-Whitney p-value.

    Also kernel count and per-family time changes, the suspected cause, a severity, a recommendation.

    Warns when the environment (GPU, driver, versions, clocks) differs from the baseline's.
    """
    from aaco.agent.verdict.baselines import diff as judge
    from aaco.agent.verdict.baselines import load_baseline
    from aaco.agent.verdict.lake import read_lake

    try:
        base = load_baseline(baseline, machine=not no_machine)
        verdict, warnings = judge(
            base, read_lake(session), model=model, alpha=alpha, min_delta_pct=threshold_pct, machine=not no_machine
        )
        changed = model_changes(verdict)
        if changed and not allow_model_change:
            raise AacoError(
                "the session's model differs from the baseline's: "
                + "; ".join(f"baseline {b!r}, session {s!r}" for b, s in changed)
                + " (a latency change across models says nothing; --allow-model-change to compare anyway)",
                subject=session,
            )
        text = json.dumps(verdict, indent=2, default=str)
        if out is not None:
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(text + "\n")
            except OSError as exc:
                raise AacoError(f"cannot write the verdict ({exc.strerror or exc})", subject=out) from None
    except AacoError as exc:
        raise fail(exc) from None
    for w in warnings:
        print_warning(w)
    typer.echo(text)
    if verdict["regression"]:
        raise typer.Exit(1)
