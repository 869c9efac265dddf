"""Formats read whole (ONNX Runtime profiles, Kineto traces, rocprof results.json): load, then chunk."""

from __future__ import annotations

from collections.abc import Iterator

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.json_salvage import LoadedJson, load_json
from aaco.agent.sources.traces.limits import TraceLimits, read_document
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.tables import chunks


def load_whole_json(tf: TraceFile, limits: TraceLimits) -> LoadedJson:
    """The document, salvaged event by event when damaged (``json_salvage``: the damage is in its bad rows)."""
    return load_json(read_document(tf.path, limits), tf.path, limits)


def rechunk(parsed: ParsedTrace, ctx: TraceContext, loaded: LoadedJson) -> Iterator[ParsedTrace]:
    """A whole-file result as chunks, keeping its own clock (Kineto and ORT anchor time themselves)."""
    parts = chunks(
        parsed.format,
        ctx,
        parsed.kernels,
        parsed.iterations,
        skipped=parsed.skipped + loaded.skipped,
        bad_rows=list(parsed.bad_rows) + loaded.bad_rows,
        pids=parsed.pids,
        devices=parsed.devices,
    )
    for i, part in enumerate(parts):
        part.clock = parsed.clock
        if i == 0:
            part.model, part.anchor_raw_ns, part.unrecognised = parsed.model, parsed.anchor_raw_ns, parsed.unrecognised
            part.job, part.span_ns = parsed.job, parsed.span_ns
        yield part
