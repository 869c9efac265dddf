"""What a trace parser returns: columns of kernels and iterations, how time was anchored, what it skipped."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from aaco.contract.clock import ClockOffset
from aaco.contract.jobs import JobFields


@dataclass
class ParsedTrace:
    """Events read from one trace, ready to conform and publish (iterations first, then kernels).

    ``devices`` maps the ``device`` strings of the kernels to what the trace says about them (name,
    product, the tool's own label), see ``devices``. ``bad_rows`` are the rows that could not be
    used, as ``context.BadRow`` (byte offset, raw bytes, reason), for logs and quarantine; their
    counts by reason are in ``skipped``.

    ``model`` is the model the file itself names (rocprofv3 metadata command line, Kineto process
    name), None when it names none. ``anchor_raw_ns`` is a time in the trace's own clock (before
    conversion) at which the file was finished (rocprofv3 metadata ``fini_time``, else the last
    event's end), None when unknown: with the file's mtime it anchors a trace recorded on another
    boot. Both ride on the first chunk.

    ``unrecognised``: events that look like GPU work but are of a category the parser does not read,
    by category (``kineto_categories``); on the first chunk, reported once per file by the ingest.

    ``job``: the rank the trace itself describes (Kineto's ``distributedInfo``), None if it says
    nothing; ``span_ns``: the trace's profiled span (``profiled_span``), which names a job that has
    no name (``contract.jobs.derive_jobs``). Both on the first chunk.
    """

    format: str
    kernels: pa.Table
    iterations: pa.Table
    clock: ClockOffset
    skipped: Counter[str] = field(default_factory=Counter)
    pids: tuple[int, ...] = ()
    devices: dict[str, dict[str, Any]] = field(default_factory=dict)
    bad_rows: list[Any] = field(default_factory=list)
    model: str | None = None
    anchor_raw_ns: int | None = None
    unrecognised: Counter[str] = field(default_factory=Counter)
    job: JobFields | None = None
    span_ns: tuple[int, int] | None = None


def profiled_span(iterations: pa.Table, kernels: pa.Table) -> tuple[int, int] | None:
    """From the first iteration's start to the last one's end; without iterations, the kernels'; None: neither."""
    for table in (iterations, kernels):
        if table.num_rows:
            start, end = pc.min(table.column("start_ns")).as_py(), pc.max(table.column("end_ns")).as_py()
            if start is not None and end is not None:
                return int(start), int(end)
    return None
