"""GPU time and kernel families in prefill versus decode, per served model (docs/serving.md).

A request row (``requests``, from a server's request span) marks its process's kernels: those
launched in its prefill window ``[start + queue, start + queue + prefill]`` (no prefill latency:
up to ``start + ttft``) are prefill, else those in its decode window ``[prefill end, prefill end +
decode]`` (no decode latency: up to the span's end) are decode. A kernel is placed by its CPU launch
time where the source has one, else its start, and matched on (node, pid). Request spans end after
their kernels, so the kernels not yet marked wait in a ring per process; the request windows are
kept too, for kernels that arrive later (a profiler's capture). A kernel is attributed once, when
first marked; among the windows marking it at that moment prefill wins over decode. Bounded: rings
by count (kernels: all processes together) and by age (event time, each process against its own
newest times, since processes replayed from old captures and live ones run on different clocks),
processes by count and by idleness (wall time since their last batch), and (model, namespace, pod)
groups by count; kernels and requests left out are counted.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveFloat, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer, ratio
from aaco.analyzers.grouping import group
from aaco.contract.config_base import StrictModel
from aaco.contract.kernels import FAMILIES, family_codes
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define

PHASES = ("prefill", "decode")
LABELS = ("model", "namespace", "pod")
GPU_SECONDS = define(
    "aaco.llm.gpu.time",
    "aaco_llm_gpu_seconds",
    "counter",
    "s",
    "GPU time (sum of kernel durations) of the kernels a served model's process launched in its requests' "
    "prefill or decode windows (a kernel in both counts as prefill).",
    (*LABELS, "phase"),
)
FAMILY_SECONDS = define(
    "aaco.llm.kernel.family.time",
    "aaco_llm_kernel_family_seconds",
    "counter",
    "s",
    "GPU time of a served model's prefill or decode kernels by kernel family.",
    (*LABELS, "phase", "family"),
)
UNMATCHED = define(
    "aaco.llm.phase.kernels_unmatched",
    "aaco_llm_phase_kernels_unmatched",
    "counter",
    "{kernel}",
    "Kernels that left the prefill/decode matching without a request window: aged out or pushed out of "
    "their process's ring, or over the process bound.",
    ("reason",),
)
REQUESTS_LEFT_OUT = define(
    "aaco.llm.phase.requests_skipped",
    "aaco_llm_phase_requests_skipped",
    "counter",
    "{request}",
    "Requests that marked no kernels: no pid to match kernels on, no TTFT or prefill latency, or over a bound.",
    ("reason",),
)

Group = tuple[str, str, str]  # model, namespace, pod
_EMPTY_I64 = np.zeros(0, np.int64)
_EMPTY_I16 = np.zeros(0, np.int16)


@dataclass
class _Ring:
    """One process's kernels not yet marked (chunks in arrival order), and its recent request windows.

    Kernels are kept as the chunks they came in, so a batch costs its own size rather than a copy of
    everything held; they are merged into one chunk only when requests mark them.
    """

    chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)  # launch ns, GPU ns, family
    size: int = 0
    windows: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.int64))  # pre lo/hi, dec lo/hi, group
    newest_kernel: int = np.iinfo(np.int64).min  # this process's own clock: the newest launch seen
    newest_end: int = np.iinfo(np.int64).min  # and the newest request end
    touched: float = 0.0  # wall time (the analyzer's clock) of its last batch

    def append(self, t: np.ndarray, dur: np.ndarray, fam: np.ndarray) -> None:
        """Hold these kernels (launch, else start, ns; GPU ns; family index)."""
        if t.size:
            self.chunks.append((t, dur, fam))
            self.size += t.size

    def merged(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All kernels held, as one chunk."""
        if len(self.chunks) != 1:
            parts = list(zip(*self.chunks, strict=True)) or [(_EMPTY_I64,), (_EMPTY_I64,), (_EMPTY_I16,)]
            self.chunks = [tuple(np.concatenate(p) for p in parts)]  # type: ignore[list-item]
        return self.chunks[0]

    def keep(self, keep: np.ndarray) -> None:
        """Keep only the merged kernels where ``keep`` is true."""
        t, dur, fam = self.merged()
        self.chunks = [(t[keep], dur[keep], fam[keep])]
        self.size = int(self.chunks[0][0].size)

    def drop_older(self, cut: int) -> int:
        """Drop the kernels launched before ``cut``; how many."""
        kept, before = [], self.size
        for t, dur, fam in self.chunks:
            if t.size and t.min() >= cut:
                kept.append((t, dur, fam))
            elif t.size and t.max() >= cut:
                k = t >= cut
                kept.append((t[k], dur[k], fam[k]))
        self.chunks = kept
        self.size = sum(c[0].size for c in kept)
        return before - self.size

    def drop_oldest(self, n: int) -> None:
        """Drop the ``n`` kernels that arrived first."""
        while n > 0 and self.chunks:
            t, dur, fam = self.chunks[0]
            if t.size <= n:
                self.chunks.pop(0)
                n -= t.size
                self.size -= t.size
            else:
                self.chunks[0] = (t[n:], dur[n:], fam[n:])
                self.size -= n
                n = 0


