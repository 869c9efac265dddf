"""Who is parsing a trace (``TraceContext``) and what a parser could not use (``BadRow``).

Timestamps of rocprofv3, rocpd and rocprof v1/v2 are CLOCK_BOOTTIME nanoseconds: the caller
passes the offset to apply (``TraceContext.clock``, by default sampled on this host with
``boottime_offset()``), and every chunk records it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from aaco.agent.sources.jobs import JobRegistry
from aaco.contract.clock import ClockOffset, boottime_offset
from aaco.contract.jobs import JobFields

# Longest kernel / range name kept; a longer one is a bad row (no real symbol is this long, a
# corrupted file or a runaway string is, and it would blow up every label and span downstream).
MAX_NAME_BYTES = 64 * 1024


@dataclass(frozen=True)
class TraceContext:
    """Who is parsing: the node, the file's identity, the run and model, the source name, the clock.

    ``clock`` converts CLOCK_BOOTTIME nanoseconds (rocprofv3, rocpd, rocprof v1/v2) to epoch ns;
    the default samples this host's offset. ``file_mtime_ns`` anchors formats without a clock
    of their own (ONNX Runtime profiles, Kineto traces without ``baseTimeNanoseconds``).
    ``model_given``: ``model`` is the user's (config ``model``, ``--model-name``) or the traced
    process's, not a default taken from the file name: it wins over the model the file names.
    ``iteration_ranges``: the source's setting of that name (``tables.iteration_ranges``): which
    rocTX ranges are iterations; empty, the outermost range of each thread.

    The job (``traces.job_stamp``, docs/jobs.md): ``job`` is what the source knows of it before
    reading (the configured name, the captured process's environment); ``job_environ``: also ask
    the environment of the process the trace names, if it still runs here (the spool); ``jobs``
    names jobs that have no name (``agent/sources/jobs.py``; None: each trace alone);
    ``model_configured``: ``model`` is the configuration's, which a job's name does not replace.
    """

    node: str
    identity: str
    run_id: str
    model: str
    source: str
    clock: ClockOffset = field(default_factory=boottime_offset)
    file_mtime_ns: int = 0
    pid: int | None = None  # the traced process, when the file does not say it
    model_given: bool = False
    iteration_ranges: tuple[str, ...] = ()  # names (fnmatch patterns) of the ranges that are iterations
    job: JobFields | None = None
    job_environ: bool = False
    jobs: JobRegistry | None = None
    model_configured: bool = False


class BadRow(NamedTuple):
    """A row that could not be used: its byte offset in the (decompressed) file, raw bytes, reason."""

    offset: int
    line: bytes
    reason: str
