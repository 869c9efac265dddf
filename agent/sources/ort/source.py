"""The ``ort`` source: runs an ONNX model under ONNX Runtime with profiling on, in cycles.

Each cycle (``agent.run.workload``) warms up, times N iterations and ends profiling; the profile is
parsed (``ort_profile``) with the session's own profiling start as the clock anchor and published:
iterations (carrying the graph's node counts for KAR: ``graph_nodes`` is the count of nodes that run,
those ONNX Runtime does not fold at load, docs/kar.md) then kernels. Warmup runs are not published.
``cycles: null`` loops until the agent stops (the embedded default); ``aaco run`` runs one cycle.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections import deque
from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from aaco.agent.sources.base import Source, SourceContext
from aaco.agent.sources.ort.models import load_model, model_name, resolve_model
from aaco.agent.sources.ort.onnx_graph import summarize
from aaco.agent.sources.ort.profiles import publish_profile
from aaco.agent.sources.ort.session import resolve_provider
from aaco.agent.sources.ort.workload import OrtWorkload
from aaco.contract.config_base import StrictModel
from aaco.contract.errors import AacoError

log = logging.getLogger("aaco.sources.ort")

Provider = Literal["auto", "cpu", "cuda", "rocm", "migraphx"]


class OrtSourceConfig(StrictModel):
    """Run an ONNX model under ONNX Runtime with profiling, in cycles of warmup + timed iterations."""

    type: Literal["ort"] = "ort"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    model: Path | None = Field(
        None, description="The .onnx model; default: light_resnet50.onnx from the onnx wheel (no download)."
    )
    model_name: str | None = Field(None, description="Model name in metrics (default: the file name).")
    iterations: PositiveInt = Field(20, description="Timed iterations per cycle.")
    warmup: NonNegativeInt = Field(3, description="Untimed warmup iterations per cycle (not published).")
    provider: Provider = Field("auto", description="Execution provider; auto takes the best one present.")
    cycles: PositiveInt | None = Field(None, description="Cycles to run; null runs until the agent stops.")
    interval_s: NonNegativeFloat = Field(10.0, description="Pause between cycles, in seconds.")
    intra_op_threads: NonNegativeInt = Field(0, description="ONNX Runtime intra-op threads (0: its default).")
    symbolic_dim: PositiveInt = Field(1, description="Value for symbolic input dimensions (batch size).")
    seed: int = Field(0, description="Seed of the generated inputs.")


def _optimized_node_count(path: Path) -> int | None:
    import onnx

    try:
        return summarize(onnx.load(os.fspath(path), load_external_data=False)).nodes
    except Exception:  # an optimised model ORT could not fully serialise: KAR falls back to the source graph
        log.info("could not read ONNX Runtime's optimised model %s; reporting KAR on the source graph only", path)
        return None


class OrtSource(Source):
    """Profiles an ONNX Runtime workload cycle after cycle."""

    type = "ort"

    def __init__(self, config: OrtSourceConfig, name: str) -> None:
        super().__init__(name)
        self.config = config
        self.finite = config.cycles is not None
        self.model_path = resolve_model(config.model)
        # Wall-clock latency of every timed run as the caller sees it (perf_counter around run()),
        # the measure benchmarks/run_overhead.py compares with and without the agent; bounded.
        self.wall_latencies_ns: deque[int] = deque(maxlen=100_000)

    def run(self, ctx: SourceContext) -> None:
        """Run cycles until done or stopped; a model that cannot be loaded is a fatal problem."""
        cfg = self.config
        subject = os.fspath(self.model_path)
        try:
            graph = summarize(load_model(self.model_path, given_as="the source's model key"))
            provider = resolve_provider(cfg.provider)
        except AacoError as exc:
            ctx.problem(self.name, subject, "model", str(exc), fatal=True, count=1)
            return
        name = cfg.model_name or model_name(self.model_path)
        log.info(
            "ort: %s (%d graph nodes, %d running) on %s, %d warmup + %d timed per cycle",
            name,
            graph.nodes,
            graph.running_nodes,
            provider,
            cfg.warmup,
            cfg.iterations,
        )
        with tempfile.TemporaryDirectory(prefix="aaco-ort-") as tmp:
            workload = OrtWorkload(
                self.model_path,
                provider,
                cfg.warmup,
                cfg.iterations,
                True,
                cfg.intra_op_threads,
                cfg.symbolic_dim,
                cfg.seed,
                Path(tmp),
            )
            optimized_nodes: int | None = None
            cycle = 0
            while not ctx.stop.is_set() and (cfg.cycles is None or cycle < cfg.cycles):
                task = f"{self.name}: {name}"
                ctx.progress.start(task, cfg.warmup + cfg.iterations)
                opt_path = Path(tmp) / "optimized.onnx" if cycle == 0 else None
                try:
                    result = workload.run_cycle(ctx.stop, lambda _k, t=task: ctx.progress.advance(t), opt_path)
                except AacoError as exc:
                    ctx.problem(self.name, subject, "run", str(exc), fatal=True, count=1)
                    ctx.progress.finish(task)
                    return
                ctx.progress.finish(task)
                self.wall_latencies_ns.extend(result.latencies_ns)
                if opt_path is not None and opt_path.exists():
                    optimized_nodes = _optimized_node_count(opt_path)
                self._publish_cycle(ctx, result, name, graph.running_nodes, optimized_nodes, provider)
                cycle += 1
                if cfg.cycles is not None and cycle >= cfg.cycles:
                    break
                if ctx.sleep(cfg.interval_s):
                    break

    def _publish_cycle(
        self, ctx: SourceContext, result, name: str, running_nodes: int, optimized: int | None, provider: str
    ) -> None:
        """Publish one cycle's profile; KAR's denominator is ``running_nodes`` (nodes not folded at load)."""
        if result.profile_path is None:
            return
        publish_profile(
            ctx,
            self.name,
            result.profile_path,
            result.profiling_start_ns,
            identity=f"ort:{result.pid}:{result.profiling_start_ns}",
            model=name,
            skip_runs=result.warmup_done,
            graph_nodes=running_nodes,
            graph_nodes_optimized=optimized,
            provider=provider,
        )


def create(config: OrtSourceConfig, name: str) -> OrtSource:
    """Factory used by the source registry."""
    return OrtSource(config, name)