@dataclass(frozen=True)
class PhaseFamily:
    """One kernel family's GPU time in one phase of a model."""

    time_s: float
    share: float | None  # of the phase's GPU time
    kernels: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"time_s": self.time_s, "share": self.share, "kernels": self.kernels}


@dataclass(frozen=True)
class ModelPhases:
    """GPU time in prefill and decode of one (model, namespace, pod), and its top families per phase."""

    prefill_s: float
    decode_s: float
    prefill_share: float | None  # of prefill + decode GPU time
    requests: int  # requests whose windows were matched against kernels
    families: dict[str, dict[str, PhaseFamily]]  # phase -> family -> time (top first)

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "prefill_share": self.prefill_share,
            "requests": self.requests,
            "families": {p: {f: v.to_dict() for f, v in fams.items()} for p, fams in self.families.items()},
        }


@dataclass(frozen=True)
class ServingPhasesResult:
    """Prefill/decode GPU time per (model, namespace, pod), and what was left out."""

    groups: dict[Group, ModelPhases]
    unmatched: dict[str, int]  # kernels, by reason
    skipped: dict[str, int]  # requests, by reason

    def to_dict(self) -> dict[str, Any]:
        """``{"groups": [{"model", "namespace", "pod", ...}], "kernels_unmatched", "requests_skipped"}``."""
        return {
            "groups": [
                {"model": m, "namespace": ns, "pod": pod, **g.to_dict()}
                for (m, ns, pod), g in sorted(self.groups.items())
            ],
            "kernels_unmatched": dict(sorted(self.unmatched.items())),
            "requests_skipped": dict(sorted(self.skipped.items())),
        }

    def points(self) -> list[MetricPoint]:
        """GPU seconds per phase and per (phase, family), and the counts of what was left out."""
        pb = PointBuilder()
        for (model, ns, pod), g in self.groups.items():
            labels = {"model": model, "namespace": ns, "pod": pod}
            for phase, seconds in (("prefill", g.prefill_s), ("decode", g.decode_s)):
                pb.add(GPU_SECONDS, seconds, phase=phase, **labels)
                for fam, v in g.families[phase].items():
                    pb.add(FAMILY_SECONDS, v.time_s, phase=phase, family=fam, **labels)
        for reason, n in self.unmatched.items():
            pb.add(UNMATCHED, n, reason=reason)
        for reason, n in self.skipped.items():
            pb.add(REQUESTS_LEFT_OUT, n, reason=reason)
        return pb.points


class ServingPhasesSettings(StrictModel):
    """GPU time and kernel families in prefill versus decode per served model (from request spans)."""

    max_kernels: PositiveInt = Field(
        1_000_000,
        description="Kernels not yet marked kept, all processes together (about 18 bytes each); over it the "
        "oldest of the process holding most are pushed out, counted.",
    )
    max_requests: PositiveInt = Field(
        4096, description="Request windows kept per process, for kernels that come later."
    )
    max_age_s: PositiveFloat = Field(
        300.0,
        description="Kernels and request windows older than this (event time, behind the newest kernel or "
        "request end seen in the same process) are dropped, and processes left with neither or that had no "
        "batch for this long (wall time).",
    )
    max_processes: PositiveInt = Field(256, description="Processes (node, pid) tracked at once.")
    top: PositiveInt = Field(8, description="Kernel families listed per phase in the snapshot.")


