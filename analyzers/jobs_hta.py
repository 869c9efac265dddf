"""Holistic Trace Analysis 0.5.0's per-rank definitions, streamed: kernel types, whole microseconds, a rank's window.

Source lines are those of the ``holistictraceanalysis`` 0.5.0 wheel (docs/jobs.md, "Per rank: HTA's figures").

- **Kernel types** (``hta/utils/utils.py`` ``get_kernel_type``): communication when the name matches
  ``^nccl.*Kernel``; else memory when it matches ``^Memcpy|^Memset|^dma``; else computation unless it
  matches ``(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)`` (then other). Rows of kind memcpy or
  memset count as memory whatever their name (Kineto names them Memcpy/Memset, so HTA agrees).
- **Whole microseconds** (``hta/common/trace_parser.py`` ``round_down_time_stamps``): starts rounded
  up, ends down (``end = ts + dur`` first), ``dur = end - ts``.
- **The window** (``hta/common/trace.py`` ``_filter_irrelevant_gpu_kernels``): the GPU work whose
  launch started before the rank's last ``ProfilerStep`` started; with one step or none, all of it.
- **Temporal breakdown** (``hta/analyzers/breakdown_analysis.py`` ``get_temporal_breakdown``,
  ``_get_idle_time_for_kernels``): kernel time from the first merged group's start to the last
  group's end; idle = kernel time - merged busy time; compute = merged time of computation kernels;
  non-compute = kernel time - compute - idle.
- **Overlap** (``hta/analyzers/communication_analysis.py`` ``get_comm_comp_overlap``): the time
  merged communication and merged computation run together over the merged communication time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.analyzers.intervals import Shares, merge_groups, overlap_sweep, shares

COMMUNICATION: Final = 0
MEMORY: Final = 1
COMPUTATION: Final = 2
OTHER: Final = 3

_COMM_RE: Final = re.compile(r"^nccl.*Kernel")
_MEMORY_RE: Final = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_NOT_COMPUTE_RE: Final = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
# hta/analyzers/straggler.py _compute_normalized_start_time_of_significant_comm_kernels: the collectives
# the straggler metric considers are the kernels whose name starts so.
STRAGGLER_KERNEL_PREFIX: Final = "ncclKernel"
_CACHE_LIMIT: Final = 65_536
_EMPTY: Final = np.zeros(0, np.int64)


def kernel_type(name: str) -> int:
    """HTA's ``get_kernel_type`` of a kernel name."""
    if _COMM_RE.match(name):
        return COMMUNICATION
    if _MEMORY_RE.match(name):
        return MEMORY
    if not _NOT_COMPUTE_RE.match(name):
        return COMPUTATION
    return OTHER


