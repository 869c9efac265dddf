"""What HTA 0.5.0's critical path reads from a rank's whole trace: queue lengths and CUDA event links.

Three tables, built once per trace and shared by every step (HTA builds them from the full frame,
not the step's clipped one):

- queue lengths (``TraceCounters._get_queue_length_time_series_for_rank``): per stream, launches
  count +1 and the GPU work they launched -1, in time order (work counted at its start); the value
  after each event, by event index;
- the launch before each ``cudaEventRecord`` on the recorded event's GPU and stream
  (``CPGraph._get_cuda_event_record_df``), by the record's correlation;
- the launch after each ``cudaStreamWaitEvent`` on the same CPU thread to the waiting stream
  (``CPGraph._get_cuda_stream_wait_event_df``), by the wait call's event index.

Ties in time are broken as pandas' default (unstable) sort breaks them (``unstable_order``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from aaco.agent.sources.traces.critical_path_trace import LAUNCHES, CpTrace, CriticalPathError, Ev, unstable_order

_NO_LAUNCH = float(sys.maxsize)  # HTA fills a missing launch id with sys.maxsize (as a float)


@dataclass(slots=True)
class Launch:
    """A runtime call that launched GPU work (``_get_cuda_runtime_calls_df``), in launch-id order."""

    ev: Ev
    gpu: object  # the launched work's pid (its device)
    stream: int  # the launched work's stream


@dataclass(slots=True)
class SyncTables:
    """The whole-trace tables (None where HTA's own would be None: the symbols are missing)."""

    queue: dict[int, int]
    record_prev_launch: dict[int, int] | None  # cudaEventRecord correlation -> launch event index or -1
    wait_next_launch: dict[int, int] | None  # cudaStreamWaitEvent event index -> launch event index or -1


def queue_lengths(t: CpTrace) -> dict[int, int]:
    """Outstanding work per stream after each launch and each launched event, by event index."""
    launches = [r for r in t.rows if r.name in LAUNCHES and r.ic > 0]
    gpu = [r for r in t.rows if r.stream != -1]
    gpu_by_corr: dict[int, list[Ev]] = {}
    for g in gpu:
        gpu_by_corr.setdefault(g.corr, []).append(g)
    # (ts, stream or None, event index, +1 / -1): the left join of launches on the work's correlation
    items: list[tuple[object, object, int, int]] = []
    for r in launches:
        for g in gpu_by_corr.get(r.corr, [None]):  # type: ignore[list-item]
            items.append((r.ts, None if g is None else g.stream, r.idx, 1))
    n_launches = len(items)
    corrs = {r.corr for r in launches}
    items.extend((g.ts, g.stream, g.idx, -1) for g in gpu if g.corr in corrs)
    if len(items) != 2 * n_launches:  # HTA asserts one launched event per launch
        raise CriticalPathError("launches and launched GPU events do not pair up")
    if all(it[1] is None for it in items):  # HTA's table is None, and its graph fails on it
        raise CriticalPathError("no GPU work launched on a stream")
    # per stream, a running sum in time order (HTA: groupby("stream") then cumsum)
    level: dict[object, int] = {}
    out: dict[int, int] = {}
    for k in unstable_order([it[0] for it in items]):
        _, stream, idx, step = items[k]
        if stream is not None:
            out[idx] = level[stream] = level.get(stream, 0) + step
    return out


def launches(t: CpTrace) -> list[Launch]:
    """Launch calls whose work is on a stream, sorted by time; a launch's position is its launch id."""
    calls = [r for r in t.rows if r.name in LAUNCHES and r.ic > 0]
    out = []
    for k in unstable_order([r.ts for r in calls]):
        r = calls[k]
        g = t.by_idx.get(r.ic)
        if g is not None and g.stream != -1 and g.ic > 0:
            out.append(Launch(r, g.pid, g.stream))
    return out


def record_prev_launch(t: CpTrace, calls: list[Launch]) -> dict[int, int] | None:
    """For each recorded CUDA event that something waits on: the last launch before the record."""
    if "cudaEventRecord" not in t.symbols:
        return None
    waited: dict[int, tuple[int, object]] = {}
    for r in t.rows:
        if r.wait_stream > -1:
            key = (r.wait_stream, r.pid)
            if waited.setdefault(r.wait_corr, key) != key:
                raise CriticalPathError("one recorded CUDA event waited on from two streams")  # MergeError
    all_records = [r for r in t.rows if r.name == "cudaEventRecord"]
    if len({r.corr for r in all_records}) != len(all_records):
        raise CriticalPathError("two cudaEventRecord calls with one correlation")  # MergeError
    ordered = (all_records[k] for k in unstable_order([r.ts for r in all_records]))
    records = [(r, waited[r.corr]) for r in ordered if r.corr in waited]
    if not records:
        return None
    # launches then records, sorted together by time once; each (gpu, stream) reads its own rows
    comb: list[tuple[object, object, int, Ev]] = [(c.gpu, c.stream, k, c.ev) for k, c in enumerate(calls)]
    comb.extend((gpu, stream, -1, r) for r, (stream, gpu) in records)
    order = unstable_order([ev.ts for *_, ev in comb])
    out: dict[int, int] = {}
    for gpu, stream in sorted({(g, s) for _, (s, g) in records}, key=_sort_key):
        last = -1
        for k in order:
            g, s, launch_id, ev = comb[k]
            if g != gpu or s != stream:
                continue
            if launch_id >= 0:
                last = max(last, launch_id)
            else:
                out[ev.corr] = calls[last].ev.idx if last >= 0 else -1
    return out


def wait_next_launch(t: CpTrace, calls: list[Launch]) -> dict[int, int] | None:
    """For each ``cudaStreamWaitEvent``: the next launch from its CPU thread to the waiting stream."""
    if "cudaStreamWaitEvent" not in t.symbols or "Stream Wait Event" not in t.symbols:
        return None
    waits_all = [r for r in t.rows if r.name == "cudaStreamWaitEvent" and r.ic > 0]
    waits: list[tuple[Ev, int]] = []
    for k in unstable_order([r.ts for r in waits_all]):
        r = waits_all[k]
        g = t.by_idx.get(r.ic)
        if g is not None and g.stream != -1 and g.ic > 0:
            waits.append((r, g.stream))
    if not waits:
        raise CriticalPathError("no cudaStreamWaitEvent to follow")  # pd.concat of nothing
    comb: list[tuple[object, object, int, float, Ev]] = [
        (c.ev.pid, c.ev.tid, c.stream, float(k), c.ev) for k, c in enumerate(calls)
    ]
    comb.extend((r.pid, r.tid, s, _NO_LAUNCH, r) for r, s in waits)
    order = unstable_order([it[4].ts for it in comb])
    out: dict[int, int] = {}
    for pid, tid, stream in dict.fromkeys((r.pid, r.tid, s) for r, s in waits):
        nxt = _NO_LAUNCH
        for k in reversed(order):
            p, th, s, launch_id, ev = comb[k]
            if p != pid or th != tid or s != stream:
                continue
            if launch_id != _NO_LAUNCH:
                nxt = min(nxt, launch_id)
            else:
                out[ev.idx] = calls[int(nxt)].ev.idx if nxt != _NO_LAUNCH else -1
    return out


def _sort_key(key: tuple[object, object]) -> tuple[str, object, str, object]:
    a, b = key
    return (type(a).__name__, a, type(b).__name__, b)


def sync_tables(t: CpTrace) -> SyncTables:
    """The three tables of one rank's whole (filtered) trace."""
    calls = launches(t)
    return SyncTables(queue_lengths(t), record_prev_launch(t, calls), wait_next_launch(t, calls))
