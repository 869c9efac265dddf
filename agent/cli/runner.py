"""Running the agent's service in the foreground for ``aaco run``, ``aaco replay`` and ``aaco agent``.

Progress on stderr, the process settings a long-running agent wants (no pandas, large buffers
returned to the OS), and what the run reports when it ends.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.abc
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from aaco.agent.cli.common import fail
from aaco.agent.cli.progress import progress_for
from aaco.agent.cli.report import report_lost, report_problems, report_unshipped
from aaco.contract.errors import AacoError

# aaco.agent.sources.base.input_log, aaco.exporters.lake_ship.left_log (named here: imported with the service)
QUIETED = ("aaco.sources.input", "aaco.exporters.lake.unshipped")

if TYPE_CHECKING:  # the service and its sources cost ~0.8 s to import: imported when a command runs one
    from aaco.agent.config import AgentConfig
    from aaco.agent.service import AgentService


class _NoPandas(importlib.abc.MetaPathFinder):
    """An import hook that refuses pandas (used once, see ``keep_pandas_out``)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> None:
        """Refuse pandas; leave every other import to the other finders."""
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ImportError("pandas is kept out of the agent")


def keep_pandas_out() -> None:
    """Stop pyarrow from importing pandas in this process (the agent never uses it).

    pyarrow imports pandas, when it is installed, the first time it converts a Python list; in a
    long-running agent that costs ~40 MiB of RSS for nothing (measured by benchmarks/telemetry_cost.py:
    pandas arrives in a development environment through a test-only dependency). pyarrow tries the
    import once and remembers the answer, so it is asked once here while the import is refused.
    """
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(finder)


def return_large_buffers(threshold: int = 1024 * 1024) -> None:
    """Have glibc mmap every allocation of ``threshold`` bytes or more, so it goes back to the OS when freed.

    glibc raises its mmap threshold as large blocks are freed (up to 32 MiB), after which OTLP request
    bodies of a few MB are carved from per-thread arenas that keep their pages: 4 clients flooding the
    receiver with 3.7 MB requests grew the agent by about 420 MiB with it and 285 MiB with a fixed 1 MiB
    threshold (the byte budget itself being 256 MiB). No-op without glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, threshold)  # M_MMAP_THRESHOLD (malloc.h); fixing it also stops the dynamic raise
    except (OSError, AttributeError):
        return


def use_system_memory_pool() -> None:
    """Have Arrow allocate with the C library's malloc instead of its bundled mimalloc (the daemon's choice).

    Over a run of 8 GPUs at 1 Hz with the lake on, mimalloc's segments and retained pages held ~9 MiB
    more than malloc (docs/performance.md, "Memory and CPU budget"); the daemon builds small batches,
    where mimalloc's speed does not show. It is Arrow's own setting, ``ARROW_DEFAULT_MEMORY_POOL``, read
    once when Arrow's default pool is first made (``pa.set_memory_pool`` afterwards changes the pool of
    Python-side calls only, not the Parquet writer's or the compute kernels'). So it is set, the pool
    made, and the variable put back as it was: a user's own setting wins, and processes the agent
    starts (a capture's profiled workload) keep their own allocator.
    """
    before = os.environ.get("ARROW_DEFAULT_MEMORY_POOL")
    if before is not None:
        return
    os.environ["ARROW_DEFAULT_MEMORY_POOL"] = "system"
    try:
        import pyarrow as pa

        pa.default_memory_pool()
    finally:
        del os.environ["ARROW_DEFAULT_MEMORY_POOL"]


def run_service(
    config: AgentConfig,
    *,
    progress: bool,
    stop_when_done: bool,
    reload_config: Callable[[], AgentConfig] | None = None,
    extra_exporters: list[Any] | None = None,
    report_input: bool = True,
) -> AgentService:
    """Run the service until stopped (or done); with ``report_input``, say what OTLP lost; exit 2 on damaged input."""
    from aaco.agent.main_loop import run_until_stopped
    from aaco.agent.service import AgentService

    keep_pandas_out()
    if report_input:  # input problems and unshipped parts are printed when the run ends: not also as met
        for name in QUIETED:
            logging.getLogger(name).setLevel(logging.ERROR)
    bars = progress_for(progress)
    service = AgentService(config, progress=bars, extra_exporters=extra_exporters)
    try:
        with bars if bars is not None else contextlib.nullcontext():
            run_until_stopped(service, stop_when_sources_done=stop_when_done, reload_config=reload_config)
    except AacoError as exc:
        service.shutdown()
        raise fail(exc) from None
    if report_input:
        damaged = report_problems(service)
        report_lost(service.stats)
        report_unshipped(service)
        if damaged:
            raise typer.Exit(2)
    return service
