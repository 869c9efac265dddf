"""One ONNX Runtime profile published: read, removed, parsed on its session's clock, handed to the bus."""

from __future__ import annotations

import os
from pathlib import Path

import orjson

from aaco.agent.sources.base import SourceContext
from aaco.agent.sources.ingest import publish_parsed
from aaco.agent.sources.traces.ort_profile import parse_ort_profile
from aaco.contract.clock import ClockOffset


def publish_profile(
    ctx: SourceContext,
    source: str,
    profile: Path,
    start_ns: int,
    *,
    identity: str,
    model: str,
    skip_runs: int,
    graph_nodes: int,
    provider: str,
    graph_nodes_optimized: int | None = None,
) -> None:
    """Publish a session's profile (its warmup runs left out); an unreadable one is a fatal problem of ``source``.

    ``start_ns`` is the session's profiling start (the clock anchor); the file is removed once read.
    """
    try:
        events = orjson.loads(profile.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        ctx.problem(
            source, os.fspath(profile), "profile", f"cannot read ONNX Runtime's profile: {exc}", fatal=True, count=1
        )
        return
    finally:
        profile.unlink(missing_ok=True)
    parsed = parse_ort_profile(
        events,
        clock=ClockOffset(start_ns, 1000, "ort-profiling-start"),
        node=ctx.node,
        identity=identity,
        run_id=f"{model}:{start_ns}",
        model=model,
        skip_runs=skip_runs,
        graph_nodes=graph_nodes,
        graph_nodes_optimized=graph_nodes_optimized,
        provider=provider,
        source=source,
    )
    # skip_runs drops the warmup runs; a cycle cut short by a stop just has fewer timed runs.
    publish_parsed(ctx, source, f"{model} cycle {start_ns}", parsed, live=True)