class KernelTypes:
    """Kernel types of a batch's names, each distinct name matched once (a bounded cache)."""

    def __init__(self) -> None:
        self._cache: dict[str, int] = {}

    def of(self, names: pa.Array | pa.ChunkedArray, kinds: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """One type per row (int8); rows of kind memcpy or memset are memory."""
        enc = pc.dictionary_encode(names.fill_null(""))
        if isinstance(enc, pa.ChunkedArray):
            enc = enc.combine_chunks()
        if len(self._cache) > _CACHE_LIMIT:
            self._cache.clear()
        table = np.array([self._type(n) for n in enc.dictionary.to_pylist()], dtype=np.int8)
        types = table[enc.indices.to_numpy(zero_copy_only=False)] if table.size else np.zeros(0, np.int8)
        copies = pc.is_in(kinds, pa.array(["memcpy", "memset"])).fill_null(False).to_numpy(zero_copy_only=False)
        return np.where(copies, np.int8(MEMORY), types)

    def _type(self, name: str) -> int:
        t = self._cache.get(name)
        if t is None:
            t = self._cache[name] = kernel_type(name)
        return t


def ceil_us(ns: np.ndarray) -> np.ndarray:
    """Nanoseconds to whole microseconds, rounded up (HTA's starts)."""
    return -((-ns) // 1000)


def floor_us(ns: np.ndarray) -> np.ndarray:
    """Nanoseconds to whole microseconds, rounded down (HTA's ends)."""
    return ns // 1000


@dataclass(frozen=True)
class RankFigures:
    """HTA's figures of one rank's window, in microseconds as HTA computes them."""

    kernel_time_us: int
    idle_time_us: int
    compute_time_us: int
    non_compute_time_us: int
    comm_time_us: int
    overlap_time_us: int
    kernels: int

    @property
    def shares(self) -> Shares:
        """Idle, compute and non-compute as shares of the kernel time."""
        return shares(self.kernel_time_us, self.kernel_time_us - self.idle_time_us, self.compute_time_us)

    @property
    def overlap_ratio(self) -> float | None:
        """Communication time during which computation also ran (0..1); None without communication."""
        return self.overlap_time_us / self.comm_time_us if self.comm_time_us > 0 else None

    def to_dict(self) -> dict[str, float | int | None]:
        """HTA's columns (``get_temporal_breakdown``, ``get_comm_comp_overlap``), percentages unrounded."""
        k = max(1, self.kernel_time_us)
        overlap = self.overlap_ratio
        return {
            "kernel_time_us": self.kernel_time_us,
            "idle_time_us": self.idle_time_us,
            "compute_time_us": self.compute_time_us,
            "non_compute_time_us": self.non_compute_time_us,
            "idle_time_pctg": 100 * self.idle_time_us / k,
            "compute_time_pctg": 100 * self.compute_time_us / k,
            "non_compute_time_pctg": 100 * self.non_compute_time_us / k,
            "comm_time_us": self.comm_time_us,
            "comp_comm_overlap_pctg": None if overlap is None else 100 * overlap,
            "kernels": self.kernels,
        }


_CLASSES: Final = ("all", "compute", "comm")


class RankWindow:
    """One rank's window (a run: one trace file, one capture), its kernel intervals merged as they fold in.

    Each of three sets (every kernel, computation, communication) is kept as HTA's merged groups.
    Past ``max_groups`` groups the older half is sealed into sums at a boundary of the whole set
    (a gap of every kernel, so no set's group crosses it); an interval folded later that starts
    before that boundary still merges with what remains, and is counted in ``late``.
    """

    def __init__(self, max_groups: int = 65_536) -> None:
        self._max = max(2, max_groups)
        self.groups: dict[str, tuple[np.ndarray, np.ndarray]] = {c: (_EMPTY, _EMPTY) for c in _CLASSES}
        self.sealed: dict[str, int] = {c: 0 for c in (*_CLASSES, "overlap")}
        self.first: int | None = None  # start of the first group once sealed
        self.sealed_end: int | None = None  # the boundary sealed up to
        self.kernels = 0
        self.late = 0

    def fold(self, lo: np.ndarray, hi: np.ndarray, types: np.ndarray) -> None:
        """Merge intervals (whole microseconds) of the given kernel types in."""
        if lo.size == 0:
            return
        self.kernels += int(lo.size)
        if self.sealed_end is not None:
            self.late += int((lo < self.sealed_end).sum())
        self.groups = _merged(self.groups, lo, hi, types)
        if self.groups["all"][0].size > self._max:
            self._seal()

    def figures(
        self, lo: np.ndarray | None = None, hi: np.ndarray | None = None, types: np.ndarray | None = None
    ) -> RankFigures | None:
        """HTA's figures, with the given intervals (HTA's one-step window) merged in if any; None when empty."""
        groups, kernels = self.groups, self.kernels
        if lo is not None and hi is not None and types is not None and lo.size:
            groups, kernels = _merged(groups, lo, hi, types), kernels + int(lo.size)
        if kernels == 0:
            return None
        glo, ghi = groups["all"]
        first = self.first if self.first is not None else int(glo[0])
        last = int(ghi[-1]) if ghi.size else int(self.sealed_end or first)
        busy = self.sealed["all"] + _length(groups["all"])
        compute = self.sealed["compute"] + _length(groups["compute"])
        comm = self.sealed["comm"] + _length(groups["comm"])
        overlap = self.sealed["overlap"] + overlap_sweep(*groups["comm"], *groups["compute"])
        kernel_time = last - first
        idle = kernel_time - busy
        return RankFigures(kernel_time, idle, compute, kernel_time - compute - idle, comm, overlap, kernels)

    def _seal(self) -> None:
        glo, _ = self.groups["all"]
        cut = int(glo[glo.size // 2])
        if self.first is None:
            self.first = int(glo[0])
        kept: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        old: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for c in _CLASSES:
            lo, hi = self.groups[c]
            before = lo < cut
            old[c], kept[c] = (lo[before], hi[before]), (lo[~before], hi[~before])
            self.sealed[c] += _length(old[c])
        self.sealed["overlap"] += overlap_sweep(*old["comm"], *old["compute"])
        self.groups, self.sealed_end = kept, cut


def _length(groups: tuple[np.ndarray, np.ndarray]) -> int:
    return int((groups[1] - groups[0]).sum())


def _merged(
    groups: dict[str, tuple[np.ndarray, np.ndarray]], lo: np.ndarray, hi: np.ndarray, types: np.ndarray
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    out = {}
    for c, mask in (("all", None), ("compute", types == COMPUTATION), ("comm", types == COMMUNICATION)):
        add_lo, add_hi = (lo, hi) if mask is None else (lo[mask], hi[mask])
        glo, ghi = groups[c]
        out[c] = (
            merge_groups(np.concatenate([glo, add_lo]), np.concatenate([ghi, add_hi])) if add_lo.size else (glo, ghi)
        )
    return out
