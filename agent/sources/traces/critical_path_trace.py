"""One Kineto rank's events as Holistic Trace Analysis 0.5.0 holds them for its critical path.

HTA reads a trace into a dataframe (``hta/common/trace_parser.py``, ``hta/common/trace.py``) and the
critical path works on that frame; this module builds the same rows without pandas, so the path that
``critical_path_graph`` finds on them is HTA's. What each step follows (docs/jobs.md, "Critical
path", cites the lines):

- rows: the events with a ``dur`` and a ``cat``, less ``cat: "Trace"`` (``_compress_df``); an
  event's index is its position in ``traceEvents`` (``_parse_trace_dataframe_json``);
- times: when the trace has fractional (nanosecond) timestamps HTA rounds every event inwards to whole
  microseconds, ``ts = ceil(ts)``, ``end = floor(ts + dur)`` (``round_down_time_stamps``), then
  shifts them so the earliest event starts at 0 (``_align_all_ranks``; its ``end`` column is left
  unshifted, which the whole-trace window inherits);
- args: ``stream``, ``correlation``, ``wait_on_stream``, ``wait_on_cuda_event_record_corr_id``,
  each -1 when absent (the default ``ParserConfig``), the stream made an integer or -1
  (``normalize_gpu_stream_numbers``);
- ``index_correlation``: a CPU event and the GPU event (kernel, copy, set, sync) of the same
  correlation point at each other; 0 for a correlated event whose partner is missing, -1 for none
  (``transform_correlation_to_index``);
- the last-step filter: with more than one ``ProfilerStep`` name, CPU events from the last step's
  start on are dropped (up to its end with ``include_last_step``) and so is GPU work whose launch
  went with them; the frame then holds the GPU rows first (``_filter_irrelevant_gpu_kernels``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# GPU-side synchronisation events with no stream that HTA still counts as GPU work (trace_filter.py).
DEVICE_SYNCS = frozenset({"Event Sync", "Context Sync"})
# Runtime calls that enqueue GPU work (TraceSymbolTable.get_runtime_launch_events_query).
LAUNCHES = frozenset(
    {
        "cudaMemsetAsync",
        "cudaMemcpyAsync",
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cuLaunchKernel",
        "runFunction - job_prep_and_submit_for_execution",
        "hipLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipMemcpyAsync",
        "hipMemsetAsync",
        "hipMemcpyWithStream",
    }
)
STEP = "ProfilerStep"


class CriticalPathError(Exception):
    """Where HTA 0.5.0 fails on a trace or a step (an assertion, a merge it refuses, a cycle)."""


@dataclass(slots=True)
class Ev:
    """One row of HTA's frame: the columns the critical path reads."""

    idx: int  # position in traceEvents
    name: str
    cat: str
    pid: Any
    tid: Any
    ts: Any  # whole microseconds after rounding, shifted to the trace's first event
    dur: Any
    end_raw: Any  # ts + dur before the shift (HTA's unshifted ``end`` column)
    stream: int
    corr: int
    wait_stream: int
    wait_corr: int
    ic: int = -1  # index_correlation

    @property
    def is_gpu(self) -> bool:
        """GPU work or a device synchronisation (``_filter_gpu_kernels_with_cuda_sync``)."""
        return (self.stream >= 0 and self.corr >= 0) or self.name in DEVICE_SYNCS


@dataclass(slots=True)
class CpTrace:
    """HTA's frame of one rank: ``rows`` in the frame's order, ``by_idx`` by event index."""

    rows: list[Ev]
    by_idx: dict[int, Ev]
    symbols: frozenset[str]  # HTA's symbol table: every name and category

    def cpu_by_ic(self) -> dict[int, list[Ev]]:
        """Rows on no stream (``stream == -1``) by the event their ``index_correlation`` names."""
        out: dict[int, list[Ev]] = {}
        for r in self.rows:
            if r.stream == -1:
                out.setdefault(r.ic, []).append(r)
        return out


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)


def _int_arg(v: Any) -> int:
    if isinstance(v, bool) or not _is_num(v):
        return -1
    return int(v)


def _stream(v: Any) -> int:
    """``normalize_gpu_stream_numbers``: ``int(stream)``, -1 where that fails."""
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):
        return -1


