"""Cumulative kernel counters turned into per-drain deltas, and per-thread histograms summed per process."""

from __future__ import annotations

import numpy as np


class Cumulative:
    """Previous cumulative values per key, to turn the kernel's counters into deltas."""

    def __init__(self, width: int, wrap_from: int | None = None) -> None:
        self.wrap_from = width if wrap_from is None else wrap_from
        self.keys = np.zeros(0, dtype=np.uint64)
        self.vals = np.zeros((0, width), dtype=np.uint64)
        self.tags = np.zeros(0, dtype=np.uint64)

    def __len__(self) -> int:
        return int(self.keys.size)

    def delta(self, keys: np.ndarray, vals: np.ndarray, tags: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
        """Deltas of ``vals`` (rows keyed by ``keys``), how many known keys vanished, and the sort order.

        Rows come back sorted by key: ``order`` is the permutation applied to the inputs.
        A key seen for the first time counts from zero; a key whose tag (the tgid of a tid)
        changed, or any of whose counters went backwards, was re-created: its value is the delta.
        Columns from ``wrap_from`` on are u32 counters: their deltas are taken modulo 2**32 and
        they take no part in telling a re-created entry.
        """
        order = np.argsort(keys, kind="stable")
        keys, vals, tags = keys[order], vals[order], tags[order]
        prev = np.zeros_like(vals)
        if self.keys.size and keys.size:
            idx = np.clip(np.searchsorted(self.keys, keys), 0, self.keys.size - 1)
            found = (self.keys[idx] == keys) & (self.tags[idx] == tags)
            prev[found] = self.vals[idx[found]]
        delta = vals.astype(np.int64) - prev.astype(np.int64)
        w = self.wrap_from
        delta[:, w:] &= 0xFFFFFFFF
        reset = (delta[:, :w] < 0).any(axis=1)
        delta[reset] = vals[reset].astype(np.int64)
        vanished = int(np.setdiff1d(self.keys, keys, assume_unique=True).size) if self.keys.size else 0
        self.keys, self.vals, self.tags = keys, vals, tags
        return delta, vanished, order

    def forget(self, keys: np.ndarray) -> None:
        """Drop ``keys`` (deleted from the kernel map)."""
        if keys.size and self.keys.size:
            keep = ~np.isin(self.keys, keys)
            self.keys, self.vals, self.tags = self.keys[keep], self.vals[keep], self.tags[keep]


def hist_per_process(tgids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-thread histogram deltas (rows: threads, columns: slots) summed per tgid: non-zero (tgid, slot, count)."""
    if not tgids.size:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    uniq, inverse = np.unique(tgids, return_inverse=True)
    per = np.zeros((uniq.size, counts.shape[1]), np.int64)
    np.add.at(per, inverse, counts)
    rows, slots = np.nonzero(per)
    return uniq[rows].astype(np.int64), slots.astype(np.int64), per[rows, slots]
