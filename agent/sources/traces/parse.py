"""Parse any recognised trace file: one entry point for ``replay`` and ``trace_dir``.

``parse_any(tf, ctx)`` hands ``tf`` to the parse its format registered (``registry``; the format is
``detect.sniff``'s) and yields ``ParsedTrace`` chunks: at most ``tables.CHUNK_ROWS`` kernels each,
iterations (and the devices, skipped counts and bad rows found so far) on the first, so a caller can
publish chunk by chunk. Large formats stream (rocprofv3 CSV in blocks of lines, rocprofv3 JSON with
ijson, rocpd with SQLite cursors, Kineto traces window by window with ``kineto_stream``); ONNX
Runtime profiles and rocprof v1 results.json are read whole. Every file is read within ``limits``
(its size checked before reading, gzip streamed and bounded, JSON depth bounded), and a damaged
JSON document keeps its good events (``json_salvage``). A file that cannot be read at all raises
``TraceFormatError``; bad rows inside a readable file are skipped, counted and listed on the chunks
instead.

Then, for every format: CLOCK_BOOTTIME times recorded on another boot are re-anchored
(``clock_anchor``), the kernels of a file without iterations get a model (``_model_stamp``), and
every row the job the file belongs to (``job_stamp``: the job columns, and the job's name as the
model of a rank of a distributed job).

Which files give what (so a directory read file by file yields every event once): rocprofv3
``*_kernel_trace.csv`` and ``*_memory_copy_trace.csv`` give kernels (with launches and devices
from the ``*_hip_api_trace.csv`` and ``*_agent_info.csv`` beside them), ``*_marker_api_trace.csv``
gives iterations, ``*_hip_api_trace.csv`` and ``*_agent_info.csv`` give nothing on their own.
Publish a directory's marker traces before its kernel traces so iterations arrive first
(``ITERATIONS_FIRST``).
"""

from __future__ import annotations

import csv
import sqlite3
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces import rocprofv3_csv
from aaco.agent.sources.traces.clock_anchor import BootClockCheck
from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.job_stamp import stamp_jobs
from aaco.agent.sources.traces.limits import DEFAULT_MAX_BYTES, TraceLimits, check_size
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.registry import TRACE_FORMATS
from aaco.agent.sources.traces.tables import const
from aaco.contract.errors import TraceFormatError

# Formats whose files hold iterations only: read them before the kernel traces of the same run.
ITERATIONS_FIRST = TRACE_FORMATS.iterations_first
# Formats a tail reader can follow while they grow (complete lines, see Rocprofv3CsvDecoder).
TAILABLE = TRACE_FORMATS.tailable


def _parse(tf: TraceFile, ctx: TraceContext, limits: TraceLimits) -> Iterator[ParsedTrace]:
    """The chunks of ``tf`` from its format's own parse (``registry``)."""
    fmt = TRACE_FORMATS.get(tf.format)
    if fmt is None:
        raise TraceFormatError(f"no parser for format {tf.format!r}", subject=tf.path)
    return fmt.parse(tf, ctx, limits)


def _model_stamp(parts: Iterator[ParsedTrace], tf: TraceFile, ctx: TraceContext) -> Iterator[ParsedTrace]:
    """Kernels of a file without iteration markers get a model: the user's, else the file's, else its stem.

    The correlator keeps a model a source stamped (it fills only the gaps), so nothing is stamped
    when the file has iterations, or when a rocprofv3 CSV's marker trace beside it gives them.
    """
    label: str | None = None
    for i, part in enumerate(parts):
        if i == 0 and part.iterations.num_rows == 0:
            label = kernels_model(tf, ctx, part.model)
        if label is not None and part.kernels.num_rows:
            part.kernels = with_model(part.kernels, label)
        yield part