def unstable_order(keys: Sequence[Any]) -> list[int]:
    """The order pandas' ``sort_values`` gives: numpy's quicksort, which is not stable.

    HTA 0.5.0 sorts with pandas' default, so the order of equal timestamps is numpy's; the same call
    on the same values gives the same order, and AACO's path follows HTA's through its ties.
    """
    if not keys:
        return []
    arr = np.asarray(keys, dtype=np.int64 if all(type(k) is int for k in keys) else np.float64)
    return np.argsort(arr, kind="quicksort").tolist()


def _fractional(events: Sequence[Any]) -> bool:
    """HTA rounds when its ``ts`` column is float64: some event's ``ts`` is not an integer (or absent)."""
    return any(isinstance(e, Mapping) and type(e.get("ts")) is not int for e in events)


def _row(i: int, e: Mapping[str, Any], fractional: bool) -> Ev | None:
    dur, cat, ts = e.get("dur"), e.get("cat"), e.get("ts")
    if cat is None or cat == "Trace" or not _is_num(dur) or not _is_num(ts):
        return None
    if fractional:
        end = math.floor(float(ts) + float(dur))
        ts = math.ceil(ts)
        dur = end - ts
    args = e.get("args")
    if not isinstance(args, Mapping):
        args = {}
    return Ev(
        idx=i,
        name=str(e.get("name", "")),
        cat=str(cat),
        pid=e.get("pid"),
        tid=e.get("tid"),
        ts=ts,
        dur=dur,
        end_raw=ts + dur,
        stream=_stream(args.get("stream", -1)),
        corr=_int_arg(args.get("correlation", -1)),
        wait_stream=_int_arg(args.get("wait_on_stream", -1)),
        wait_corr=_int_arg(args.get("wait_on_cuda_event_record_corr_id", -1)),
    )


def _link_correlations(rows: list[Ev]) -> None:
    """``transform_correlation_to_index``: CPU and GPU events of one correlation name each other."""
    gpu_by_corr: dict[int, list[Ev]] = {}
    for r in rows:
        r.ic = min(r.corr, 0)
        if r.corr != -1 and r.is_gpu:
            gpu_by_corr.setdefault(r.corr, []).append(r)
    # The inner merge lists pairs in the CPU rows' order; each assignment overwrites the last.
    for r in rows:
        if r.corr == -1 or r.is_gpu:
            continue
        for g in gpu_by_corr.get(r.corr, ()):
            r.ic = g.idx
            g.ic = r.idx


def _drop_last_step(rows: list[Ev], include_last_step: bool) -> list[Ev]:
    """``_filter_irrelevant_gpu_kernels``: CPU rows before the last step, and the GPU work they launched."""
    cpu = [r for r in rows if not r.is_gpu]
    steps = [r for r in cpu if STEP in r.name]
    if not steps:  # HTA compares with NaN: nothing is kept
        return []
    if include_last_step:
        last_end = max(r.end_raw for r in steps)  # the unshifted end: every row passes
        kept = [r for r in cpu if r.ts <= last_end]
    else:
        last_start = max(r.ts for r in steps)
        kept = [r for r in cpu if r.ts < last_start]
    corrs = {r.corr for r in kept}
    return [r for r in rows if r.is_gpu and r.corr in corrs] + kept


def load_trace(
    events: Sequence[Mapping[str, Any]], *, include_last_step: bool = False, fractional: bool | None = None
) -> CpTrace:
    """HTA's frame of one rank's ``traceEvents`` (``TraceAnalysis(trace_dir=...)`` then ``get_trace``).

    ``fractional`` says whether HTA would round the times (its ``ts`` column is float64); by default
    it is read from ``events``, which should then be the whole ``traceEvents`` list.
    """
    if fractional is None:
        fractional = _fractional(events)
    rows = [r for i, e in enumerate(events) if isinstance(e, Mapping) and (r := _row(i, e, fractional)) is not None]
    symbols = frozenset({r.name for r in rows} | {r.cat for r in rows})
    _link_correlations(rows)
    if rows:
        first = min(r.ts for r in rows)
        for r in rows:
            r.ts -= first
    if sum(1 for s in symbols if STEP in s) > 1:
        rows = _drop_last_step(rows, include_last_step)
    return CpTrace(rows=rows, by_idx={r.idx: r for r in rows}, symbols=symbols)
