"""Group rows of a batch by key columns, fast in the common case where a key is constant.

Analyzers fold batches per (node, model), per stream, per iteration, per kernel name. A batch
nearly always holds one node, one model and one run, a few streams, a run of consecutive
iterations: so each key column is first checked for being constant (one comparison pass, no
hashing), integer keys with a small range are compacted with ``bincount`` (linear, no sort), and
only the rest is dictionary-encoded. ``pyarrow``'s group-by would hash every key column of every
row every time; measured on 64k-row batches this is 3-10x faster (benchmarks/analyzers.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class Groups:
    """Row groups: ``keys[i]`` is the key tuple of group ``i``; ``index[r]`` the group of row ``r``."""

    keys: list[tuple[Any, ...]]
    index: np.ndarray  # int64, one per row

    def sums(self, values: np.ndarray) -> np.ndarray:
        """Per-group sums of ``values`` (1-D, or 2-D with rows as the last axis), as int64."""
        if values.ndim == 1:
            return np.bincount(self.index, weights=values, minlength=len(self.keys)).astype(np.int64)
        return np.stack([self.sums(v) for v in values])

    def mins(self, values: np.ndarray) -> np.ndarray:
        """Per-group minima."""
        return self._reduce(np.minimum, values)

    def maxs(self, values: np.ndarray) -> np.ndarray:
        """Per-group maxima."""
        return self._reduce(np.maximum, values)

    def _reduce(self, ufunc: np.ufunc, values: np.ndarray) -> np.ndarray:
        if len(self.keys) == 1:
            return np.array([ufunc.reduce(values)])
        order = np.argsort(self.index, kind="stable")
        starts = np.searchsorted(self.index[order], np.arange(len(self.keys)))
        return ufunc.reduceat(values[order], starts)

    def counts(self) -> np.ndarray:
        """Rows per group."""
        return np.bincount(self.index, minlength=len(self.keys))

    def mask(self, i: int) -> np.ndarray | slice:
        """Row selector of group ``i`` (a full slice when there is one group)."""
        return slice(None) if len(self.keys) == 1 else self.index == i


def _compact(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes 0..k-1 per value, the k distinct values in order) for an int64 array."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo <= 4 * values.size + 1024:
        present = np.bincount(values - lo, minlength=hi - lo + 1) > 0
        uniques = np.flatnonzero(present) + lo
        lookup = np.cumsum(present) - 1
        return lookup[values - lo], uniques
    uniques, inverse = np.unique(values, return_inverse=True)
    return inverse.astype(np.int64), uniques


def _constant(col: pa.Array) -> bool:
    """Whether every value equals the first (no nulls), read from the buffers with numpy.

    Strings: equal lengths in the offsets, then the bytes compared with themselves shifted by one
    row, about 5x faster than ``pc.equal`` + ``pc.all``; other types: numpy or pyarrow.
    """
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        width = 8 if pa.types.is_large_string(col.type) else 4
        _, offsets_buf, data_buf = col.buffers()
        offsets = np.frombuffer(
            offsets_buf, dtype=np.int64 if width == 8 else np.int32, count=len(col) + 1, offset=col.offset * width
        )
        lengths = np.diff(offsets)
        if not bool((lengths == lengths[0]).all()):
            return False
        if lengths[0] == 0 or data_buf is None:
            return True
        # Rows of equal length are all equal exactly when the bytes repeat with that period: one
        # contiguous comparison of the block with itself shifted by a row (no (n, width) temporary).
        data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0] : offsets[-1]]
        width_bytes = int(lengths[0])
        return bool(np.array_equal(data[width_bytes:], data[:-width_bytes]))
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        values = col.to_numpy(zero_copy_only=False)
        return bool((values == values[0]).all())
    return bool(pc.all(pc.equal(col, col[0])).as_py())


def _column_codes(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, list[Any]] | Any:
    """A constant column's value, or (codes per row, distinct values) with None for nulls."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count == 0 and len(col) and _constant(col):
        return _Const(col[0].as_py())
    if col.null_count == len(col):
        return _Const(None)
    if pa.types.is_integer(col.type):
        sentinel = int(pc.min(col).as_py()) - 1
        codes, uniques = _compact(col.fill_null(sentinel).to_numpy(zero_copy_only=False).astype(np.int64))
        keys = [None if (col.null_count and u == sentinel) else int(u) for u in uniques.tolist()]
        return codes, keys
    enc = pc.dictionary_encode(col)
    values = [*enc.dictionary.to_pylist(), None]
    return enc.indices.fill_null(len(values) - 1).to_numpy(zero_copy_only=False).astype(np.int64), values


@dataclass(frozen=True)
class _Const:
    value: Any


def group(*columns: pa.Array | pa.ChunkedArray) -> Groups:
    """Group the rows by the given (equal-length) columns; nulls are a key value of their own."""
    n = len(columns[0])
    if n == 0:
        return Groups([], np.zeros(0, np.int64))
    parts = [_column_codes(c) for c in columns]
    varying = [(i, p) for i, p in enumerate(parts) if not isinstance(p, _Const)]
    if not varying:
        return Groups([tuple(p.value for p in parts)], np.zeros(n, np.int64))
    # Mixed-radix codes of the varying columns, re-compacted whenever the radix product could
    # overflow int64; each group remembers its row of first appearance to recover its key.
    combined = np.zeros(n, np.int64)
    radix = 1
    for _, (codes, values) in varying:
        if radix * len(values) >= 2**62:
            combined, uniques = _compact(combined)
            radix = len(uniques)
        combined = combined * len(values) + codes
        radix *= len(values)
    index, uniques = _compact(combined)
    first_row = np.full(len(uniques), n, np.int64)
    np.minimum.at(first_row, index, np.arange(n))
    decoded = [(i, codes[first_row], values) for i, (codes, values) in varying]
    keys = []
    for g in range(len(uniques)):
        key: list[Any] = [p.value if isinstance(p, _Const) else None for p in parts]
        for i, codes, values in decoded:
            key[i] = values[codes[g]]
        keys.append(tuple(key))
    return Groups(keys, index)
