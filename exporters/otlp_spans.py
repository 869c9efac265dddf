"""Arrow batches and trace roots to encoded OTLP spans (docs/metrics.md), straight from the columns.

- A *root* span is an iteration (``model_run``, ``ProfilerStep``, a rocTX range) or, when nothing finer
  exists, a capture window; the assembler (``otlp_assembly``) builds it with its summary attributes,
  off-CPU span events and links to application spans.
- A kernel, memcpy or memset row is a child span of its root, named by kernel family
  (``contract.kernels``), with ``gpu.kernel.name`` (full name), ``gpu.kernel.kind``,
  ``gpu.device.id``, ``gpu.stream.id``, ``gpu.queue.id``, ``gpu.correlation.id``, grid and workgroup
  sizes, and the launching ``thread.id``. Its CPU launch call (``cudaLaunchKernel``, a HIP call),
  where the source has one, is a span too, a sibling under the same root, and the kernel links to it.
- Kernel span IDs are derived, vectorised, from the parent span and the kernel's identity (times,
  name, device, stream, correlation) with splitmix64 over stable hashes: a replay or a retry yields
  the same IDs, never a second copy of the trace. A launch span's ID derives from its kernel's.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.contract.kernels import families
from aaco.exporters import otlp_wire as w

TRACE_ID_HEAD = w.tag(1, w.LEN) + b"\x10"  # every span encoded here starts with it: trace_id, 16 bytes
_SPAN_TAG = w.tag(2, w.LEN) + b"\x08"  # span_id: 8 bytes
_PARENT_TAG = w.tag(4, w.LEN) + b"\x08"  # parent_span_id: 8 bytes
_KIND_INTERNAL = w.varint_field(6, 1)
_START = w.tag(7, w.I64)
_END = w.tag(8, w.I64)
_pack_q = struct.Struct("<Q").pack

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)
_LAUNCH_SALT = np.uint64(0x6C61756E63680001)  # "launch", keeps a launch's ID apart from its kernel's


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser over a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _M1
        z = (z ^ (z >> np.uint64(30))) * _M2
        z = (z ^ (z >> np.uint64(27))) * _M3
        return z ^ (z >> np.uint64(31))


def stable_hash64(text: str) -> int:
    """A 64-bit hash that is the same in every process (Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(w.utf8(text), digest_size=8).digest(), "little")


def _u64(col: pa.Array | pa.ChunkedArray, fill: int = 0) -> np.ndarray:
    return col.fill_null(fill).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)


def _id_matrix(col: pa.Array | pa.ChunkedArray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Hex IDs as an (n, ``size``) byte matrix (each distinct value decoded once; zeros where null) and validity."""
    enc = pc.dictionary_encode(col)
    if isinstance(enc, pa.ChunkedArray):
        enc = enc.combine_chunks()
    table = [bytes.fromhex(v)[:size].rjust(size, b"\0") for v in enc.dictionary.to_pylist()] + [bytes(size)]
    codes = enc.indices.fill_null(len(table) - 1).to_numpy(zero_copy_only=False)
    matrix = np.frombuffer(b"".join(table), dtype=np.uint8).reshape(len(table), size)[codes]
    return matrix, enc.indices.is_valid().to_numpy(zero_copy_only=False).astype(bool)


def _first_u64(matrix: np.ndarray) -> np.ndarray:
    """The first 8 bytes of each row of a byte matrix as a little-endian uint64."""
    return np.ascontiguousarray(matrix[:, :8]).view("<u8").reshape(-1).astype(np.uint64)


def _hex_ids(values: list[str | None], size: int) -> tuple[list[bytes | None], np.ndarray]:
    """Hex IDs to bytes (None where null) and to uint64 (first 8 bytes, 0 where null) for hashing."""
    matrix, valid = _id_matrix(pa.array(values, pa.string()), size)
    raw = [row.tobytes() if ok else None for row, ok in zip(matrix, valid.tolist(), strict=True)]
    return raw, _first_u64(matrix)


@dataclass
class SpanEvent:
    """A span event (an off-CPU interval of the workload's thread, ...)."""

    time_ns: int
    name: str
    attributes: dict[str, object] = field(default_factory=dict)


@dataclass
class RootSpan:
    """The root of one trace: an iteration or a capture window, built up while its trace is open."""

    trace_id: bytes
    span_id: bytes
    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, object] = field(default_factory=dict)
    parent_span_id: bytes | None = None
    events: list[SpanEvent] = field(default_factory=list)
    links: list[tuple[bytes, bytes, dict[str, object]]] = field(default_factory=list)

    def encode(self) -> bytes:
        """The Span message."""
        parts = [TRACE_ID_HEAD, self.trace_id, _SPAN_TAG, self.span_id]
        if self.parent_span_id:
            parts += [_PARENT_TAG, self.parent_span_id]
        parts += [
            w.length_delimited(5, w.utf8(self.name)),
            _KIND_INTERNAL,
            _START,
            _pack_q(self.start_ns),
            _END,
            _pack_q(max(self.end_ns, self.start_ns)),
        ]
        parts.append(w.attributes(9, self.attributes))
        for ev in self.events:  # Span.events = 11: Event{time_unix_nano=1, name=2, attributes=3}
            body = w.fixed64(1, ev.time_ns) + w.length_delimited(2, w.utf8(ev.name)) + w.attributes(3, ev.attributes)
            parts.append(w.length_delimited(11, body))
        for trace, span, attrs in self.links:
            parts.append(link(trace, span, attrs))
        return b"".join(parts)


def link(trace_id: bytes, span_id: bytes, attributes: dict[str, object] | None = None) -> bytes:
    """An encoded ``links`` field (Span.links = 13: Link{trace_id=1, span_id=2, attributes=4})."""
    body = w.length_delimited(1, trace_id) + w.length_delimited(2, span_id) + w.attributes(4, attributes or {})
    return w.length_delimited(13, body)


def link_bodies(span: bytes) -> list[tuple[int, int]]:
    """The (start, end) offsets of the ``links`` (field 13) bodies of an encoded Span, by walking its fields."""
    out = []
    i, n = 0, len(span)
    while i < n:
        key, i = w.read_varint(span, i)
        wire = key & 7
        if wire == w.VARINT:
            _, i = w.read_varint(span, i)
        elif wire == w.I64:
            i += 8
        elif wire == w.LEN:
            size, i = w.read_varint(span, i)
            if key >> 3 == 13:
                out.append((i, i + size))
            i += size
        elif wire == w.I32:
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wire} at byte {i}")
    if i != n:
        raise ValueError("truncated span")
    return out


