"""One profiled cycle of an ONNX Runtime workload: warmup, then N timed iterations.

ONNX Runtime profiles a whole session (there is no per-run switch), so every cycle opens a new
session with profiling on and ends it afterwards; the profile file then holds exactly this cycle.
The runner also times each ``run`` itself (perf_counter_ns), which is what the overhead benchmark
compares with and without profiling.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from aaco.agent.sources.ort.inputs import make_inputs
from aaco.agent.sources.ort.session import make_session


@dataclass
class CycleResult:
    """What one cycle produced."""

    profile_path: Path | None
    profiling_start_ns: int
    pid: int
    warmup_done: int
    latencies_ns: list[int] = field(default_factory=list)  # timed iterations, wall clock around run()


@dataclass
class OrtWorkload:
    """Runs a model for a number of iterations, optionally under ONNX Runtime's profiler."""

    model: Path
    provider: str
    warmup: int = 3
    iterations: int = 20
    profile: bool = True
    intra_op_threads: int = 0
    symbolic_dim: int = 1
    seed: int = 0
    workdir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))

    def run_cycle(
        self,
        stop: threading.Event | None = None,
        on_iteration: Callable[[str], None] | None = None,
        optimized_model: Path | None = None,
    ) -> CycleResult:
        """Warm up, then time ``iterations`` runs; stop early (keeping what ran) when ``stop`` is set."""
        prefix = None
        if self.profile:
            self.workdir.mkdir(parents=True, exist_ok=True)
            prefix = self.workdir / f"aaco-ort-{os.getpid()}-{time.time_ns()}"
        session = make_session(
            self.model,
            self.provider,
            profile_prefix=prefix,
            optimized_model=optimized_model,
            intra_op_threads=self.intra_op_threads,
        )
        feeds = make_inputs(session.get_inputs(), self.symbolic_dim, self.seed)
        result = CycleResult(None, session.get_profiling_start_time_ns() if self.profile else 0, os.getpid(), 0)
        try:
            for _ in range(self.warmup):
                if stop is not None and stop.is_set():
                    break
                session.run(None, feeds)
                result.warmup_done += 1
                if on_iteration:
                    on_iteration("warmup")
            for _ in range(self.iterations):
                if stop is not None and stop.is_set():
                    break
                t0 = time.perf_counter_ns()
                session.run(None, feeds)
                result.latencies_ns.append(time.perf_counter_ns() - t0)
                if on_iteration:
                    on_iteration("timed")
        finally:
            if self.profile:
                result.profile_path = Path(session.end_profiling())
        return result