def _ints(b: pa.RecordBatch, name: str) -> np.ndarray:
    return b.column(name).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def _floats(b: pa.RecordBatch, name: str) -> np.ndarray:
    return b.column(name).to_numpy(zero_copy_only=False).astype(np.float64)  # nulls -> NaN


def _ns(seconds: np.ndarray) -> np.ndarray:
    return np.rint(np.nan_to_num(seconds) * 1e9).astype(np.int64)


def request_windows(b: pa.RecordBatch) -> tuple[np.ndarray, np.ndarray]:
    """Per request row: ``(windows, phased)``, windows as int64 columns prefill lo, hi, decode lo, hi (ns).

    Prefill starts at ``start + queue`` (no queue latency: ``start + ttft - prefill`` when both are
    there, else ``start``) and lasts ``prefill`` (else ends at ``start + ttft``); decode follows it
    for ``decode`` (else up to ``end``). ``phased`` is false for rows with neither TTFT nor prefill.
    """
    start, end = _ints(b, "start_ns"), _ints(b, "end_ns")
    queue, ttft, prefill, decode = (_floats(b, n) for n in ("queue_s", "ttft_s", "prefill_s", "decode_s"))
    has_q, has_t, has_p, has_d = (~np.isnan(v) for v in (queue, ttft, prefill, decode))
    pre_lo = start + np.where(has_q, _ns(queue), np.where(has_t & has_p, _ns(ttft) - _ns(prefill), 0))
    pre_hi = np.where(has_p, pre_lo + _ns(prefill), start + _ns(ttft))
    dec_hi = np.where(has_d, pre_hi + _ns(decode), end)
    return np.stack([pre_lo, pre_hi, pre_hi, dec_hi], axis=1), has_t | has_p