class SpanEncoder:
    """Encodes kernel and launch spans of Arrow batches whose trace context is set."""

    def __init__(self) -> None:
        self._attrs = w.AttributeCache()
        self._names: dict[str, bytes] = {}
        self._name_hash: dict[str, int] = {}

    def _name(self, name: str) -> bytes:
        enc = self._names.get(name)
        if enc is None:
            enc = w.length_delimited(5, w.utf8(name))
            if len(self._names) < 10_000:
                self._names[name] = enc
        return enc

    def kernel_span_ids(self, batch: pa.RecordBatch, parent_ints: np.ndarray) -> np.ndarray:
        """Deterministic span IDs (uint64) for kernel rows."""
        names = pc.dictionary_encode(batch.column("name").fill_null(""))
        if isinstance(names, pa.ChunkedArray):
            names = names.combine_chunks()
        name_hashes = np.array([self._hash(n) for n in names.dictionary.to_pylist()] or [0], dtype=np.uint64)
        nh = name_hashes[names.indices.to_numpy(zero_copy_only=False)]
        devices = pc.dictionary_encode(batch.column("device").fill_null(""))
        if isinstance(devices, pa.ChunkedArray):
            devices = devices.combine_chunks()
        device_hashes = np.array(
            [stable_hash64(d) & 0xFFFFFFFF for d in devices.dictionary.to_pylist()] or [0], dtype=np.uint64
        )
        dh = device_hashes[devices.indices.to_numpy(zero_copy_only=False)]
        x = parent_ints
        for part in (
            _u64(batch.column("start_ns")),
            _u64(batch.column("end_ns")),
            nh,
            dh,
            _u64(batch.column("stream"), -1),
            _u64(batch.column("correlation_id"), -1),
        ):
            x = splitmix64(x ^ part)
        x[x == 0] = np.uint64(1)
        return x

    def _hash(self, name: str) -> int:
        h = self._name_hash.get(name)
        if h is None:
            h = stable_hash64(name)
            if len(self._name_hash) < 100_000:
                self._name_hash[name] = h
        return h

    def kernel_spans(self, batch: pa.RecordBatch, with_launches: bool = True) -> list[bytes]:
        """Child spans for kernel rows (``trace_id`` and ``parent_span_id`` set), and their launch spans.

        Built from the columns: the fixed-width parts of every span (IDs, times, the link to the launch)
        as numpy byte rows, the attributes that repeat encoded once per distinct combination of their
        values, so that each span is one join of a few slices.
        """
        n = batch.num_rows
        if n == 0:
            return []
        trace_m, has_trace = _id_matrix(batch.column("trace_id"), 16)
        parent_m, has_parent = _id_matrix(batch.column("parent_span_id"), 8)
        if not has_trace.all():
            raise ValueError("kernel_spans: rows without a trace_id")
        parent_ints = _first_u64(parent_m)
        span_ids = self.kernel_span_ids(batch, parent_ints)
        launch_ids = splitmix64(span_ids ^ _LAUNCH_SALT)
        fams = families(batch.column("name"), batch.column("kind"))
        heads = _rows(n, [TRACE_ID_HEAD, trace_m, _SPAN_TAG, _le(span_ids), _PARENT_TAG, parent_m])
        start = _u64(batch.column("start_ns"))
        end = _u64(batch.column("end_ns"))
        times = _rows(n, [_KIND_INTERNAL + _START, _le(start), _END, _le(end)])
        a = self._attrs
        combo, values = _combinations(batch, [*_ATTR_FIRST, *OPTIONAL_ATTRIBUTES], fams)
        blocks = []
        for fam, name, kind, device, *rest in values:
            first = b"".join(
                [
                    a.get("gpu.kernel.name", name or ""),
                    a.get("gpu.kernel.kind", kind or ""),
                    a.get("gpu.device.id", device or ""),
                ]
            )
            later = b"".join(
                a.get(key, v) for (key, _col), v in zip(OPTIONAL_ATTRIBUTES, rest, strict=True) if v is not None
            )
            blocks.append((self._name(fam), first, later))
        corr = batch.column("correlation_id")
        corr_parts = _correlation_fields(corr)
        ls_col, le_col = batch.column("launch_start_ns"), batch.column("launch_end_ns")
        launch_ok = np.zeros(n, dtype=bool) if not with_launches else _valid(ls_col) & _valid(le_col)
        span_len = np.where(has_parent, 38, 28).tolist()
        out: list[bytes] = []
        if not launch_ok.any():
            for i in range(n):
                h = 38 * i
                name, first, later = blocks[combo[i]]
                out.append(
                    b"".join(
                        (heads[h : h + span_len[i]], name, times[20 * i : 20 * i + 20], first, corr_parts[i], later)
                    )
                )
            return out
        lid_le = _le(launch_ids)
        links = _rows(n, [_LINK_HEAD, trace_m, _LINK_SPAN, lid_le, _LINK_ATTRS])
        lheads = _rows(n, [TRACE_ID_HEAD, trace_m, _SPAN_TAG, lid_le, _PARENT_TAG, parent_m])
        ls = _u64(ls_col)
        le = np.maximum(_u64(le_col).view(np.int64), ls.view(np.int64)).view(np.uint64)
        ltimes = _rows(n, [_KIND_INTERNAL + _START, _le(ls), _END, _le(le)])
        lcombo, lvalues = _combinations(batch, [("", "launch_name"), ("", "tid")], None)
        lblocks = [
            (
                self._name(lname or "launch"),
                a.get("thread.id", tid) if tid is not None else b"",
            )
            for lname, tid in lvalues
        ]
        kind_launch = a.get("aaco.span.kind", "gpu.launch")
        lk = len(_LINK_HEAD) + 16 + len(_LINK_SPAN) + 8 + len(_LINK_ATTRS)
        for i, ok in enumerate(launch_ok.tolist()):
            h = 38 * i
            hl = span_len[i]
            name, first, later = blocks[combo[i]]
            c = corr_parts[i]
            t = 20 * i
            kernel = (heads[h : h + hl], name, times[t : t + 20], first, c, later)
            if ok:
                lname, tid = lblocks[lcombo[i]]
                out.append(b"".join((lheads[h : h + hl], lname, ltimes[t : t + 20], kind_launch, c, tid)))
                out.append(b"".join((*kernel, links[lk * i : lk * i + lk])))
            else:
                out.append(b"".join(kernel))
        return out