def kernels_model(tf: TraceFile, ctx: TraceContext, file_model: str | None = None) -> str | None:
    """The model the kernels of ``tf`` are stamped with when it has no iterations (``_model_stamp``).

    The user's, else the one the file names (``file_model``), else the file name's stem; None when a
    rocprofv3 marker trace beside it gives iterations. One rule for every reader of the file (a
    replay, a spool's whole-file read and its tail of a growing CSV), so a file names the same model
    whichever source reads it.
    """
    if tf.format in TAILABLE and "marker_api_trace.csv" in rocprofv3_csv.companions(tf.path):
        return None
    return ctx.model if ctx.model_given else (file_model or model_from_path(tf.path))


def with_model(kernels: pa.Table, label: str) -> pa.Table:
    """``kernels`` with null models (or no model column) set to ``label``."""
    n = kernels.num_rows
    if "model" not in kernels.column_names:
        return kernels.append_column("model", const(label, n))
    i = kernels.schema.get_field_index("model")
    col = kernels.column(i)
    if col.null_count == 0:
        return kernels
    filled = pc.coalesce(col.cast(pa.string()), pa.scalar(label, pa.string()))
    return kernels.set_column(i, "model", filled)


def parse_any(
    tf: TraceFile,
    ctx: TraceContext,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    limits: TraceLimits | None = None,
    read: Sequence[ParsedTrace] | None = None,
) -> Iterator[ParsedTrace]:
    """Parse a recognised trace file into ``ParsedTrace`` chunks (see the module doc).

    ``limits`` bound the work (``limits``; default: the file's own ``tf.limits`` or the
    defaults, with ``max_bytes`` on disk and decompressed); the size on disk is checked before reading. Times of a
    CLOCK_BOOTTIME trace recorded on another boot are re-anchored (``clock_anchor``), and kernels
    of a file without iterations take a model (``_model_stamp``). Raises ``TraceFormatError``
    (naming the file) when the file cannot be read or is not the format it looked like; bad rows
    inside a readable file never raise. The rows carry their job (``job_stamp``). ``read``: the
    file's chunks as ``read_ahead`` gave them, given their job here and not read again.
    """
    parts = iter(read) if read is not None else read_ahead(tf, ctx, max_bytes=max_bytes, limits=limits)
    yield from _guarded(tf, stamp_jobs(parts, tf, ctx))


def read_ahead(
    tf: TraceFile, ctx: TraceContext, *, max_bytes: int = DEFAULT_MAX_BYTES, limits: TraceLimits | None = None
) -> Iterator[ParsedTrace]:
    """``parse_any``'s chunks before their job is known (``job_scan`` reads ranks ahead to name their jobs)."""
    limits = limits or replace(tf.limits or TraceLimits(), max_file_bytes=max_bytes)

    def chunks() -> Iterator[ParsedTrace]:
        check_size(tf.path, limits)
        yield from _model_stamp(BootClockCheck(tf, ctx).apply(_parse(tf, ctx, limits)), tf, ctx)

    return _guarded(tf, chunks())


def _guarded(tf: TraceFile, parts: Iterator[ParsedTrace]) -> Iterator[ParsedTrace]:
    """``parts``, a reading error raised as the ``TraceFormatError`` that names the file."""
    try:
        yield from parts
    except TraceFormatError:
        raise
    except (ValueError, OSError, EOFError, zlib.error, csv.Error, sqlite3.Error) as exc:
        raise TraceFormatError(str(exc) or type(exc).__name__, subject=tf.path) from exc


def context_for(tf: TraceFile, *, node: str, source: str, model: str | None = None, **kw: object) -> TraceContext:
    """A ``TraceContext`` for ``tf`` named the way ``replay`` names runs.

    ``model``: the name the user (or the traced process) gives, which wins over the file's own
    (``model_given``); without it the file name's stem, a default the file's own model replaces.
    """
    stem = model_from_path(tf.path)
    return TraceContext(
        node=node,
        identity=tf.identity,
        run_id=f"{stem}:{tf.identity[:12]}",
        model=model or stem,
        model_given=bool(model),
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
