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


def _hex_ids(values: list[str | None], size: int) -> tuple[list[bytes | None], np.ndarray]:
    """Hex IDs to bytes (cached per distinct value) and to uint64 (first 8 bytes) for hashing."""
    cache: dict[str, bytes] = {}
    raw: list[bytes | None] = []
    for v in values:
        if v is None:
            raw.append(None)
            continue
        b = cache.get(v)
        if b is None:
            b = cache[v] = bytes.fromhex(v)[:size].rjust(size, b"\0")
        raw.append(b)
    ints = np.array([int.from_bytes(b[:8], "little") if b else 0 for b in raw], dtype=np.uint64)
    return raw, ints


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
        names = batch.column("name").to_pylist()
        nh = np.empty(len(names), dtype=np.uint64)
        for i, n in enumerate(names):
            h = self._name_hash.get(n or "")
            if h is None:
                h = stable_hash64(n or "")
                if len(self._name_hash) < 100_000:
                    self._name_hash[n or ""] = h
            nh[i] = h
        devices = batch.column("device").fill_null("").to_pylist()
        dh = np.array([stable_hash64(d) & 0xFFFFFFFF for d in devices], dtype=np.uint64) if devices else nh[:0]
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

    def kernel_spans(self, batch: pa.RecordBatch, with_launches: bool = True) -> list[bytes]:
        """Child spans for kernel rows (``trace_id`` and ``parent_span_id`` set), and their launch spans."""
        n = batch.num_rows
        if n == 0:
            return []
        trace_raw, _ = _hex_ids(batch.column("trace_id").to_pylist(), 16)
        parent_raw, parent_ints = _hex_ids(batch.column("parent_span_id").to_pylist(), 8)
        span_ids = self.kernel_span_ids(batch, parent_ints)
        launch_ids = splitmix64(span_ids ^ _LAUNCH_SALT)
        fams = families(batch.column("name"), batch.column("kind"))
        cols: dict[str, list[Any]] = batch.select(
            [
                "start_ns",
                "end_ns",
                "name",
                "kind",
                "device",
                "stream",
                "queue_id",
                "correlation_id",
                "tid",
                "grid_x",
                "grid_y",
                "grid_z",
                "workgroup_x",
                "workgroup_y",
                "workgroup_z",
                "op_name",
                "launch_start_ns",
                "launch_end_ns",
                "launch_name",
            ]
        ).to_pydict()
        a = self._attrs
        optional = (
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
        out = []
        span_bytes = span_ids.astype("<u8").tobytes()
        launch_bytes = launch_ids.astype("<u8").tobytes()
        for i in range(n):
            trace = trace_raw[i]
            parent = parent_raw[i]
            head = [TRACE_ID_HEAD, trace, _SPAN_TAG, span_bytes[8 * i : 8 * i + 8]]
            if parent is not None:
                head += [_PARENT_TAG, parent]
            parts = [
                *head,
                self._name(fams[i]),
                _KIND_INTERNAL,
                _START,
                _pack_q(cols["start_ns"][i]),
                _END,
                _pack_q(cols["end_ns"][i]),
                a.get("gpu.kernel.name", cols["name"][i] or ""),
                a.get("gpu.kernel.kind", cols["kind"][i] or ""),
                a.get("gpu.device.id", cols["device"][i] or ""),
            ]
            corr = cols["correlation_id"][i]
            if corr is not None:
                parts.append(w.length_delimited(9, w.key_value("gpu.correlation.id", corr)))
            for key, col in optional:
                v = cols[col][i]
                if v is not None:
                    parts.append(a.get(key, v))
            ls, le = cols["launch_start_ns"][i], cols["launch_end_ns"][i]
            if with_launches and ls is not None and le is not None and trace is not None:
                lid = launch_bytes[8 * i : 8 * i + 8]
                parts.append(link(trace, lid, {"aaco.link": "launch"}))
                launch = [TRACE_ID_HEAD, trace, _SPAN_TAG, lid]
                if parent is not None:
                    launch += [_PARENT_TAG, parent]
                launch += [
                    self._name(cols["launch_name"][i] or "launch"),
                    _KIND_INTERNAL,
                    _START,
                    _pack_q(ls),
                    _END,
                    _pack_q(max(le, ls)),
                    a.get("aaco.span.kind", "gpu.launch"),
                ]
                if corr is not None:
                    launch.append(w.length_delimited(9, w.key_value("gpu.correlation.id", corr)))
                if cols["tid"][i] is not None:
                    launch.append(a.get("thread.id", cols["tid"][i]))
                out.append(b"".join(launch))
            out.append(b"".join(parts))
        return out
