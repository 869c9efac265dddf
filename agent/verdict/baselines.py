"""Baselines and verdicts from lakes: build, save and load a baseline, compare a session with it.

The I/O around ``analyzers.baseline`` (per-model figures) and ``analyzers.verdict`` (the
statistics and the cause). A lake's bottleneck class is computed by replaying the lake through the
agent's own analyzers (``service.build_analyzers``, in time order), so a lake written before the
bottleneck analyzer existed gets one too, and both sides are classified by the same rules. Every
problem with the input is an ``AacoError`` naming the file or flag (the CLI exits 2).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aaco.agent.verdict.environment import differences, environment
from aaco.agent.verdict.lake import Lake, read_lake
from aaco.analyzers.baseline import FORMAT, model_profile, models_of
from aaco.contract.errors import AacoError
from aaco.contract.snapshot import AnalyzerResult

BASELINE_FILE = "baseline.json"


def analyze(lake: Lake) -> dict[str, AnalyzerResult]:
    """Every analyzer's result over the whole lake, as the agent would have computed it."""
    from aaco.agent.config import AgentConfig
    from aaco.agent.pipeline.bus import Bus
    from aaco.agent.pipeline.correlator import Correlator
    from aaco.agent.pipeline.worker import Pipeline
    from aaco.agent.service import build_analyzers
    from aaco.contract.stats import Stats

    nodes = lake.nodes()
    config = AgentConfig(node=nodes[0] if nodes else "lake")
    stats = Stats()
    pipeline = Pipeline(Bus(stats), Correlator(stats), build_analyzers(config), [], stats, config.node)
    for item in lake.batches():  # already correlated in the lake: straight to the analyzers
        pipeline.dispatch(item)
    return dict(pipeline.snapshot().results)


def _bottlenecks(results: Mapping[str, AnalyzerResult]) -> dict[str, tuple[int, dict[str, Any]]]:
    """Per model: the classification of the node where it ran most iterations."""
    out: dict[str, tuple[int, dict[str, Any]]] = {}
    result = results.get("bottleneck")
    latency = getattr(results.get("latency"), "models", {}) or {}
    for (node, model), c in (getattr(result, "models", None) or {}).items():
        row = latency.get((node, model))
        weight = row.iterations if row is not None else 0
        if model not in out or weight > out[model][0]:
            out[model] = (weight, c.to_dict())
    return out


def build_baseline(lake: Lake, models: list[str] | None = None, machine: bool = True) -> dict[str, Any]:
    """The baseline document of ``lake`` (every model with iterations, or ``models``)."""
    iterations = lake.table("iterations")
    available = models_of(iterations)
    if not available:
        raise AacoError(
            "the lake has no iterations, so no latency to compare",
            subject=lake.root / "iterations",
            hint="write it with aaco run, or replay traces that mark iterations (ProfilerStep, ORT runs)",
        )
    chosen = models or available
    missing = [m for m in chosen if m not in available]
    if missing:
        raise AacoError(
            f"no iterations of model {', '.join(missing)} in {lake.root} (it has: {', '.join(available)})",
            subject="--model",
        )
    results = analyze(lake)
    classes = _bottlenecks(results)
    roofline = results.get("roofline")
    profiles: dict[str, Any] = {}
    for m in chosen:
        p = model_profile(iterations, lake.table("kernels"), m)
        p["bottleneck"] = classes.get(m, (0, None))[1]
        families = roofline.model_families(m) if hasattr(roofline, "model_families") else {}
        if families:  # hardware counters of the model's kernels (docs/counters.md)
            p["roofline"] = families
        profiles[m] = p
    return {
        "format": FORMAT,
        "lake": str(lake.root.resolve()),
        "created_at_ns": time.time_ns(),
        "nodes": lake.nodes(),
        "environment": environment(lake, machine=machine),
        "models": profiles,
    }


def save_baseline(doc: Mapping[str, Any], path: Path) -> None:
    """Write the baseline document (via a temporary file, so a reader never sees half of it)."""
    from aaco.exporters.lake import write_json_atomic

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, doc)
    except OSError as exc:
        raise AacoError(f"cannot write the baseline ({exc.strerror or exc})", subject=path) from None


