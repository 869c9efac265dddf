"""The settings of every source that reads trace files: per-file limits, and which ranges are iterations.

The limits are ``traces.limits.TraceLimits``; the ranges rule is ``traces.tables.iteration_ranges``.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PositiveInt

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.limits import DEFAULT_MAX_BYTES, TraceLimits
from aaco.agent.sources.traces.parse import context_for
from aaco.contract.config_base import StrictModel


class TraceLimitSettings(StrictModel):
    """``max_file_bytes``, ``max_gzip_ratio``, ``max_json_depth`` and ``iteration_ranges``, as one source sets them."""

    max_file_bytes: PositiveInt = Field(
        DEFAULT_MAX_BYTES, description="Refuse files larger than this, on disk or decompressed."
    )
    max_gzip_ratio: PositiveInt = Field(
        TraceLimits.max_gzip_ratio,
        description="Stop a gzip file that expands more than this many times its size (past 256 MiB): a bomb.",
    )
    max_json_depth: PositiveInt = Field(
        TraceLimits.max_json_depth,
        le=1024,  # orjson and yajl stop at 1024 levels themselves
        description="A JSON trace nested deeper than this ends there (real ones: < 10).",
    )

    critical_path: Literal["ranks", "all", "off"] = Field(
        "ranks",
        description="Which Kineto traces get HTA's critical path per step (docs/jobs.md): ranks of a distributed "
        "job, all, or off.",
    )
    critical_path_max_events: PositiveInt = Field(
        100_000,
        description="A Kineto trace of more events gets no critical path (the path is found over the events as "
        "loaded; counted as critical_path_too_large).",
    )
    iteration_ranges: list[str] = Field(
        default_factory=list,
        description="Names of the rocTX ranges that are iterations (fnmatch patterns: 'step*'), nested or not; "
        "empty: the outermost range of each thread (its nested ranges are phases of it).",
    )

    def trace_limits(self) -> TraceLimits:
        """The limits these settings name."""
        return TraceLimits(
            self.max_file_bytes,
            max_gzip_ratio=self.max_gzip_ratio,
            max_json_depth=self.max_json_depth,
            critical_path=self.critical_path,
            critical_path_max_events=self.critical_path_max_events,
        )

    def trace_context(self, tf: TraceFile, *, node: str, source: str, **kw: Any) -> TraceContext:
        """``parse.context_for`` of ``tf`` (``kw``: its model, pid, clock), with these ``iteration_ranges``."""
        return context_for(tf, node=node, source=source, iteration_ranges=tuple(self.iteration_ranges), **kw)
