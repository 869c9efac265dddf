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
(HSA system clock), converted with ``TraceContext.clock``.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .csv_rows import CsvRowReader
from .parsed import ParsedTrace
from .rocprofv3_csv import MAX_TIME_NS, parse_header
from .trace_common import MAX_NAME_BYTES, TraceContext, chunks, empty_kernels, stamp_kernels

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


def parse_results_csv(data: bytes, ctx: TraceContext) -> Iterator[ParsedTrace]:
    """Kernels of a rocprof v1/v2 results.csv (whole content, header first)."""
    names = parse_header(data)
    cols = _columns(names or [])
    if names is None or not all(k in cols for k in _REQUIRED):
        raise ValueError("not a rocprof results.csv with timestamps (expected KernelName, BeginNs, EndNs, ...)")
    header, _, body = data.partition(b"\n")
    types = {cols[k]: (pa.string() if k == "name" else pa.int64()) for k in cols if k != "index"}
    chunk = CsvRowReader(names, types, header_line=header).read(body, len(header) + 1)
    t = chunk.table
    if t.num_rows:
        s, e = t[cols["start"]], t[cols["end"]]
        chunk.reject(pc.or_(pc.is_null(s), pc.is_null(e)), "missing_value")
        t = chunk.table
        s, e = t[cols["start"]], t[cols["end"]]
        chunk.reject(pc.or_(pc.or_(pc.less(s, 0), pc.less(e, s)), pc.greater(e, MAX_TIME_NS)), "bad_time")
        chunk.reject(pc.greater(pc.binary_length(chunk.table[cols["name"]]), MAX_NAME_BYTES), "name_too_long")
        t = chunk.table
    n = t.num_rows
    if not n:
        yield from chunks(FORMAT_CSV, ctx, empty_kernels(ctx), skipped=chunk.skipped, bad_rows=chunk.bad_rows)
        return
    off = ctx.clock.offset_ns
    out: dict[str, Any] = {
        "start_ns": pc.add(t[cols["start"]], off),
        "end_ns": pc.add(t[cols["end"]], off),
        "name": t[cols["name"]],
    }
    if "device" in cols:
        out["device"] = pc.cast(t[cols["device"]], pa.string())
    for key, target in (("queue", "queue_id"), ("pid", "pid"), ("tid", "tid"), ("corr", "correlation_id")):
        if key in cols:
            out[target] = t[cols[key]]
    if "grid" in cols:
        out["grid_x"] = t[cols["grid"]]
    if "block" in cols:
        out["workgroup_x"] = t[cols["block"]]
    pids = tuple(sorted({p for p in out["pid"].to_pylist() if p is not None})) if "pid" in out else ()
    table = stamp_kernels(out, n, ctx, "kernel")
    yield from chunks(FORMAT_CSV, ctx, table, skipped=chunk.skipped, bad_rows=chunk.bad_rows, pids=pids)


# --- results.json --------------------------------------------------------------------------------


def _int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if math.isfinite(v) else None
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            try:
                f = float(v)
            except ValueError:
                return None
            return int(f) if math.isfinite(f) else None
    return None


def _span_ns(ev: dict[str, Any], args: dict[str, Any]) -> tuple[int, int] | None:
    """(begin, end) in ns: ``args.BeginNs/EndNs`` when present, else ``ts``/``dur`` microseconds."""
    b, e = _int(args.get("BeginNs")), _int(args.get("EndNs"))
    if b is None or e is None:
        ts, dur = _int(ev.get("ts")), _int(ev.get("dur"))
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
        m = re.match(r"^Agent(\d+)\.(DeviceType|Name|MarketingName)$", str(key))
        if m:
            agents.setdefault(int(m.group(1)), {})[m.group(2)] = value
    gpus = [agents[k] for k in sorted(agents) if agents[k].get("DeviceType") == "GPU"]
    return {
        str(i): {"type": "GPU", "name": a.get("Name"), "product_name": a.get("MarketingName"), "label": f"GPU{i}"}
        for i, a in enumerate(gpus)
    }


