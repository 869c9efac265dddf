"""rocprof v1/v2 (the roctracer-based ``rocprof`` and ``rocprofv2``): results.csv and results.json.

``results.csv`` (kernel dispatches, ``rocprof --stats`` / ``--timestamp on`` / counter runs), by
column name, in the two documented headers (ROCm/rocprofiler ``doc``, "File plugin"):

- version 1, the legacy ``rocprof`` header: ``Index, KernelName, gpu-id, queue-id, queue-index,
  pid, tid, grd, wgr, lds, scr, arch_vgpr, accum_vgpr, sgpr, wave_size, sig, obj, [counters...],
  DispatchNs, BeginNs, EndNs, CompleteNs`` (older releases: ``vgpr, sgpr, fbar``);
- version 2 (``rocprofv2`` file plugin): ``Dispatch_ID, GPU_ID, Queue_ID, PID, TID, Grid_Size,
  Workgroup_Size, LDS_Per_Workgroup, Scratch_Per_Workitem, Arch_VGPR, Accum_VGPR, SGPR,
  Wave_Size, Kernel_Name, Start_Timestamp, End_Timestamp, Correlation_ID, [counters...]``.

``grd``/``Grid_Size`` (work-items) and ``wgr``/``Workgroup_Size`` are totals, kept as the x extent.

``results.json`` (``rocprof --hip-trace`` / ``--sys-trace``): a Chrome trace whose numbers are
strings. ``process_name`` metadata names the lanes: ``COPY`` (memory copies), ``CPU HIP API``
(HIP calls), ``GPU<n>`` (kernels on GPU n). GPU events carry ``args.BeginNs``/``EndNs`` (ns),
``dev-id``, ``queue-id``, ``pid``, ``tid``, ``stream-id``. ``DataFlow`` flow events (``ph`` ``s``
then ``t``/``f``, same ``id``) link a HIP call (the flow starts inside it, on the HIP lane) to the
copy or kernel it launched (the flow ends at that event's ``ts``): they give the GPU event its
launch (``launch_start_ns``, ``launch_end_ns``, ``launch_name``) and ``correlation_id`` (the flow
id); a copy's size comes from its launching call's ``sizeBytes(...)``. ``otherData`` holds the
``rocminfo`` agent list: the n-th GPU agent names device ``n``. Times are CLOCK_BOOTTIME ns
(HSA system clock), converted with ``TraceContext.clock``; the largest raw end of the file is
``ParsedTrace.anchor_raw_ns`` (first chunk), for re-anchoring a trace recorded on another boot.

Bad values are counted in ``skipped`` and left out, never raised (``json_values``): a time that is
not a number (``bad_time``, ``missing_value`` when empty) or lands outside 1990..2100 once
converted (``time_out_of_range``), a time, pid, tid, device, queue, stream or correlation id beyond
int64 (``int_out_of_range``: the event is left out), a name longer than ``MAX_NAME_BYTES``
(``name_too_long``). Values an event can do without become null instead: grid and workgroup sizes
beyond int64 (CSV; counted ``int_out_of_range``), a copy size (JSON), a launch whose converted time
is out of range (not linked, ``time_out_of_range``), a HIP call name too long (the launch is kept
without its name, ``name_too_long``).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.context import MAX_NAME_BYTES, TraceContext
from aaco.agent.sources.traces.csv_rows import CsvRowReader
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.format import TraceFormat
from aaco.agent.sources.traces.json_values import (
    INT_OUT_OF_RANGE,
    TIME_OUT_OF_RANGE,
    IntOutOfRangeError,
    bool_mask,
    int_column,
    name_ok,
    name_reason,
    need_int,
    opt_int,
)
from aaco.agent.sources.traces.limits import TraceLimits, read_document
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.rocprofv3_csv import MAX_TIME_NS, parse_header
from aaco.agent.sources.traces.tables import chunks, stamp_kernels
from aaco.agent.sources.traces.whole import load_whole_json
from aaco.contract.clock import EPOCH_CEIL_NS, EPOCH_FLOOR_NS, in_epoch_range
from aaco.contract.schemas import KERNELS

FORMAT_CSV = "rocprof_v1_csv"
FORMAT_JSON = "rocprof_v1_json"

# canonical name -> header spellings (v1, v2)
_CSV_COLUMNS: dict[str, tuple[str, ...]] = {
    "name": ("KernelName", "Kernel_Name"),
    "start": ("BeginNs", "Start_Timestamp"),
    "end": ("EndNs", "End_Timestamp"),
    "device": ("gpu-id", "GPU_ID"),
    "queue": ("queue-id", "Queue_ID"),
    "pid": ("pid", "PID"),
    "tid": ("tid", "TID"),
    "grid": ("grd", "Grid_Size"),
    "block": ("wgr", "Workgroup_Size"),
    "corr": ("Correlation_ID",),
    "index": ("Index", "Dispatch_ID"),
}
_REQUIRED = ("name", "start", "end", "index")
_GPU_LANE = re.compile(r"^GPU\s*(\d+)$")
_SIZE_BYTES = re.compile(r"sizeBytes\((\d+)\)")


def _columns(names: list[str]) -> dict[str, str]:
    have = set(names)
    out = {}
    for key, spellings in _CSV_COLUMNS.items():
        for s in spellings:
            if s in have:
                out[key] = s
                break
    return out


def sniff_csv(head: bytes) -> str | None:
    """``rocprof_v1_csv`` if ``head`` starts with a results.csv header that has timestamps."""
    names = parse_header(head)
    if not names:
        return None
    cols = _columns(names)
    return FORMAT_CSV if all(k in cols for k in _REQUIRED) else None


# Why a results.csv row is left out, in the order the checks apply (a row counts once, for the first).
_CSV_REASONS = ("missing_value", "bad_time", "int_out_of_range", "bad_value", "name_too_long", "time_out_of_range")
_CSV_IDS = (("queue", "queue_id"), ("pid", "pid"), ("tid", "tid"), ("corr", "correlation_id"), ("device", "device"))
_CSV_SIZES = (("grid", "grid_x"), ("block", "workgroup_x"))


def parse_results_csv(data: bytes, ctx: TraceContext) -> Iterator[ParsedTrace]:
    """Kernels of a rocprof v1/v2 results.csv (whole content, header first).

    Numbers are read as text and converted here (``json_values.int_column``), so that one value
    beyond int64 is that row's ``int_out_of_range`` (or a null grid size), not a row pyarrow refuses.
    """
    names = parse_header(data)
    cols = _columns(names or [])
    if names is None or not all(k in cols for k in _REQUIRED):
        raise ValueError("not a rocprof results.csv with timestamps (expected KernelName, BeginNs, EndNs, ...)")
    header, _, body = data.partition(b"\n")
    types = {cols[k]: pa.string() for k in cols if k != "index"}
    chunk = CsvRowReader(names, types, header_line=header).read(body, len(header) + 1)
    t = chunk.table
    n = t.num_rows
    ints = {k: int_column(t[cols[k]]) for k in ("start", "end", *(k for k, _ in _CSV_IDS + _CSV_SIZES)) if k in cols}
    start, end = ints["start"][0], ints["end"][0]
    off = ctx.clock.offset_ns
    valid_time = ints["start"][1] & ints["end"][1]
    sane = valid_time & (start >= 0) & (end >= start) & (end <= MAX_TIME_NS)
    checks = (
        ~(ints["start"][1] | ints["start"][2] | ints["start"][3]) | ~(ints["end"][1] | ints["end"][2] | ints["end"][3]),
        ints["start"][3] | ints["end"][3] | (valid_time & ~sane),
        np.logical_or.reduce([ints[k][2] for k in ("start", "end", *(k for k, _ in _CSV_IDS)) if k in ints]),
        np.logical_or.reduce([ints[k][3] for k, _ in _CSV_IDS if k in ints] + [np.zeros(n, bool)]),
        bool_mask(pc.greater(pc.binary_length(t[cols["name"]]), MAX_NAME_BYTES)) if n else np.zeros(0, bool),
        ~(in_epoch_range(start + off) & in_epoch_range(end + off)) if abs(off) <= MAX_TIME_NS else np.ones(n, bool),
    )
    alive = np.arange(n)
    for reason, bad in zip(_CSV_REASONS, checks, strict=True):
        drop = bad[alive]
        chunk.reject(drop, reason)
        alive = alive[~drop]
    anchor = int(end[sane].max()) if sane.any() else None
    out: dict[str, Any] = {
        "start_ns": pa.array(start[alive] + off, pa.int64()),
        "end_ns": pa.array(end[alive] + off, pa.int64()),
        "name": chunk.table[cols["name"]],
    }
    for key, target in _CSV_IDS + _CSV_SIZES:
        if key in ints:
            values, valid, beyond, _ = (a[alive] for a in ints[key])
            if key in ("grid", "block") and beyond.any():
                chunk.skipped["int_out_of_range"] += int(beyond.sum())
            out[target] = pa.array(values, pa.int64(), mask=~valid)
    if "device" in out:
        out["device"] = pc.cast(out["device"], pa.string())
    pids = tuple(sorted({p for p in out["pid"].to_pylist() if p is not None})) if "pid" in out else ()
    table = stamp_kernels(out, int(alive.size), ctx, "kernel")
    parts = chunks(FORMAT_CSV, ctx, table, skipped=chunk.skipped, bad_rows=chunk.bad_rows, pids=pids)
    yield from _anchored(parts, anchor)


def _anchored(parts: Iterator[ParsedTrace], anchor: int | None) -> Iterator[ParsedTrace]:
    """The chunks, the first carrying ``anchor_raw_ns`` (the largest raw end of the file)."""
    for i, part in enumerate(parts):
        if i == 0:
            part.anchor_raw_ns = anchor
        yield part


# --- results.json --------------------------------------------------------------------------------


def _span_ns(ev: dict[str, Any], args: dict[str, Any]) -> tuple[int, int] | None:
    """Raw (begin, end) ns: ``args.BeginNs/EndNs`` when present, else ``ts``/``dur`` microseconds.

    None when not numbers or not a sane span; raises ``IntOutOfRangeError`` for a time beyond int64.
    """
    b, e = need_int(args.get("BeginNs")), need_int(args.get("EndNs"))
    if b is None or e is None:
        ts, dur = need_int(ev.get("ts")), need_int(ev.get("dur"))
        if ts is None or dur is None:
            return None
        b, e = ts * 1000, (ts + dur) * 1000
    if b < 0 or e < b or e > MAX_TIME_NS:
        return None
    return b, e


def _gpu_agents(other: Any) -> dict[str, dict[str, Any]]:
    """GPU ordinal -> names, from the rocminfo dump rocprof puts in ``otherData``."""
    if not isinstance(other, dict):
        return {}
    agents: dict[int, dict[str, Any]] = {}
    for key, value in other.items():
        m = re.match(r"^Agent(\d{1,6})\.(DeviceType|Name|MarketingName)$", str(key))
        if m:
            agents.setdefault(int(m.group(1)), {})[m.group(2)] = value
    gpus = [agents[k] for k in sorted(agents) if agents[k].get("DeviceType") == "GPU"]
    return {
        str(i): {"type": "GPU", "name": a.get("Name"), "product_name": a.get("MarketingName"), "label": f"GPU{i}"}
        for i, a in enumerate(gpus)
    }


def _lanes(events: list[Any], skipped: Counter[str]) -> dict[int, str]:
    """Lane (pid) -> its ``process_name`` (``COPY``, ``CPU HIP API``, ``GPU<n>``)."""
    lanes: dict[int, str] = {}
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "M" and ev.get("name") == "process_name":
            name = ev.get("args", {}).get("name") if isinstance(ev.get("args"), dict) else None
            try:
                pid = need_int(ev.get("pid"))
            except IntOutOfRangeError:
                skipped[INT_OUT_OF_RANGE] += 1
                continue
            if pid is not None and isinstance(name, str) and len(name) <= 256:
                lanes[pid] = name
    return lanes


@dataclass
class _Trace:
    """What one pass over a results.json keeps: GPU events, HIP calls by lane and thread, flow ends."""

    gpu: list[tuple[int, int, int, str, str, dict[str, Any], int, int]] = field(default_factory=list)
    calls: dict[tuple[int, int], list[tuple[int, int, str | None, str]]] = field(default_factory=dict)
    flow_start: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # id -> (lane, tid, ts_us)
    flow_end: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    anchor: int | None = None


def _read_events(events: list[Any], lanes: dict[int, str], skipped: Counter[str]) -> _Trace:
    api_lanes = {p for p, n in lanes.items() if "API" in n.upper()}
    out = _Trace()
    for ev in events:
        if not isinstance(ev, dict) or not ev:
            continue
        ph = ev.get("ph")
        if ph not in ("s", "t", "f", "X"):
            continue
        try:
            lane, tid, ts = need_int(ev.get("pid")), need_int(ev.get("tid")), need_int(ev.get("ts"))
            if ph != "X":
                fid = need_int(ev.get("id"))
                if fid is not None and lane is not None and ts is not None:
                    (out.flow_start if ph == "s" else out.flow_end)[fid] = (lane, tid if tid is not None else -1, ts)
                continue
            if lane is None:
                continue
            args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
            span = _span_ns(ev, args)
        except IntOutOfRangeError:
            skipped[INT_OUT_OF_RANGE] += 1
            continue
        name = ev.get("name")
        if not isinstance(name, str):
            skipped["bad_name"] += 1
            continue
        if span is None:
            skipped["bad_time"] += 1
            continue
        lane_name = lanes.get(lane, "")
        is_call = lane in api_lanes
        if not name_ok(name):
            skipped[name_reason(name)] += 1
            if not is_call:
                continue
            name = None  # a HIP call keeps its place as a launch, without its name
        out.anchor = span[1] if out.anchor is None else max(out.anchor, span[1])
        if is_call:
            out.calls.setdefault((lane, tid if tid is not None else -1), []).append(
                (span[0], span[1], name, str(args.get("args", ""))[:4096])
            )
        elif name is not None and (lane_name.upper() == "COPY" or _GPU_LANE.match(lane_name)):
            kind = "memcpy" if lane_name.upper() == "COPY" else "kernel"
            out.gpu.append((span[0], span[1], lane, kind, name, args, tid if tid is not None else -1, ts or 0))
    return out


def _launches(tr: _Trace) -> dict[tuple[int, int, int], tuple[int, tuple[int, int, str | None, str]]]:
    """(lane, tid, ts) of a flow's end -> (flow id, the HIP call the flow starts in)."""
    for lst in tr.calls.values():
        lst.sort(key=lambda c: (c[0], c[1]))
    starts = {k: [c[0] for c in v] for k, v in tr.calls.items()}
    launch_of: dict[tuple[int, int, int], tuple[int, tuple[int, int, str | None, str]]] = {}
    for fid, (lane, tid, ts) in tr.flow_start.items():
        key = (lane, tid)
        if key not in tr.calls or fid not in tr.flow_end:
            continue
        t_ns = ts * 1000
        i = bisect.bisect_right(starts[key], t_ns + 999) - 1  # ts is whole microseconds: allow its rounding
        if i >= 0 and tr.calls[key][i][1] + 999 >= t_ns:
            launch_of[tr.flow_end[fid]] = (fid, tr.calls[key][i])
    return launch_of


