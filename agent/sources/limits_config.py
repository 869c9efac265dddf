"""The per-file limit settings every source that reads trace files takes (``traces.limits.TraceLimits``)."""

from __future__ import annotations

from pydantic import Field, PositiveInt

from aaco.agent.sources.traces.limits import DEFAULT_MAX_BYTES, TraceLimits
from aaco.contract.config_base import StrictModel


class TraceLimitSettings(StrictModel):
    """``max_file_bytes``, ``max_gzip_ratio`` and ``max_json_depth``, as one source's config sets them."""

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

    def trace_limits(self) -> TraceLimits:
        """The limits these settings name."""
        return TraceLimits(self.max_file_bytes, max_gzip_ratio=self.max_gzip_ratio, max_json_depth=self.max_json_depth)