_ATTR_FIRST = (("gpu.kernel.name", "name"), ("gpu.kernel.kind", "kind"), ("gpu.device.id", "device"))
# Kernel span attributes and their kernels columns, left out where the column is null.
OPTIONAL_ATTRIBUTES = (
    ("gpu.stream.id", "stream"),
    ("gpu.queue.id", "queue_id"),
    ("thread.id", "tid"),
    ("gpu.grid.x", "grid_x"),
    ("gpu.grid.y", "grid_y"),
    ("gpu.grid.z", "grid_z"),
    ("gpu.workgroup.x", "workgroup_x"),
    ("gpu.workgroup.y", "workgroup_y"),
    ("gpu.workgroup.z", "workgroup_z"),
    ("aaco.op.name", "op_name"),
)
_LINK_ATTRS = w.attributes(4, {"aaco.link": "launch"})
_LINK_HEAD = w.tag(13, w.LEN) + w.varint(18 + 10 + len(_LINK_ATTRS)) + w.tag(1, w.LEN) + b"\x10"
_LINK_SPAN = w.tag(2, w.LEN) + b"\x08"
_CORR_KEY = w.length_delimited(1, w.utf8("gpu.correlation.id"))


def family_totals(names: np.ndarray, codes: np.ndarray, dur: np.ndarray) -> list[tuple[str, int, int]]:
    """(family, busy ns, kernels) of kernels given as family codes into ``names`` and durations.

    In order of each family's first kernel: the top-families ranking breaks ties by it.
    """
    present, first, inverse, count = np.unique(codes, return_index=True, return_inverse=True, return_counts=True)
    busy = np.zeros(present.size, dtype=np.int64)
    np.add.at(busy, inverse.reshape(-1), dur)
    return [(str(names[present[j]]), int(busy[j]), int(count[j])) for j in np.argsort(first, kind="stable").tolist()]


