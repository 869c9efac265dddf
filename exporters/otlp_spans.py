"""Arrow batches to encoded OTLP spans (DESIGN section 5), straight from the columns.

- An iteration row is a span (the root of its trace): name from what delimited it (``model_run``,
  ``ProfilerStep``), attributes ``aaco.model``, ``aaco.iteration``, ``aaco.run_id``, ``process.pid``.
- A kernel, memcpy or memset row with a trace (the correlator gave it one) is a child span of its
  iteration, named by kernel family (``analyzers.kernels``), with ``gpu.kernel.name`` (full name),
  ``gpu.kernel.kind``, ``gpu.device.id``, ``gpu.stream.id``, ``gpu.queue.id``, ``gpu.correlation.id``,
  grid and workgroup sizes, and the launching ``thread.id``.
- Kernel span IDs are derived, vectorised, from the parent span and the kernel's identity (times,
  name, device, stream, correlation) with splitmix64 over stable hashes: a replay or a retry yields
  the same IDs, never a second copy of the trace.
"""

from __future__ import annotations

import hashlib
import re
import struct
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.analyzers.kernels import families

from . import otlp_wire as w

_TRACE_TAG = w.tag(1, w.LEN) + b"\x10"  # trace_id: 16 bytes
_SPAN_TAG = w.tag(2, w.LEN) + b"\x08"  # span_id: 8 bytes
_PARENT_TAG = w.tag(4, w.LEN) + b"\x08"  # parent_span_id: 8 bytes
_KIND_INTERNAL = w.varint_field(6, 1)
_START = w.tag(7, w.I64)
_END = w.tag(8, w.I64)
_pack_q = struct.Struct("<Q").pack
_STEP_SUFFIX = re.compile(r"#\d+$")

_M1 = np.uint64(0x9E3779B97F4A7C15)
_M2 = np.uint64(0xBF58476D1CE4E5B9)
_M3 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser over a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x + _M1
        z = (z ^ (z >> np.uint64(30))) * _M2
        z = (z ^ (z >> np.uint64(27))) * _M3
        return z ^ (z >> np.uint64(31))


def stable_hash64(text: str) -> int:
    """A 64-bit hash that is the same in every process (Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "replace"), digest_size=8).digest(), "little")


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


class SpanEncoder:
    """Encodes iterations and kernels of Arrow batches as OTLP Span messages (bytes)."""

    def __init__(self) -> None:
        self._attrs = w.AttributeCache()
        self._names: dict[str, bytes] = {}
        self._name_hash: dict[str, int] = {}

    def _name(self, name: str) -> bytes:
        enc = self._names.get(name)
        if enc is None:
            enc = w.length_delimited(5, name.encode("utf-8", "replace"))
            if len(self._names) < 10_000:
                self._names[name] = enc
        return enc

    def iteration_spans(self, batch: pa.RecordBatch) -> list[bytes]:
        """One root span per iteration row."""
        cols = batch.select(
            [
                "trace_id",
                "span_id",
                "start_ns",
                "end_ns",
                "name",
                "model",
                "iteration",
                "run_id",
                "pid",
                "tid",
                "source",
                "provider",
            ]
        ).to_pydict()
        a = self._attrs
        out = []
        for i in range(batch.num_rows):
            if cols["trace_id"][i] is None or cols["span_id"][i] is None:
                continue
            name = _STEP_SUFFIX.sub("", cols["name"][i] or "iteration")
            parts = [
                _TRACE_TAG,
                bytes.fromhex(cols["trace_id"][i]),
                _SPAN_TAG,
                bytes.fromhex(cols["span_id"][i]),
                self._name(name),
                _KIND_INTERNAL,
                _START,
                _pack_q(cols["start_ns"][i]),
                _END,
                _pack_q(cols["end_ns"][i]),
            ]
            for key, col in (
                ("aaco.model", "model"),
                ("aaco.iteration", "iteration"),
                ("aaco.run_id", "run_id"),
                ("process.pid", "pid"),
                ("thread.id", "tid"),
                ("aaco.source", "source"),
                ("aaco.provider", "provider"),
            ):
                v = cols[col][i]
                if v is not None:
                    parts.append(a.get(key, v) if col != "iteration" else w.length_delimited(9, w.key_value(key, v)))
            out.append(b"".join(parts))
        return out

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

    def kernel_spans(self, batch: pa.RecordBatch) -> tuple[list[bytes], int]:
        """Child spans for kernel rows that have a trace; returns (spans, rows without a trace)."""
        has = batch.column("trace_id").is_valid()
        if not pc.all(has).as_py():
            sub = batch.filter(has)
            missing = batch.num_rows - sub.num_rows
            batch = sub
        else:
            missing = 0
        if batch.num_rows == 0:
            return [], missing
        trace_raw, _ = _hex_ids(batch.column("trace_id").to_pylist(), 16)
        parent_raw, parent_ints = _hex_ids(batch.column("parent_span_id").to_pylist(), 8)
        span_ids = self.kernel_span_ids(batch, parent_ints)
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
        for i in range(batch.num_rows):
            parts = [
                _TRACE_TAG,
                trace_raw[i],
                _SPAN_TAG,
                span_bytes[8 * i : 8 * i + 8],
            ]
            if parent_raw[i] is not None:
                parts += [_PARENT_TAG, parent_raw[i]]
            parts += [
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
            out.append(b"".join(parts))
        return out, missing
