"""rocprofv3 JSON, the whole-file fast path: its record arrays parsed by Arrow's JSON reader.

Why: the streaming path (``rocprofv3_json``) walks every ``ijson`` event of the file in Python, twice,
at about a fifth of a whole-document ``orjson.loads``; here the three big arrays of a process,
``buffer_records.kernel_dispatch``, ``memory_copy`` and ``hip_api`` (one record per dispatch, copy and
launch), are cut out of the file's bytes and read by ``pyarrow.json`` into columns (no Python object per
event), and pass 1 walks the rest of the document, now small. Peak memory: the file's bytes, one
piece of an array and the columns (docs/performance.md).

When: a content of at most ``MAX_BYTES`` (a larger one streams, in flat memory) whose records hold
no array (their first ``]`` ends them), which the documented layout guarantees; a record is cut from
the next at ``}`` ``,`` ``{`` (a match inside a string only changes that string, which no field read
here is). What it reads is then checked, and any doubt sends the whole file to the streaming path,
which reads everything as before: a file of more than one process, a key met twice, a document that
is not valid JSON once the arrays are emptied (cut short, damaged, too deep), an array that is not
where the layout puts it, or a value Arrow will not read as the unsigned 64-bit integer it should be
(negative, fractional, past 64 bits, a string, a key twice in a record), or a dispatch field written
beside ``dispatch_info`` rather than inside it. Records are then kept, skipped and counted exactly as
the streaming path does (``_Batch``, ``TimeWindow``).
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Final

import orjson
import pyarrow as pa
import pyarrow.json as pj

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.limits import TraceLimits, read_document
from aaco.agent.sources.traces.rocprofv3_json_meta import Metadata, metadata_of
from aaco.contract.errors import TraceFormatError

MAX_BYTES: Final = 256 << 20  # larger files stream: this path holds the whole content (about 1.8x it at peak)
PIECE_BYTES: Final = 8 << 20  # an array is cut into pieces of about this size, at record boundaries
_KEY = re.compile(rb'"(kernel_dispatch|memory_copy|hip_api)"\s*:\s*\[')
_BETWEEN = re.compile(rb"\}\s*,\s*\{")
_ROOT = re.compile(rb'^\s*\{\s*"rocprofiler-sdk-tool"\s*:\s*\[')
_U: Final = pa.uint64()
_HANDLE: Final = pa.struct([("handle", _U)])
_XYZ: Final = pa.struct([("x", _U), ("y", _U), ("z", _U)])
_COMMON: Final = [
    ("thread_id", _U),
    ("correlation_id", pa.struct([("internal", _U)])),
    ("start_timestamp", _U),
    ("end_timestamp", _U),
]
_DISPATCH_INFO: Final = [
    ("agent_id", _HANDLE),
    ("queue_id", _HANDLE),
    ("kernel_id", _U),
    ("workgroup_size", _XYZ),
    ("grid_size", _XYZ),
]
SCHEMAS: Final = {
    # the dispatch fields beside dispatch_info too, so that a record written so is seen (and the file left
    # to the streaming path, which takes both)
    "kernel_dispatch": pa.schema(
        [*_COMMON, ("dispatch_info", pa.struct(_DISPATCH_INFO)), *_DISPATCH_INFO, ("stream_id", _HANDLE)]
    ),
    "memory_copy": pa.schema(
        [
            *_COMMON,
            ("kind", _U),
            ("operation", _U),
            ("src_agent_id", _HANDLE),
            ("dst_agent_id", _HANDLE),
            ("bytes", _U),
            ("stream_id", _HANDLE),
        ]
    ),
    "hip_api": pa.schema([*_COMMON, ("kind", _U), ("operation", _U)]),
}
_BESIDE: Final = ("agent_id.handle", "queue_id.handle", "kernel_id", "workgroup_size.x", "grid_size.x")


class NotSimple(Exception):  # noqa: N818 - control flow: the file is left to the streaming path
    """The file is not of the shape this path reads exactly."""


class Prepared:
    """A file read by the fast path: pass 1's metadata and each GPU array's columns, in file order."""

    def __init__(self, meta: Metadata, arrays: list[tuple[str, dict[str, pa.ChunkedArray]]]) -> None:
        self.meta = meta
        self.arrays = arrays


def prepare(path: Path, ctx: TraceContext, limits: TraceLimits) -> Prepared | None:
    """The file read whole by the fast path, or None when it must go the streaming way (see the module doc)."""
    bound = min(limits.max_file_bytes or MAX_BYTES, MAX_BYTES)
    try:
        doc = read_document(path, replace(limits, max_file_bytes=bound), json_guard=True)
        if doc.damage:
            return None
        return _prepare(doc.data, ctx)
    except (NotSimple, TraceFormatError, ValueError, OSError, EOFError, pa.ArrowException):
        return None


def _prepare(data: bytearray, ctx: TraceContext) -> Prepared:
    if not _ROOT.match(data):
        raise NotSimple("not a list of processes")
    spans: dict[str, tuple[int, int]] = {}
    for m in _KEY.finditer(data):
        name = m.group(1).decode()
        end = data.find(b"]", m.end())
        if name in spans or end < 0:
            raise NotSimple(f"{name} twice, or not closed")
        spans[name] = (m.end(), end)
    order = sorted(spans.items(), key=lambda kv: kv[1][0])
    bounds = [0, *(b for _name, span in order for b in span), len(data)]  # what lies between the arrays
    small = b"".join(data[bounds[j] : bounds[j + 1]] for j in range(0, len(bounds), 2))
    _check_layout(small, set(spans))
    columns = {name: _columns(data, start, end, name) for name, (start, end) in order}
    hip = columns.pop("hip_api", None)
    meta = metadata_of(io.BytesIO(small), ctx, host=hip)
    return Prepared(meta, [(name, cols) for name, cols in columns.items()])


def _check_layout(small: bytes, emptied: set[str]) -> None:
    """The document without the arrays: valid JSON, one process, each emptied array where the layout puts it."""
    root = orjson.loads(small)
    procs = root.get("rocprofiler-sdk-tool") if isinstance(root, dict) else None
    if not isinstance(procs, list) or len(procs) != 1 or not isinstance(procs[0], dict):
        raise NotSimple("not exactly one process")
    records = procs[0].get("buffer_records")
    if emptied and (not isinstance(records, dict) or any(records.get(name) != [] for name in emptied)):
        raise NotSimple("an array outside buffer_records")


def _pieces(data: bytearray, start: int, end: int) -> Iterator[bytes]:
    """The array's records as pieces of about ``PIECE_BYTES``, each a stream of objects (no commas between)."""
    at = start
    while at < end:
        cut = end
        if end - at > PIECE_BYTES:
            m = _BETWEEN.search(data, at + PIECE_BYTES, end)
            if m is not None:
                cut = m.start() + 1
        yield _BETWEEN.sub(b"}\n{", data[at:cut])
        if cut == end:
            return
        at = data.index(b"{", cut)


def _columns(data: bytearray, start: int, end: int, name: str) -> dict[str, pa.ChunkedArray]:
    """The array's records as columns by their path in a record (``dispatch_info.agent_id.handle``)."""
    options = pj.ParseOptions(
        explicit_schema=SCHEMAS[name], newlines_in_values=True, unexpected_field_behavior="ignore"
    )
    tables = [
        pj.read_json(io.BytesIO(piece), parse_options=options) for piece in _pieces(data, start, end) if piece.strip()
    ]
    table = pa.concat_tables(tables) if tables else SCHEMAS[name].empty_table()
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    if name == "kernel_dispatch" and any(table.column(c).null_count < table.num_rows for c in _BESIDE):
        raise NotSimple("dispatch fields beside dispatch_info")
    return {c: table.column(c) for c in table.column_names}