def load_baseline(path: Path, machine: bool = True) -> dict[str, Any]:
    """A baseline: a baseline JSON file, or a lake directory (its ``baseline.json``, else built from it)."""
    path = Path(path)
    if path.is_dir():
        saved = path / BASELINE_FILE
        if not saved.exists():
            return build_baseline(read_lake(path), machine=machine)
        path = saved
    if not path.exists():
        raise AacoError(
            "no such baseline file or lake directory", subject=path, hint="make one with aaco baseline save"
        )
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise AacoError(f"cannot read ({exc.strerror or exc})", subject=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AacoError(f"not valid JSON ({exc})", subject=path, hint="make it again with aaco baseline save") from None
    _check(doc, path)
    return doc


def _check(doc: Any, path: Path) -> None:
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise AacoError(f"not an AACO baseline (format {found!r}, expected {FORMAT!r})", subject=path)
    models = doc.get("models")
    if not isinstance(models, dict) or not models:
        raise AacoError("baseline without models", subject=path)
    for name, m in models.items():
        lat = m.get("latency_s") if isinstance(m, dict) else None
        if not isinstance(lat, list) or not all(isinstance(v, int | float) for v in lat):
            raise AacoError(f"model {name!r}: latency_s is not a list of numbers", subject=path)
    if not isinstance(doc.get("environment", {}), dict):
        raise AacoError("environment is not an object", subject=path)


def pair_models(
    base: Mapping[str, Any], session: Mapping[str, Any], model: str | None
) -> tuple[list[tuple[str, str]], list[str]]:
    """(baseline model, session model) pairs to compare, and warnings."""
    b, s = sorted(base), sorted(session)
    if model is not None:
        for side, names in (("baseline", b), ("session", s)):
            if model not in names:
                raise AacoError(f"model {model!r} is not in the {side} (it has: {', '.join(names)})", subject="--model")
        return [(model, model)], []
    common = [m for m in b if m in s]
    if common:
        return [(m, m) for m in common], []
    if len(b) == 1 and len(s) == 1:
        return [(b[0], s[0])], [f"comparing model {b[0]!r} of the baseline with model {s[0]!r} of the session"]
    raise AacoError(
        f"no model in both: baseline has {', '.join(b)}; session has {', '.join(s)}",
        subject="--model",
        hint="name the model to compare with --model",
    )


def diff(
    baseline: Mapping[str, Any],
    session_lake: Lake,
    model: str | None = None,
    alpha: float = 0.01,
    min_delta_pct: float = 5.0,
    machine: bool = True,
) -> tuple[dict[str, Any], list[str]]:
    """The verdict (seeds' shape, headline model first) and the warnings to show."""
    from aaco.analyzers.verdict import VerdictInputError, compare

    session = build_baseline(session_lake, machine=machine)
    pairs, warnings = pair_models(baseline["models"], session["models"], model)
    env_b, env_s = baseline.get("environment") or {}, session["environment"]
    env_diff = differences(env_b, env_s)
    if env_diff:
        warnings.append(
            "environment differs: "
            + "; ".join(f"{d['key']}: {d['baseline']} -> {d['session']}" for d in env_diff)
            + " (the latency change may come from the environment, not the code)"
        )
    verdicts: dict[str, dict[str, Any]] = {}
    for b_name, s_name in pairs:
        try:
            v = compare(baseline["models"][b_name], session["models"][s_name], env_b, env_s, alpha, min_delta_pct)
        except VerdictInputError as exc:
            raise AacoError(f"model {s_name!r}: {exc}", subject=session_lake.root) from None
        named = {"model": s_name, **({"baseline_model": b_name} if b_name != s_name else {})}
        head = list(v)[: list(v).index("recommendation") + 1]  # the seeds' fields first, then the model
        verdicts[s_name] = {**{k: v[k] for k in head}, **named, **{k: x for k, x in v.items() if k not in head}}
    headline = max(verdicts.values(), key=lambda v: (v["regression"], v["latency_delta_pct"]))
    out = dict(headline)
    out["environment_differences"] = env_diff
    out["environment"] = {"baseline": env_b, "session": env_s}
    if len(verdicts) > 1:
        out["regression"] = any(v["regression"] for v in verdicts.values())
        out["models"] = verdicts
    return out, warnings