def containing(t: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per time in ``t``: the index of a window ``[lo, hi]`` holding it (the one reaching furthest), else -1."""
    out = np.full(t.size, -1, np.int64)
    keep = np.flatnonzero(hi >= lo)
    if keep.size == 0 or t.size == 0:
        return out
    order = keep[np.argsort(lo[keep], kind="stable")]
    lo_s, hi_s = lo[order], hi[order]
    reach = np.maximum.accumulate(hi_s)
    best = np.maximum.accumulate(np.where(hi_s == reach, np.arange(order.size), 0))
    i = np.searchsorted(lo_s, t, side="right") - 1
    ok = i >= 0
    ok[ok] = reach[i[ok]] >= t[ok]
    out[ok] = order[best[i[ok]]]
    return out


def mark(t: np.ndarray, windows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel time: ``(phase, window)``, phase 0 prefill, 1 decode, -1 none (prefill wins)."""
    pre = containing(t, windows[:, 0], windows[:, 1])
    dec = containing(t, windows[:, 2], windows[:, 3])
    phase = np.where(pre >= 0, 0, np.where(dec >= 0, 1, -1))
    return phase, np.where(pre >= 0, pre, dec)


class ServingPhasesAnalyzer(Analyzer):
    """Marks each process's kernels as prefill or decode by its requests' windows; sums GPU time per model."""

    name = "serving_phases"
    kinds = frozenset({"kernels", "requests"})

    def __init__(
        self,
        max_groups: int = 256,
        max_kernels: int = 1_000_000,
        max_requests: int = 4096,
        max_age_s: float = 300.0,
        max_processes: int = 256,
        top: int = 8,
        hold_kernels: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._max_groups = max_groups
        self._max_kernels = max_kernels
        self._max_requests = max_requests
        self._max_age_s = max_age_s
        self._max_age_ns = round(max_age_s * 1e9)
        self._clock = clock
        self._max_processes = max_processes
        self._top = top
        self._hold = hold_kernels  # False when no request span can arrive: kernels cost nothing then
        self._rings: dict[tuple[str, int], _Ring] = {}
        self._groups: dict[Group, int] = {}
        self._time = np.zeros((0, 2, len(FAMILIES)), np.int64)  # group, phase, family -> ns
        self._count = np.zeros((0, 2, len(FAMILIES)), np.int64)
        self._requests = np.zeros(0, np.int64)
        self.unmatched: dict[str, int] = {}
        self.skipped: dict[str, int] = {}

    def _left_out(self, counts: dict[str, int], reason: str, n: int) -> None:
        if n:
            counts[reason] = counts.get(reason, 0) + n

    def _ring(self, key: tuple[str, int], rows: int, kernels: bool) -> _Ring | None:
        ring = self._rings.get(key)
        if ring is None:
            if len(self._rings) >= self._max_processes:
                if kernels:
                    self._left_out(self.unmatched, "process_limit", rows)
                else:
                    self._left_out(self.skipped, "process_limit", rows)
                return None
            ring = self._rings[key] = _Ring()
        ring.touched = self._clock()
        return ring

    def _drop_idle(self) -> None:
        """Free the slots of processes that had no batch for ``max_age_s`` of wall time."""
        cut = self._clock() - self._max_age_s
        for key in [k for k, r in self._rings.items() if r.touched < cut]:
            self._left_out(self.unmatched, "aged_out", self._rings.pop(key).size)

    def update(self, item: EventBatch) -> None:
        """Fold a kernels or requests batch in."""
        b = item.batch
        if b.num_rows == 0:
            return
        self._drop_idle()
        if item.kind == "requests":
            self._requests_in(b)
        else:
            self._kernels_in(b)
        self._sweep()

    def _kernels_in(self, b: pa.RecordBatch) -> None:
        if not self._hold:
            return
        t = pc.coalesce(b.column("launch_start_ns"), b.column("start_ns")).to_numpy(zero_copy_only=False)
        dur = np.maximum(_ints(b, "end_ns") - _ints(b, "start_ns"), 0)
        fam = family_codes(b.column("name"), b.column("kind"))
        pid = b.column("pid").fill_null(-1)
        self._left_out(self.unmatched, "no_pid", int((pid.to_numpy(zero_copy_only=False) < 0).sum()))
        procs = group(b.column("node"), pid)
        for i, key in enumerate(procs.keys):
            if key[1] < 0:
                continue
            sel = procs.mask(i)
            kt, kd, kf = t[sel].astype(np.int64), dur[sel], fam[sel]
            ring = self._ring(key, kt.size, kernels=True)
            if ring is None:
                continue
            ring.newest_kernel = max(ring.newest_kernel, int(kt.max()))
            phase, window = mark(kt, ring.windows)
            hit = phase >= 0
            self._attribute(ring.windows[window[hit], 4], phase[hit], kf[hit], kd[hit])
            if hit.any():
                kt, kd, kf = kt[~hit], kd[~hit], kf[~hit]
            ring.append(kt, kd, kf)

    def _sweep(self) -> None:
        """Drop what aged out, then the oldest kernels of the largest rings over ``max_kernels``, then empty rings."""
        for ring in self._rings.values():
            self._left_out(self.unmatched, "aged_out", ring.drop_older(ring.newest_kernel - self._max_age_ns))
            keep = ring.windows[:, 3] >= ring.newest_end - self._max_age_ns
            keep[np.flatnonzero(keep)[: max(0, int(keep.sum()) - self._max_requests)]] = False
            ring.windows = ring.windows[keep]
        over = sum(r.size for r in self._rings.values()) - self._max_kernels
        while over > 0:
            ring = max(self._rings.values(), key=lambda r: r.size)
            n = min(over, ring.size)
            ring.drop_oldest(n)
            self._left_out(self.unmatched, "ring_full", n)
            over -= n
        for key in [k for k, r in self._rings.items() if r.size == 0 and r.windows.shape[0] == 0]:
            del self._rings[key]

    def _group_index(self, key: Group) -> int:
        g = self._groups.get(key)
        if g is None:
            if len(self._groups) >= self._max_groups:
                return -1
            g = self._groups[key] = len(self._groups)
            grow = ((0, 1), (0, 0), (0, 0))
            self._time, self._count = np.pad(self._time, grow), np.pad(self._count, grow)
            self._requests = np.pad(self._requests, (0, 1))
        return g

    def _requests_in(self, b: pa.RecordBatch) -> None:
        windows, phased = request_windows(b)
        pid = b.column("pid").fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        self._left_out(self.skipped, "no_pid", int(((pid < 0) & phased).sum()))
        self._left_out(self.skipped, "no_phases", int((~phased).sum()))
        labels = [b.column(n).fill_null("").to_pylist() for n in LABELS]
        gidx = np.full(pid.size, -1, np.int64)
        for i in np.flatnonzero(phased & (pid >= 0)).tolist():
            gidx[i] = self._group_index((labels[0][i], labels[1][i], labels[2][i]))
        self._left_out(self.skipped, "group_limit", int(((gidx < 0) & phased & (pid >= 0)).sum()))
        rows = np.flatnonzero(gidx >= 0)
        if rows.size == 0:
            return
        nodes = b.column("node").take(pa.array(rows))
        procs = group(nodes, pa.array(pid[rows]))
        end = _ints(b, "end_ns")
        for i, key in enumerate(procs.keys):
            r = rows[procs.mask(i)]
            ring = self._ring(key, r.size, kernels=False)
            if ring is None:
                continue
            new = np.column_stack([windows[r], gidx[r]])
            np.add.at(self._requests, gidx[r], 1)
            t, dur, fam = ring.merged()
            phase, window = mark(t, new)
            hit = phase >= 0
            if hit.any():
                self._attribute(new[window[hit], 4], phase[hit], fam[hit], dur[hit])
                ring.keep(~hit)
            ring.windows = np.concatenate([ring.windows, new])
            ring.newest_end = max(ring.newest_end, int(end[r].max()))

    def _attribute(self, groups: np.ndarray, phase: np.ndarray, fam: np.ndarray, dur: np.ndarray) -> None:
        """Add marked kernels' GPU time and counts to their (group, phase, family) totals."""
        if groups.size == 0:
            return
        flat = (groups * 2 + phase) * len(FAMILIES) + fam
        size = self._time.size
        self._time += np.bincount(flat, weights=dur, minlength=size).astype(np.int64).reshape(self._time.shape)
        self._count += np.bincount(flat, minlength=size).reshape(self._count.shape)

    def snapshot(self) -> ServingPhasesResult:
        """Per group: GPU seconds per phase, the prefill share, the top families per phase."""
        out: dict[Group, ModelPhases] = {}
        for key, g in self._groups.items():
            phase_ns = self._time[g].sum(axis=1)
            fams: dict[str, dict[str, PhaseFamily]] = {}
            for p, phase in enumerate(PHASES):
                top = np.argsort(-self._time[g, p], kind="stable")[: self._top]
                fams[phase] = {
                    FAMILIES[f]: PhaseFamily(
                        int(self._time[g, p, f]) / 1e9,
                        ratio(int(self._time[g, p, f]), int(phase_ns[p])),
                        int(self._count[g, p, f]),
                    )
                    for f in top.tolist()
                    if self._count[g, p, f]
                }
            out[key] = ModelPhases(
                int(phase_ns[0]) / 1e9,
                int(phase_ns[1]) / 1e9,
                ratio(int(phase_ns[0]), int(phase_ns.sum())),
                int(self._requests[g]),
                fams,
            )
        return ServingPhasesResult(out, dict(self.unmatched), dict(self.skipped))


def create(s: ServingPhasesSettings, hints: AgentHints, max_models: int) -> ServingPhasesAnalyzer:
    """The analyzer for its settings (the group bound is the agent's model bound).

    It holds no kernels when no request span can arrive (``hints.request_spans``: the receiver is off).
    """
    return ServingPhasesAnalyzer(
        max_models, s.max_kernels, s.max_requests, s.max_age_s, s.max_processes, s.top, hints.request_spans
    )
