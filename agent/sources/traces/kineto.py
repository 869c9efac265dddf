"""Kineto (PyTorch profiler) Chrome-trace JSON, from CUDA (CUPTI) and ROCm (roctracer) builds alike.

Categories are read without case, in both of Kineto's schemas (``kineto_categories``: PyTorch 1.8
to 1.10 wrote ``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``, ``Operator``); events of other
categories that look like GPU work are counted on ``ParsedTrace.unrecognised``.

- GPU work: ``cat`` ``kernel``, ``gpu_memcpy``, ``gpu_memset`` (complete events, ``ph: X``). Their
  ``pid`` is the device and ``tid`` the stream (``"stream 7"`` in the old schema); ``args.device`` /
  ``args.stream`` say it outright when present.
- Launches: ``cuda_runtime`` / ``cuda_driver`` events (HIP calls on ROCm builds) with the same
  ``args.correlation``: they give the kernel its host pid and tid and its launch interval. GPU work
  with no launch in the file belongs to the trace's host process (``kineto_process``): Kineto
  writes one trace per process.
- Operators: ``cpu_op`` events share ``args["External id"]`` with the GPU work (``external id`` on
  it in the old schema); the op's name becomes the kernel's ``op_name``.
- Iterations: ``user_annotation`` events named ``ProfilerStep#N`` (operators in the old schema).
- The model: the host process's name when it names more than an interpreter (``kineto_process``),
  on ``ParsedTrace.model``; the devices that ran work, as ``deviceProperties`` (``computeProperties``
  in May 2021) describes them, on ``ParsedTrace.devices`` (``kineto_meta``).
- Time: ``ts``/``dur`` are microseconds (floats on ROCm builds and in nanosecond-resolution traces;
  ``displayTimeUnit`` is only a display hint of the Chrome trace format and changes no unit). With
  ``baseTimeNanoseconds``, ``ts`` counts from it (Kineto writes ``(t - baseTime) / 1000``) and epoch
  ns = base + ts * 1000. Without it, older Kineto wrote epoch microseconds, recognised by magnitude
  (the median event end after 2001); anything smaller is anchored so the trace ends at the file's
  modification time. A base that does not fit int64 or puts the median event outside 1990..2100 is
  not used (counted ``int_out_of_range`` / ``time_out_of_range``) and the next rule applies. The
  method used is recorded with the events. ``end - start`` is the duration as the trace states it;
  the start is as exact as the loaded double allows (within 125 ns for epoch microseconds with a
  nanosecond fraction, exact with a base or integer microseconds).

Files are read in bounded memory (``kineto_stream``): each window of events is read by Arrow
straight into columns (``kineto_arrow``) or, when it holds a value these rules count, drop or
convert, arrives as a batch of dicts folded into the same columns (``kineto_events.collect``: a
role's events a column at a time, ``kineto_columns``, or event by event, ``_add_gpu`` ...; the
rules are stated there once). The keys outside ``traceEvents`` (base time, devices) are read when
the file ends, wherever they stand, and the tables are built from the columns (``_convert``), as
``parse_kineto`` does for a loaded document.

Bad input is counted in ``skipped`` and left out, never raised (``json_values``): an event whose
time is not a finite number (``bad_time``) or lands outside 1990..2100 (``time_out_of_range``), an
id, pid, tid, device, stream or correlation beyond int64 (``int_out_of_range``), a kernel name that
is not a string (``bad_name``) or longer than ``MAX_NAME_BYTES`` (``name_too_long``). Auxiliary
values go alone: an op link, bytes or grid beyond int64 becomes null (``int_out_of_range``), an
operator or launch name too long is dropped (``name_too_long``: the kernel keeps no ``op_name`` /
``launch_name``), a launch whose time is out of range is not linked (``time_out_of_range``).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.agent.sources.traces import kineto_arrow, kineto_columns
from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.format import TraceFormat
from aaco.agent.sources.traces.json_values import (
    TIME_OUT_OF_RANGE,
    span_ns,
)
from aaco.agent.sources.traces.kineto_columns import STR
from aaco.agent.sources.traces.kineto_comms import collective_columns, dist_info, with_seq
from aaco.agent.sources.traces.kineto_critical import EventKeeper, with_critical_paths
from aaco.agent.sources.traces.kineto_events import INT_COLS, STEP_PREFIX, Events, collect
from aaco.agent.sources.traces.kineto_meta import kineto_clock, kineto_devices
from aaco.agent.sources.traces.kineto_stream import NOT_KINETO, EventStream, gc_paused
from aaco.agent.sources.traces.launches import LaunchTable
from aaco.agent.sources.traces.limits import TraceLimits
from aaco.agent.sources.traces.parsed import ParsedTrace, profiled_span
from aaco.agent.sources.traces.tables import const, typed_table
from aaco.agent.sources.traces.whole import rechunk
from aaco.contract.clock import ClockOffset
from aaco.contract.ids import span_id, trace_id
from aaco.contract.schemas import ITERATIONS, KERNELS

FORMAT = "kineto"
__all__ = ["FORMAT", "TRACE_FORMAT", "kineto_clock", "kineto_devices", "parse_file", "parse_kineto", "sniff"]


def _kernels(
    ev: Events, clock: ClockOffset, host: int | None, ctx: dict[str, str], skipped: Counter[str], groups: dict
) -> pa.Table:
    """The kernels table: GPU work in epoch ns with its launch, op name, host pid and collective, in start order."""
    gpu = {k: ev.gpu.column(k) for k in ev.gpu.types}
    n = len(gpu["ts"])
    start, end, ok = span_ns(kineto_columns.floats(gpu["ts"]), kineto_columns.floats(gpu["dur"]), clock.offset_ns)
    skipped[TIME_OUT_OF_RANGE] += int((~ok).sum())
    lt = kineto_columns.launch_table(ev.launch, clock.offset_ns, skipped) if n else LaunchTable.empty()
    hit, pos = lt.lookup(gpu["correlation_id"].fill_null(0).to_numpy())
    hit &= gpu["correlation_id"].is_valid().to_numpy(zero_copy_only=False)
    if len(lt):
        launch_pid, launch_tid = np.where(hit, lt.pid[pos], -1), np.where(hit, lt.tid[pos], -1)
        launch_start, launch_end = np.where(hit, lt.start[pos], 0), np.where(hit, lt.end[pos], 0)
        name_idx = np.where(hit, lt.name_idx[pos], len(lt.names) - 1)
    else:
        launch_pid = launch_tid = np.full(n, -1, np.int64)
        launch_start = launch_end = np.zeros(n, np.int64)
        name_idx = np.zeros(n, np.int32)
    names = pa.array(lt.names or [""], pa.string())
    pid = np.where(launch_pid >= 0, launch_pid, -1 if host is None else host)
    table = typed_table(
        KERNELS,
        {
            "start_ns": start,
            "end_ns": end,
            "pid": pa.array(pid, pa.int64(), mask=pid < 0),
            "tid": pa.array(launch_tid, pa.int64(), mask=launch_tid < 0),
            "device": gpu["device"].cast(STR),
            "stream": gpu["stream"],
            "name": gpu["name"],
            "kind": gpu["kind"],
            **{k: gpu[k] for k in INT_COLS},
            "launch_start_ns": pa.array(launch_start, pa.int64(), mask=~hit),
            "launch_end_ns": pa.array(launch_end, pa.int64(), mask=~hit),
            "launch_name": names.take(pa.array(name_idx, pa.int32(), mask=name_idx == len(names) - 1)),
            "op_name": kineto_columns.op_name(gpu["ext"], ev.ops),
            **{k: const(ctx[k], n) for k in ("node", "source", "run_id")},
            **collective_columns(gpu["name"], gpu["correlation_id"], gpu["ext"], ev.comms, groups),
        },
    )
    if ok.all() and not (np.diff(start) < 0).any():  # in start order already: no copy
        return with_seq(table)
    keep = np.flatnonzero(ok)
    return with_seq(table.take(pa.array(keep[np.argsort(start[keep], kind="stable")])))


def _iterations(
    ev: Events, clock: ClockOffset, host: int | None, ctx: dict[str, str], skipped: Counter[str]
) -> pa.Table:
    """ProfilerStep#N ranges as iterations, in start order; out-of-range ones counted and left out."""
    steps = sorted(set(ev.steps))  # a step written both as an operator and as an annotation is one
    start, end, ok = span_ns(np.array([s[1] for s in steps]), np.array([s[2] for s in steps]), clock.offset_ns)
    skipped[TIME_OUT_OF_RANGE] += int((~ok).sum())
    kept = [(s, a, b) for s, a, b, good in zip(steps, start, end, ok, strict=True) if good]
    m = len(kept)
    labels = [f"{STEP_PREFIX}{s[0]}" for s, _, _ in kept]
    node, identity = ctx["node"], ctx["identity"]
    return typed_table(
        ITERATIONS,
        {
            "start_ns": [a for _, a, _ in kept],
            "end_ns": [b for _, _, b in kept],
            "pid": [s[3] if s[3] is not None else host for s, _, _ in kept],
            "tid": [s[4] for s, _, _ in kept],
            "iteration": [s[0] for s, _, _ in kept],
            "name": labels,
            "trace_id": [trace_id(node, identity, label) for label in labels],
            "span_id": [span_id(node, identity, label) for label in labels],
            **{k: const(ctx[k], m) for k in ("node", "model", "run_id", "source")},
        },
    )