def _le(values: np.ndarray) -> np.ndarray:
    """uint64 values as rows of 8 little-endian bytes."""
    return values.astype("<u8").view(np.uint8).reshape(-1, 8)


def _rows(n: int, parts: list[bytes | np.ndarray]) -> bytes:
    """``n`` fixed-width rows, each the concatenation of ``parts`` (constant bytes or an (n, k) byte matrix)."""
    cols = [
        np.broadcast_to(np.frombuffer(p, dtype=np.uint8), (n, len(p))) if isinstance(p, bytes) else p for p in parts
    ]
    return np.concatenate(cols, axis=1).tobytes()


def _valid(col: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return col.is_valid().to_numpy(zero_copy_only=False).astype(bool)


def _combinations(
    batch: pa.RecordBatch, columns: Any, first: np.ndarray | None
) -> tuple[list[int], list[tuple[Any, ...]]]:
    """Each row's combination of values in ``columns`` (``first``, an object array, before them).

    Returns the per-row index of the combination and the distinct combinations as Python values.
    """
    n = batch.num_rows
    codes: list[np.ndarray] = []
    dicts: list[list[Any]] = []
    if first is not None:
        uniq, inv = np.unique(first.astype(str), return_inverse=True)
        codes.append(inv.astype(np.int64))
        dicts.append(uniq.tolist())
    for _key, col in columns:
        enc = pc.dictionary_encode(batch.column(col))
        if isinstance(enc, pa.ChunkedArray):
            enc = enc.combine_chunks()
        dictionary = enc.dictionary.to_pylist()
        codes.append(enc.indices.fill_null(len(dictionary)).to_numpy(zero_copy_only=False).astype(np.int64))
        dicts.append([*dictionary, None])
    key = np.zeros(n, dtype=np.int64)
    for c, d in zip(codes, dicts, strict=True):
        key = key * len(d) + c
        key = np.unique(key, return_inverse=True)[1]
        key = key.astype(np.int64).reshape(-1)
    first_rows = np.unique(key, return_index=True)[1]
    values = [tuple(d[c[r]] for c, d in zip(codes, dicts, strict=True)) for r in first_rows.tolist()]
    return key.tolist(), values


def _correlation_fields(col: pa.Array | pa.ChunkedArray) -> list[bytes]:
    """Per row, the encoded ``gpu.correlation.id`` attribute field (empty where null).

    Varints built for the whole column at once: byte k of a value holds bits 7k..7k+6, with the high
    bit set on every byte but the last (protobuf's encoding; negative values take 10 bytes).
    """
    n = len(col)
    valid = _valid(col)
    v = col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64)
    size = np.ones(n, dtype=np.int64)
    for k in range(1, 10):
        size += v >= (np.uint64(1) << np.uint64(7 * k))
    shifts = np.arange(10, dtype=np.uint64) * np.uint64(7)
    mat = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    more = np.arange(10)[None, :] < (size[:, None] - 1)
    mat |= more.astype(np.uint8) << 7
    flat = mat[np.arange(10)[None, :] < size[:, None]].tobytes()
    ends = np.cumsum(size).tolist()
    prefixes = {}
    for s in range(1, 11):  # AnyValue{int_value=3}, its KeyValue and the attributes field, by varint size
        value = w.tag(2, w.LEN) + w.varint(1 + s) + w.tag(3, w.VARINT)
        kv_len = len(_CORR_KEY) + len(value) + s
        prefixes[s] = w.tag(9, w.LEN) + w.varint(kv_len) + _CORR_KEY + value
    out = []
    start = 0
    for ok, e, s in zip(valid.tolist(), ends, size.tolist(), strict=True):
        out.append(prefixes[s] + flat[start:e] if ok else b"")
        start = e
    return out
