"""What a trace parser returns: columns of kernels and iterations, how time was anchored, what it skipped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from aaco.agent.pipeline.clock import ClockOffset


@dataclass
class ParsedTrace:
    """Events read from one trace, ready to conform and publish (iterations first, then kernels)."""

    format: str
    kernels: pa.Table
    iterations: pa.Table
    clock: ClockOffset
    skipped: Counter[str] = field(default_factory=Counter)
    pids: tuple[int, ...] = ()