def parse_kineto(
    doc: Any,
    *,
    node: str,
    identity: str,
    run_id: str,
    model: str,
    file_mtime_ns: int,
    source: str = "kineto",
) -> ParsedTrace:
    """Turn a loaded Kineto trace into kernels (with launches) and ProfilerStep iterations (see the module doc).

    ``ParsedTrace.model`` is the model the trace's process name gives, or None; ``model`` names the
    iterations (the caller's choice, which may come from it).
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError(NOT_KINETO)
    skipped: Counter[str] = Counter()
    ev = Events()
    collect(doc["traceEvents"], skipped, ev)
    ctx = {"node": node, "identity": identity, "run_id": run_id, "model": model, "source": source}
    return _convert(ev, doc, file_mtime_ns, ctx, skipped)


def _convert(
    ev: Events, keys: dict[str, Any], file_mtime_ns: int, ctx: dict[str, str], skipped: Counter[str]
) -> ParsedTrace:
    """The collected events as tables; ``keys``: the document's keys besides the events (clock, devices)."""
    clock = kineto_clock(
        keys, np.concatenate([np.array(ev.ends, dtype=np.float64), *ev.end_chunks]), file_mtime_ns, skipped
    )
    host = ev.procs.host_pid(ev.launch_pids | ev.op_pids, ev.gpu_lanes)
    job, groups = dist_info(keys)
    kernels = _kernels(ev, clock, host, ctx, skipped, groups)
    iterations = _iterations(ev, clock, host, ctx, skipped)
    pids = tuple(sorted(ev.launch_pids | ({host} if host is not None else set())))
    devices = kineto_devices(keys, set(kernels.column("device").drop_null().unique().to_pylist()))
    parsed = ParsedTrace(FORMAT, kernels, iterations, clock, +skipped, pids, devices=devices)
    parsed.model = ev.procs.model_name(host, parsed.skipped)
    parsed.job, parsed.span_ns = job, profiled_span(iterations, kernels)
    cpu = ev.launch_pids | ev.op_pids | ev.procs.cpu_pids()
    parsed.unrecognised = ev.unknown.gpu_looking(ev.gpu_lanes | ev.procs.gpu_pids(), cpu)
    return parsed