def _in_epoch(ns: int) -> bool:
    return EPOCH_FLOOR_NS <= ns < EPOCH_CEIL_NS


def parse_results_json(doc: Any, ctx: TraceContext) -> Iterator[ParsedTrace]:
    """Kernels and copies (with their HIP launches) of a loaded rocprof v1/v2 results.json."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError("a rocprof results.json is a JSON object with a traceEvents list")
    skipped: Counter[str] = Counter()
    events = doc["traceEvents"]
    lanes = _lanes(events, skipped)
    tr = _read_events(events, lanes, skipped)
    launch_of = _launches(tr)
    off = ctx.clock.offset_ns
    tr.gpu.sort(key=lambda g: g[0])
    rows: dict[str, list[Any]] = {k: [] for k in _JSON_COLUMNS}
    for gpu in tr.gpu:
        row = _gpu_row(gpu, lanes, launch_of, off, skipped)
        if row is not None:
            for key, value in zip(_JSON_COLUMNS, row, strict=True):
                rows[key].append(value)
    cols = {k: pa.array(v, KERNELS.field(k).type) for k, v in rows.items() if k != "kind"}
    table = stamp_kernels(cols, len(rows["start_ns"]), ctx, pa.array(rows["kind"], pa.string()))
    devices = _gpu_agents(doc.get("otherData"))
    used = {d for d in rows["device"] if d is not None}
    parts = chunks(
        FORMAT_JSON,
        ctx,
        table,
        skipped=skipped,
        pids=tuple(sorted({p for p in rows["pid"] if p is not None})),
        devices={d: v for d, v in devices.items() if d in used},
    )
    yield from _anchored(parts, tr.anchor)


def _gpu_row(
    gpu: tuple[Any, ...], lanes: dict[int, str], launch_of: dict[Any, Any], off: int, skipped: Counter[str]
) -> tuple[Any, ...] | None:
    """One GPU event as a row of ``_JSON_COLUMNS`` in epoch ns, with its launch; None when left out (counted)."""
    b, e, lane, kind, name, args, tid, ts = gpu
    try:
        pid, gtid = need_int(args.get("pid")), need_int(args.get("tid"))
        dev, stream = need_int(args.get("dev-id")), need_int(args.get("stream-id"))
        queue = need_int(args.get("queue-id"))
    except IntOutOfRangeError:
        skipped[INT_OUT_OF_RANGE] += 1
        return None
    if not (_in_epoch(b + off) and _in_epoch(e + off)):
        skipped[TIME_OUT_OF_RANGE] += 1
        return None
    link = launch_of.get((lane, tid, ts))
    if link and not (_in_epoch(link[1][0] + off) and _in_epoch(link[1][1] + off)):
        skipped[TIME_OUT_OF_RANGE] += 1
        link = None
    if dev is None and (m := _GPU_LANE.match(lanes.get(lane, ""))):
        dev = int(m.group(1))
    size = _SIZE_BYTES.search(link[1][3]) if link and kind == "memcpy" else None
    launch = (link[0], link[1][0] + off, link[1][1] + off, link[1][2]) if link else (None,) * 4
    device = str(dev) if dev is not None else None
    correlation, launch_start, launch_end, launch_name = launch
    size_bytes = opt_int(size.group(1), skipped) if size else None
    return (
        b + off,
        e + off,
        pid,
        gtid,
        device,
        stream,
        name,
        kind,
        correlation,
        queue,
        launch_start,
        launch_end,
        launch_name,
        size_bytes,
    )


_JSON_COLUMNS = (
    "start_ns",
    "end_ns",
    "pid",
    "tid",
    "device",
    "stream",
    "name",
    "kind",
    "correlation_id",
    "queue_id",
    "launch_start_ns",
    "launch_end_ns",
    "launch_name",
    "bytes",
)


def sniff_json(head: bytes) -> str | None:
    """``rocprof_v1_json`` for a results.json: a Chrome trace with ``BeginNs`` arguments."""
    if not head.lstrip().startswith(b"{") or b'"rocprofiler-sdk-tool"' in head:
        return None
    return FORMAT_JSON if b'"BeginNs"' in head and b'"traceEvents"' in head else None


def parse_json_file(tf: TraceFile, ctx: TraceContext, limits: TraceLimits) -> Iterator[ParsedTrace]:
    """A results.json, read whole; a damaged document keeps its good events (counted on the first chunk)."""
    loaded = load_whole_json(tf, limits)
    for i, part in enumerate(parse_results_json(loaded.doc, ctx)):
        if i == 0:
            part.skipped.update(loaded.skipped)
            part.bad_rows.extend(loaded.bad_rows)
        yield part


def parse_csv_file(tf: TraceFile, ctx: TraceContext, limits: TraceLimits) -> Iterator[ParsedTrace]:
    """A results.csv, read whole; a damaged gzip keeps the rows before the damage (``damaged_gzip``)."""
    doc = read_document(tf.path, limits)
    for i, part in enumerate(parse_results_csv(bytes(doc.data), ctx)):
        if i == 0 and doc.damage is not None:
            part.skipped["damaged_gzip"] += 1
        yield part


CSV_FORMAT = TraceFormat((FORMAT_CSV,), sniff_csv, parse_csv_file, boottime=True)
JSON_FORMAT = TraceFormat((FORMAT_JSON,), sniff_json, parse_json_file, boottime=True)