def parse_results_json(doc: Any, ctx: TraceContext) -> Iterator[ParsedTrace]:
    """Kernels and copies (with their HIP launches) of a loaded rocprof v1/v2 results.json."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise ValueError("a rocprof results.json is a JSON object with a traceEvents list")
    skipped: Counter[str] = Counter()
    lanes: dict[int, str] = {}
    events = doc["traceEvents"]
    for ev in events:
        if isinstance(ev, dict) and ev.get("ph") == "M" and ev.get("name") == "process_name":
            pid = _int(ev.get("pid"))
            name = ev.get("args", {}).get("name") if isinstance(ev.get("args"), dict) else None
            if pid is not None and isinstance(name, str):
                lanes[pid] = name
    api_lanes = {p for p, n in lanes.items() if "API" in n.upper()}
    gpu: list[tuple[int, int, int, str, str, dict[str, Any], int, int]] = []  # b, e, lane, kind, name, args, tid, ts
    calls: dict[tuple[int, int], list[tuple[int, int, str, str]]] = {}  # (lane, tid) -> (b, e, name, args)
    flow_start: dict[int, tuple[int, int, int]] = {}  # id -> (lane, tid, ts_us)
    flow_end: dict[int, tuple[int, int, int]] = {}
    for ev in events:
        if not isinstance(ev, dict) or not ev:
            continue
        ph = ev.get("ph")
        lane, tid = _int(ev.get("pid")), _int(ev.get("tid"))
        if ph in ("s", "t", "f"):
            fid, ts = _int(ev.get("id")), _int(ev.get("ts"))
            if fid is not None and lane is not None and ts is not None:
                (flow_start if ph == "s" else flow_end)[fid] = (lane, tid if tid is not None else -1, ts)
            continue
        if ph != "X" or lane is None:
            continue
        args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
        name = ev.get("name")
        if not isinstance(name, str) or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
            skipped["bad_name"] += 1
            continue
        span = _span_ns(ev, args)
        if span is None:
            skipped["bad_time"] += 1
            continue
        lane_name = lanes.get(lane, "")
        if lane in api_lanes:
            calls.setdefault((lane, tid if tid is not None else -1), []).append(
                (span[0], span[1], name, str(args.get("args", "")))
            )
        elif lane_name.upper() == "COPY" or _GPU_LANE.match(lane_name):
            kind = "memcpy" if lane_name.upper() == "COPY" else "kernel"
            ts = _int(ev.get("ts"))
            gpu.append((span[0], span[1], lane, kind, name, args, tid if tid is not None else -1, ts or 0))
    for lst in calls.values():
        lst.sort()
    starts = {k: [c[0] for c in v] for k, v in calls.items()}
    # flow id -> the HIP call it starts in
    launch_of: dict[tuple[int, int, int], tuple[int, tuple[int, int, str, str]]] = {}
    for fid, (lane, tid, ts) in flow_start.items():
        key = (lane, tid)
        if key not in calls or fid not in flow_end:
            continue
        t_ns = ts * 1000
        i = bisect.bisect_right(starts[key], t_ns + 999) - 1  # ts is whole microseconds: allow its rounding
        if i >= 0 and calls[key][i][1] + 999 >= t_ns:
            launch_of[flow_end[fid]] = (fid, calls[key][i])
    off = ctx.clock.offset_ns
    gpu.sort(key=lambda g: g[0])
    rows: dict[str, list[Any]] = {
        k: []
        for k in (
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
    }
    pids: set[int] = set()
    for b, e, lane, kind, name, args, tid, ts in gpu:
        link = launch_of.get((lane, tid, ts))
        pid = _int(args.get("pid"))
        if pid is not None:
            pids.add(pid)
        dev = _int(args.get("dev-id"))
        if dev is None and (m := _GPU_LANE.match(lanes.get(lane, ""))):
            dev = int(m.group(1))
        rows["start_ns"].append(b + off)
        rows["end_ns"].append(e + off)
        rows["pid"].append(pid)
        rows["tid"].append(_int(args.get("tid")))
        rows["device"].append(str(dev) if dev is not None else None)
        rows["stream"].append(_int(args.get("stream-id")))
        rows["name"].append(name)
        rows["kind"].append(kind)
        rows["queue_id"].append(_int(args.get("queue-id")))
        rows["correlation_id"].append(link[0] if link else None)
        rows["launch_start_ns"].append(link[1][0] + off if link else None)
        rows["launch_end_ns"].append(link[1][1] + off if link else None)
        rows["launch_name"].append(link[1][2] if link else None)
        size = _SIZE_BYTES.search(link[1][3]) if link and kind == "memcpy" else None
        rows["bytes"].append(int(size.group(1)) if size else None)
    n = len(rows["start_ns"])
    strings = ("device", "name", "launch_name")
    cols = {k: pa.array(v, pa.string() if k in strings else pa.int64()) for k, v in rows.items() if k != "kind"}
    table = stamp_kernels(cols, n, ctx, pa.array(rows["kind"], pa.string())) if n else empty_kernels(ctx)
    devices = _gpu_agents(doc.get("otherData"))
    used = {d for d in rows["device"] if d is not None}
    yield from chunks(
        FORMAT_JSON,
        ctx,
        table,
        skipped=skipped,
        pids=tuple(sorted(pids)),
        devices={d: v for d, v in devices.items() if d in used},
    )
