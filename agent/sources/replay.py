"""The ``replay`` source: push trace files through the pipeline once (``aaco replay``, demo samples).

Every recognised file (``traces.detect.sniff``: ONNX Runtime profiles, Kineto traces, rocprofv3 CSV, JSON
and rocpd databases, rocprof v1/v2 results) is read by ``ingest.ingest_file``: published chunk by
chunk as one exactly-once range keyed by the file's content identity, so replaying a file the lake
already holds (the agent restarted, the same file under another name) adds nothing; ``force``
reads it again. Times in CLOCK_BOOTTIME (rocprofv3, rocprof v1) convert with this host's offset,
re-anchored for a file recorded on another boot (``clock_anchor``), unless ``clock_offset_ns``
gives the offset. Within a directory, rocTX marker traces go before kernel traces so iterations are
known before their kernels. A file that cannot be read is reported and counted; the others go on:
one that is not a trace is ``unreadable``, and whatever else recognising or reading one raises goes
through ``ingest.file_failed`` (counted by its reason, quarantined, named once in the log). The
files of a rocprofv3 output directory that are not traces AACO reads (statistics, counters, other
output formats: ``traces.rocprofv3_outputs``) are named once each (reason ``not_read``, a note, not
an error) and the traces beside them read. The rows carry their distributed job (docs/jobs.md):
``job`` names it; else the ranks' traces say it, and a job they do not name is named from all the
replay's ranks of it together (``job_scan``), whatever their files are called.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field

from aaco.agent.sources.base import Source, SourceContext
from aaco.agent.sources.ingest import Quarantine, file_failed, ingest_file
from aaco.agent.sources.job_scan import ReadAhead, prescan
from aaco.agent.sources.jobs import JobRegistry
from aaco.agent.sources.limits_config import TraceLimitSettings
from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.files import TraceFile, expand_paths
from aaco.agent.sources.traces.parse import ITERATIONS_FIRST
from aaco.agent.sources.traces.rocprofv3_outputs import NOT_READ
from aaco.contract.clock import ClockOffset
from aaco.contract.errors import TraceFormatError
from aaco.contract.jobs import JobFields

EXPLICIT = "explicit"  # the method of an offset the user gave (never re-anchored)


class ReplaySourceConfig(TraceLimitSettings):
    """Replay trace files once: every format AACO reads (``.gz`` too), files or directories."""

    type: Literal["replay"] = "replay"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    paths: list[Path] = Field(..., min_length=1, description="Trace files, or directories of them (recursive).")
    model: str | None = Field(None, description="Model name for the iterations (default: the file name).")
    job: str | None = Field(
        None,
        description="The distributed job the traces are ranks of (default: named from the ranks' own traces, "
        "docs/jobs.md); also their model unless model is set.",
    )
    force: bool = Field(False, description="Read files again even if the lake already holds them.")
    clock_offset_ns: int | None = Field(
        None,
        description="Epoch ns minus the traces' CLOCK_BOOTTIME ns (rocprofv3, rocprof v1): used as given for every "
        "file, instead of this host's offset and the re-anchoring of files from another boot.",
    )


class ReplaySource(Source):
    """Reads each configured file once."""

    type = "replay"
    finite = True

    def __init__(self, config: ReplaySourceConfig, name: str) -> None:
        super().__init__(name)
        self.config = config
        self.already = 0

    def run(self, ctx: SourceContext) -> None:
        """Replay every file, reporting the ones that fail."""
        quarantine = Quarantine(ctx.quarantine)
        cfg = self.config
        limits = cfg.trace_limits()
        recognised = []
        listed = expand_paths(list(self.config.paths))
        for known in listed.not_read:  # a rocprofv3 directory's statistics, counters...: named, not read
            ctx.problem(self.name, os.fspath(known.path), NOT_READ, known.message, fatal=False)
        for path in listed.files:
            try:
                recognised.append(replace(identify(path), limits=limits))
            except TraceFormatError as exc:
                ctx.problem(self.name, os.fspath(path), "unreadable", exc.message, fatal=True, count=1)
            except Exception as exc:  # the file boundary: a failure on one file never stops the replay
                file_failed(ctx, self.name, path, exc, quarantine)
        recognised.sort(key=lambda tf: (tf.format not in ITERATIONS_FIRST, str(tf.path)))
        ctx.progress.start(self.name, len(recognised))
        offset = self.config.clock_offset_ns
        clock = {"clock": ClockOffset(offset, 0, EXPLICIT)} if offset is not None else {}
        jobs = JobRegistry()
        job = {"job": JobFields(job=cfg.job), "model_configured": bool(cfg.model), "jobs": jobs}

        def context(tf: TraceFile) -> TraceContext:
            return cfg.trace_context(tf, node=ctx.node, source=self.name, model=cfg.model, **clock, **job)

        ahead = ReadAhead()
        if cfg.job is None:  # a job nobody named is named from all its ranks (``job_scan``)
            ahead = prescan(recognised, context, max_bytes=self.config.max_file_bytes)
            jobs.preset(ahead.names)
        for tf in recognised:
            if ctx.stop.is_set():
                break
            tctx = context(tf)
            key = None if self.config.force else f"file:{tf.identity}"
            read = ahead.take(tf.identity)
            result = ingest_file(
                ctx, self.name, tf, tctx, quarantine, key=key, max_bytes=self.config.max_file_bytes, read=read
            )
            if result.already:
                self.already += 1
                ctx.problem(
                    self.name,
                    os.fspath(tf.path),
                    "already_ingested",
                    "already in the lake: skipped (force: true or --force reads it again)",
                    fatal=False,
                )
            ctx.progress.advance(self.name)
        ctx.progress.finish(self.name)


def create(config: ReplaySourceConfig, name: str) -> ReplaySource:
    """Factory used by the source registry."""
    return ReplaySource(config, name)
