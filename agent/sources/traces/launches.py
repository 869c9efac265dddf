"""Launches: the API calls that launched each kernel, joined to kernels by correlation id."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from aaco.agent.sources.traces.tables import I64, STR
from aaco.agent.sources.traces.u64 import TimeWindow


@dataclass
class LaunchTable:
    """Host API calls (HIP) by correlation id, sorted, for a vectorised join with GPU records.

    Correlation ids are ``uint64`` (``u64``; int64 ids are viewed with the same bits);
    times are raw (BOOTTIME) or epoch ns, as the caller gives them. ``pid`` and ``tid`` are int64
    arrays (the 64 bits of each id) with ``pid_ok`` / ``tid_ok`` marking the known ones: ``build``
    takes nullable Arrow columns, or numpy arrays where a negative value is unknown.
    """

    corr: np.ndarray  # uint64, sorted ascending, unique
    start: np.ndarray  # int64
    end: np.ndarray
    pid: np.ndarray  # int64
    tid: np.ndarray
    name_idx: np.ndarray  # int32 index into names
    names: list[str]
    pid_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    tid_ok: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    @classmethod
    def empty(cls) -> LaunchTable:
        """No launches."""
        z = np.zeros(0, dtype=np.int64)
        return cls(z.view(np.uint64), z, z, z, z, np.zeros(0, dtype=np.int32), [])

    @classmethod
    def build(
        cls,
        corr: np.ndarray,
        start: np.ndarray,
        end: np.ndarray,
        pid: pa.Array | np.ndarray,
        tid: pa.Array | np.ndarray,
        name_idx: np.ndarray,
        names: list[str],
    ) -> LaunchTable:
        """Sort by correlation id (``uint64``, or int64 of the same bits; the last record of a repeated id wins)."""
        corr = np.asarray(corr).view(np.uint64)
        order = np.argsort(corr, kind="stable")
        corr = corr[order]
        keep = np.ones(corr.size, dtype=bool)
        if corr.size > 1:
            keep[:-1] = corr[1:] != corr[:-1]
        idx = order[keep]
        (pid_v, pid_ok), (tid_v, tid_ok) = _known_ids(pid), _known_ids(tid)
        return cls(
            corr[keep], start[idx], end[idx], pid_v[idx], tid_v[idx], name_idx[idx], names, pid_ok[idx], tid_ok[idx]
        )

    def __len__(self) -> int:
        return int(self.corr.size)

    def lookup(self, corr: np.ndarray, valid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """For each correlation id (``uint64`` or int64 bits; only where ``valid``): (matched mask, index here)."""
        if self.corr.size == 0 or corr.size == 0:
            return np.zeros(corr.size, dtype=bool), np.zeros(corr.size, dtype=np.int64)
        corr = corr.view(np.uint64)
        pos = np.searchsorted(self.corr, corr)
        pos_c = np.minimum(pos, self.corr.size - 1)
        hit = self.corr[pos_c] == corr
        return (hit if valid is None else hit & valid), pos_c

    def columns(self, corr: np.ndarray, offset_ns: int, valid: np.ndarray | None = None) -> dict[str, pa.Array]:
        """launch_start_ns, launch_end_ns, launch_name, launch_pid, launch_tid for these correlation ids.

        Times are raw here: launches whose times convert (with ``offset_ns``) outside 1990..2100 are no match.
        """
        hit, pos = self.lookup(corr, valid)
        if hit.any():
            hit &= TimeWindow(offset_ns).mask(self.start[pos].view(np.uint64), self.end[pos].view(np.uint64))
        mask = ~hit
        start = np.where(hit, self.start[pos] + offset_ns, 0) if hit.any() else np.zeros(corr.size, np.int64)
        end = np.where(hit, self.end[pos] + offset_ns, 0) if hit.any() else np.zeros(corr.size, np.int64)
        names = pa.array(self.names or [""], STR)
        name_idx = self.name_idx[pos] if self.name_idx.size else np.zeros(corr.size, np.int32)
        empty = not self.pid.size
        return {
            "launch_start_ns": pa.array(start, I64, mask=mask),
            "launch_end_ns": pa.array(end, I64, mask=mask),
            "launch_name": names.take(pa.array(name_idx, pa.int32(), mask=mask)),
            "launch_pid": pa.nulls(corr.size, I64)
            if empty
            else pa.array(self.pid[pos], I64, mask=mask | ~self.pid_ok[pos]),
            "launch_tid": pa.nulls(corr.size, I64)
            if empty
            else pa.array(self.tid[pos], I64, mask=mask | ~self.tid_ok[pos]),
        }


def _known_ids(ids: pa.Array | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values, known mask) of a nullable Arrow column, or of a numpy array where negative is unknown."""
    if isinstance(ids, np.ndarray):
        values = ids.astype(np.int64, copy=False)
        return values, values >= 0
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    known = ~np.asarray(ids.is_null(), dtype=bool) if ids.null_count else np.ones(len(ids), dtype=bool)
    values = np.asarray(ids.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return values, known
