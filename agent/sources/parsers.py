"""Parse any recognised trace file: one entry point for ``replay`` and ``trace_dir``.

``parse_any(tf, ctx)`` dispatches on ``tf.format`` (``formats.sniff``) and yields ``ParsedTrace``
chunks: at most ``trace_common.CHUNK_ROWS`` kernels each, iterations (and the devices, skipped
counts and bad rows found so far) on the first, so a caller can publish chunk by chunk. Large
formats stream (rocprofv3 CSV in blocks of lines, rocprofv3 JSON with ijson, rocpd with SQLite
cursors); ONNX Runtime profiles, Kineto traces and rocprof v1 results.json are read whole (within
``max_bytes``). A file that cannot be read at all raises ``TraceFormatError``; bad rows inside a
readable file are skipped, counted and listed on the chunks instead.

Which files give what (so a directory read file by file yields every event once): rocprofv3
``*_kernel_trace.csv`` and ``*_memory_copy_trace.csv`` give kernels (with launches and devices
from the ``*_hip_api_trace.csv`` and ``*_agent_info.csv`` beside them), ``*_marker_api_trace.csv``
gives iterations, ``*_hip_api_trace.csv`` and ``*_agent_info.csv`` give nothing on their own.
Publish a directory's marker traces before its kernel traces so iterations arrive first
(``ITERATIONS_FIRST``).
"""

from __future__ import annotations

import csv
import io
import sqlite3
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import ijson
import orjson

from aaco.agent.errors import TraceFormatError
from aaco.agent.pipeline.clock import ClockOffset

from . import rocpd, rocprof_v1, rocprofv3_csv, rocprofv3_json
from .formats import DEFAULT_MAX_BYTES, TraceFile, read_all
from .kineto import parse_kineto
from .ort_profile import parse_ort_profile, profile_extent_us
from .parsed import ParsedTrace
from .trace_common import TraceContext, chunks

# Formats whose files hold iterations only: read them before the kernel traces of the same run.
ITERATIONS_FIRST = frozenset({rocprofv3_csv.FORMAT_API})
# Formats a tail reader can follow while they grow (complete lines, see Rocprofv3CsvDecoder).
TAILABLE = frozenset({rocprofv3_csv.FORMAT_KERNEL, rocprofv3_csv.FORMAT_MEMCPY})


def _json(tf: TraceFile, max_bytes: int) -> tuple[object, bool]:
    """The document, and whether it was cut short (then only the events before the cut are in it)."""
    data = read_all(tf.path, max_bytes)
    try:
        return orjson.loads(data), False
    except orjson.JSONDecodeError as exc:
        salvaged = _salvage(data)
        if salvaged is None:
            raise TraceFormatError(f"invalid or truncated JSON: {exc}", subject=tf.path) from exc
        return salvaged, True


def _salvage(data: bytes) -> object | None:
    """The events before the damage of a Chrome-trace JSON (``{"traceEvents": [...]}`` or a list).

    A profile cut short (the writer killed, the disk full) keeps everything up to the cut; ijson
    reads events one by one until it meets the damage.
    """
    text = data.lstrip()
    prefix = "item" if text.startswith(b"[") else "traceEvents.item"
    events: list[object] = []
    try:
        for ev in ijson.items(io.BytesIO(data), prefix, use_float=True):
            events.append(ev)
    except (ijson.JSONError, ValueError):
        pass
    if not events:
        return None
    return events if prefix == "item" else {"traceEvents": events}


def _parse(tf: TraceFile, ctx: TraceContext, max_bytes: int) -> Iterator[ParsedTrace]:
    fmt = tf.format
    if fmt == "ort_profile":
        doc, cut = _json(tf, max_bytes)
        extent = profile_extent_us(doc) if isinstance(doc, list) else 0
        clock = ClockOffset(tf.mtime_ns - extent * 1000, 10**9, "file-mtime")
        parsed = parse_ort_profile(
            doc,
            clock=clock,
            node=ctx.node,
            identity=ctx.identity,
            run_id=ctx.run_id,
            model=ctx.model,
            source=ctx.source,
        )
        yield from _rechunk(parsed, ctx, cut)
    elif fmt == "kineto":
        doc, cut = _json(tf, max_bytes)
        parsed = parse_kineto(
            doc,
            node=ctx.node,
            identity=ctx.identity,
            run_id=ctx.run_id,
            model=ctx.model,
            file_mtime_ns=tf.mtime_ns,
            source=ctx.source,
        )
        yield from _rechunk(parsed, ctx, cut)
    elif fmt == rocprof_v1.FORMAT_JSON:
        doc, cut = _json(tf, max_bytes)
        for i, part in enumerate(rocprof_v1.parse_results_json(doc, ctx)):
            if cut and i == 0:
                part.skipped["truncated_json"] += 1
            yield part
    elif fmt == rocprof_v1.FORMAT_CSV:
        yield from rocprof_v1.parse_results_csv(read_all(tf.path, max_bytes), ctx)
    elif fmt in rocprofv3_csv.FORMATS:
        yield from rocprofv3_csv.parse_csv_file(tf.path, ctx, max_bytes)
    elif fmt == rocprofv3_json.FORMAT:
        yield from rocprofv3_json.parse_rocprofv3_json(tf.path, ctx)
    elif fmt == rocpd.FORMAT:
        yield from rocpd.parse_rocpd(tf.path, ctx, max_bytes)
    else:
        raise TraceFormatError(f"no parser for format {fmt!r}", subject=tf.path)


def _rechunk(parsed: ParsedTrace, ctx: TraceContext, cut: bool = False) -> Iterator[ParsedTrace]:
    """A whole-file result as chunks, keeping its own clock (Kineto and ORT anchor time themselves)."""
    skipped = parsed.skipped + Counter({"truncated_json": 1} if cut else {})
    for part in chunks(parsed.format, ctx, parsed.kernels, parsed.iterations, skipped=skipped, pids=parsed.pids):
        part.clock = parsed.clock
        yield part


def parse_any(tf: TraceFile, ctx: TraceContext, *, max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[ParsedTrace]:
    """Parse a recognised trace file into ``ParsedTrace`` chunks (see the module doc).

    Raises ``TraceFormatError`` (naming the file) when the file cannot be read or is not the format
    it looked like; bad rows inside a readable file never raise.
    """
    try:
        yield from _parse(tf, ctx, max_bytes)
    except TraceFormatError:
        raise
    except (ValueError, OSError, EOFError, zlib.error, csv.Error, sqlite3.Error) as exc:
        raise TraceFormatError(str(exc) or type(exc).__name__, subject=tf.path) from exc


def context_for(tf: TraceFile, *, node: str, source: str, model: str | None = None, **kw: object) -> TraceContext:
    """A ``TraceContext`` for ``tf`` named the way ``replay`` names runs (model from the file name)."""
    stem = model_from_path(tf.path)
    return TraceContext(
        node=node,
        identity=tf.identity,
        run_id=f"{stem}:{tf.identity[:12]}",
        model=model or stem,
        source=source,
        file_mtime_ns=tf.mtime_ns,
        **kw,  # type: ignore[arg-type]
    )


def model_from_path(path: Path) -> str:
    """A model name from a trace file name: the stem without ``.gz``/``.json``/``.csv``/``.db`` suffixes."""
    name = path.name
    for suffix in (".gz", ".json", ".csv", ".db", ".rocpd"):
        name = name.removesuffix(suffix)
    return name or "unknown"
