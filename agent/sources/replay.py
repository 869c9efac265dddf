"""The ``replay`` source: push trace files through the pipeline once (``aaco replay``, demo samples).

Each file is recognised by content (``formats``), parsed, and published iterations first, then
kernels, with backpressure (files are durable: waiting loses nothing). A file that cannot be read
or parsed is reported as a fatal ``Problem`` for that file and counted; the other files go on.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import orjson
from pydantic import Field, PositiveInt

from aaco.agent.config_base import StrictModel
from aaco.agent.errors import TraceFormatError
from aaco.agent.pipeline.clock import ClockOffset

from .base import Source, SourceContext, SourceRecord
from .formats import DEFAULT_MAX_BYTES, TraceFile, expand, identify, read_all
from .kineto import parse_kineto
from .ort_profile import parse_ort_profile, profile_extent_us
from .parsed import ParsedTrace


class ReplaySourceConfig(StrictModel):
    """Replay trace files once: ONNX Runtime profiles and Kineto traces (``.gz`` too), files or directories."""

    type: Literal["replay"] = "replay"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    paths: list[Path] = Field(..., min_length=1, description="Trace files, or directories of them (recursive).")
    model: str | None = Field(None, description="Model name for the iterations (default: the file name).")
    max_file_bytes: PositiveInt = Field(DEFAULT_MAX_BYTES, description="Refuse files larger than this.")


def model_from_path(path: Path) -> str:
    """A model name from a trace file name: the stem without ``.json``/``.gz`` suffixes."""
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name or "unknown"


def parse_file(tf: TraceFile, *, node: str, source: str, model: str | None, max_bytes: int) -> ParsedTrace:
    """Parse one recognised trace file (raises ``TraceFormatError`` when it cannot be read at all)."""
    data = read_all(tf.path, max_bytes)
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(f"invalid or truncated JSON: {exc}", subject=tf.path) from exc
    run_id = f"{model_from_path(tf.path)}:{tf.identity[:12]}"
    name = model or model_from_path(tf.path)
    try:
        if tf.format == "ort_profile":
            extent = profile_extent_us(doc) if isinstance(doc, list) else 0
            clock = ClockOffset(tf.mtime_ns - extent * 1000, 10**9, "file-mtime")
            return parse_ort_profile(
                doc, clock=clock, node=node, identity=tf.identity, run_id=run_id, model=name, source=source
            )
        return parse_kineto(
            doc, node=node, identity=tf.identity, run_id=run_id, model=name, file_mtime_ns=tf.mtime_ns, source=source
        )
    except ValueError as exc:
        raise TraceFormatError(str(exc), subject=tf.path) from exc


def publish_parsed(ctx: SourceContext, source: str, subject: str, parsed: ParsedTrace, live: bool = False) -> bool:
    """Publish a parsed trace (iterations first, so the correlator knows them before their kernels).

    ``live`` marks a capture that just happened (its lag is reported); a replayed file is history.
    """
    ok = ctx.publish(source, "iterations", parsed.iterations, durable=True, live=live)
    ok &= ctx.publish(source, "kernels", parsed.kernels, durable=True, live=live)
    for reason, count in parsed.skipped.items():
        ctx.problem(source, subject, reason, f"skipped {count} event(s): {reason}", fatal=False, count=count)
    ctx.record(
        SourceRecord(
            source,
            subject,
            parsed.format,
            {"kernels": parsed.kernels.num_rows, "iterations": parsed.iterations.num_rows},
            parsed.clock.to_dict(),
            dict(parsed.skipped),
        )
    )
    return ok


class ReplaySource(Source):
    """Reads each configured file once."""

    type = "replay"
    finite = True

    def __init__(self, config: ReplaySourceConfig, name: str) -> None:
        super().__init__(name)
        self.config = config

    def run(self, ctx: SourceContext) -> None:
        """Replay every file, reporting the ones that fail."""
        files = expand(list(self.config.paths))
        ctx.progress.start(self.name, len(files))
        for path in files:
            if ctx.stop.is_set():
                break
            subject = os.fspath(path)
            try:
                tf = identify(path)
                parsed = parse_file(
                    tf, node=ctx.node, source=self.name, model=self.config.model, max_bytes=self.config.max_file_bytes
                )
            except TraceFormatError as exc:
                ctx.problem(self.name, subject, "unreadable", exc.message, fatal=True, count=1)
                ctx.progress.advance(self.name)
                continue
            publish_parsed(ctx, self.name, subject, parsed)
            ctx.progress.advance(self.name)
        ctx.progress.finish(self.name)


def create(config: ReplaySourceConfig, name: str) -> ReplaySource:
    """Factory used by the source registry."""
    return ReplaySource(config, name)