# Kineto writes schemaVersion/deviceProperties/baseTimeNanoseconds, or at least its own categories.
_KEYS = (b'"schemaVersion"', b'"deviceProperties"', b'"baseTimeNanoseconds"', b'"distributedInfo"')
_CATS = re.compile(
    rb'"cat"\s*:\s*"(cpu_op|cuda_runtime|kernel|gpu_memcpy|gpu_memset|user_annotation|python_function|'
    rb'operator|runtime|memcpy|memset)"',
    re.IGNORECASE,
)


def sniff(head: bytes) -> str | None:
    """``kineto`` for a JSON object with Kineto's keys or categories (not a rocprof results.json)."""
    if not head.lstrip().startswith(b"{") or b'"BeginNs"' in head or b'"rocprofiler-sdk-tool"' in head:
        return None
    if any(k in head for k in _KEYS) or (b'"traceEvents"' in head and _CATS.search(head)):
        return FORMAT
    return None


def parse_file(tf: TraceFile, ctx: TraceContext, limits: TraceLimits) -> Iterator[ParsedTrace]:
    """A Kineto trace file, streamed in bounded memory (``kineto_stream``); it anchors its own clock."""
    stream = EventStream(tf.path, limits)
    skipped: Counter[str] = Counter()
    ev = Events()
    kept = EventKeeper(limits)
    stream.columns = partial(_fold_window, kineto_arrow.WindowReader(), skipped, ev, kept)
    with gc_paused():
        for batch in stream.batches():
            collect(batch, skipped, ev)
            kept.keep(batch)
    stream.columns = None
    keys = {"node": ctx.node, "identity": ctx.identity, "run_id": ctx.run_id, "model": ctx.model, "source": ctx.source}
    parsed = _convert(ev, stream.rest, tf.mtime_ns, keys, skipped)
    distributed = parsed.job is not None and parsed.job.world_size is not None
    parsed.iterations = with_critical_paths(parsed.iterations, kept, limits, distributed)
    del kept
    yield from rechunk(parsed, ctx, stream.loaded())


def _fold_window(
    reader: kineto_arrow.WindowReader, skipped: Counter[str], ev: Events, kept: EventKeeper, raw: memoryview
) -> int | None:
    """``EventStream.columns``: a window folded by ``kineto_arrow`` (and kept for the critical path), or None."""
    n = reader.fold_window(raw, skipped, ev)
    if n is not None:
        kept.keep(raw, n)
    return n


TRACE_FORMAT = TraceFormat((FORMAT,), sniff, parse_file)
