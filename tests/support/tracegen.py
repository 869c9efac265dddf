"""Generators of large traces built from the real samples (for tests and benchmarks; nothing is checked in).

``rocprofv3_csv`` repeats the dispatches of ``samples/rocprofv3/kernel_trace.csv`` with shifted
timestamps and fresh dispatch/correlation IDs; ``kineto`` builds a PyTorch-profiler trace of
ProfilerSteps whose kernels (with their cudaLaunchKernel calls) copy names from the A100 sample;
``rocprofv3_json`` writes a rocprofv3 ``--output-format json`` file (the layout of
``aaco.agent.sources.traces.rocprofv3_json``) of dispatches with their HIP launches and memory copies,
every id, handle and hive id at or above 2**63 on request.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import random
import time
from pathlib import Path
from typing import IO, Any

HEADER_22 = (
    "Kind,Agent_Id,Queue_Id,Stream_Id,Thread_Id,Dispatch_Id,Kernel_Id,Kernel_Name,Correlation_Id,"
    "Start_Timestamp,End_Timestamp,LDS_Block_Size,Scratch_Size,VGPR_Count,Accum_VGPR_Count,SGPR_Count,"
    "Workgroup_Size_X,Workgroup_Size_Y,Workgroup_Size_Z,Grid_Size_X,Grid_Size_Y,Grid_Size_Z"
)


def sample_rows(samples: Path) -> tuple[str, list[list[str]]]:
    """The header line and rows of the real rocprofv3 sample."""
    text = (samples / "rocprofv3" / "kernel_trace.csv").read_text()
    rows = list(csv.reader(io.StringIO(text)))
    header = text.splitlines()[0]
    return header, rows[1:]


def rocprofv3_lines(samples: Path, n: int, start_index: int = 0) -> list[tuple[str, int]]:
    """``n`` (data line, duration ns) pairs: rows ``start_index`` .. of the endless repetition of the sample."""
    _, rows = sample_rows(samples)
    base = min(int(r[9]) for r in rows)
    span = max(int(r[10]) for r in rows) - base + 1000
    out = []
    for i in range(start_index, start_index + n):
        r = list(rows[i % len(rows)])
        shift = (i // len(rows)) * span
        r[5] = str(i + 1)  # Dispatch_Id
        r[8] = str(i + 1)  # Correlation_Id
        r[9] = str(int(r[9]) + shift)
        r[10] = str(int(r[10]) + shift)
        line = ",".join(f'"{v}"' if j in (0, 1, 7) else v for j, v in enumerate(r)) + "\n"
        out.append((line, int(r[10]) - int(r[9])))
    return out


def rocprofv3_varied_csv(samples: Path, path: Path, n: int, first: int, seed: int) -> None:
    """An ``n``-row kernel trace of the sample's kernels at random gaps and durations (Parquet cannot fold it
    away as it does the plain repetition), dispatch and correlation ids from ``first`` + 1."""
    header, rows = sample_rows(samples)
    rng = random.Random(seed)
    t = min(int(r[9]) for r in rows) + first * 100_000
    with path.open("w") as fh:
        fh.write(header + "\n")
        for i in range(first, first + n):
            r = list(rows[i % len(rows)])
            t += rng.randrange(1000, 50_000)
            r[5] = r[8] = str(i + 1)
            r[9], r[10] = str(t), str(t + rng.randrange(500, 40_000))
            fh.write(",".join(f'"{v}"' if j in (0, 1, 7) else v for j, v in enumerate(r)) + "\n")


def rocprofv3_csv(samples: Path, path: Path, n: int) -> tuple[int, int]:
    """Write an ``n``-row kernel trace; returns (rows, summed duration ns)."""
    header, _ = sample_rows(samples)
    with path.open("w") as fh:
        fh.write(header + "\n")
        total = 0
        for start in range(0, n, 100_000):
            pairs = rocprofv3_lines(samples, min(100_000, n - start), start)
            fh.write("".join(line for line, _ in pairs))
            total += sum(d for _, d in pairs)
    return n, total


def kineto(samples: Path, path: Path, kernels: int, per_step: int = 1000, gap_us: int = 20) -> tuple[int, int]:
    """A Kineto trace of ``kernels`` kernels, one every ``gap_us``, in ProfilerSteps; returns (kernels, summed ns)."""
    names = [
        e["name"]
        for e in json.loads(gzip.decompress((samples / "kineto" / "a100_alexnet_trace.json.gz").read_bytes()))[
            "traceEvents"
        ]
        if e.get("cat") == "kernel"
    ]
    events: list[dict] = []
    t0, pid, tid = 1_700_000_000_000_000, 4242, 4242
    total = 0
    for k in range(kernels):
        step, j = divmod(k, per_step)
        ts = t0 + step * (per_step * gap_us + 100) + j * gap_us
        if j == 0:
            events.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{step}",
                    "pid": pid,
                    "tid": tid,
                    "ts": ts - 1,
                    "dur": per_step * gap_us + 50,
                    "args": {"External id": step},
                }
            )
        events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": pid,
                "tid": tid,
                "ts": ts,
                "dur": 3,
                "args": {"correlation": k + 1, "External id": k + 1},
            }
        )
        dur = 5 + (k % 7)
        total += dur * 1000
        events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": names[k % len(names)],
                "pid": 0,
                "tid": 7,
                "ts": ts + 5,
                "dur": dur,
                "args": {"correlation": k + 1, "device": 0, "stream": 7, "grid": [128, 1, 1], "block": [256, 1, 1]},
            }
        )
    path.write_bytes(json.dumps({"schemaVersion": 1, "traceEvents": events}).encode())
    return kernels, total


U63 = 1 << 63
# rocprofiler_buffer_tracing_kind_t names, indexed by the records' integer "kind" (order is the file's own)
JSON_KINDS = [
    {"kind": "NONE", "operations": []},
    {"kind": "HIP_RUNTIME_API", "operations": ["hipNone", "hipLaunchKernel", "hipMemcpyAsync"]},
    {"kind": "MARKER_CORE_API", "operations": ["roctxMarkA", "roctxRangePushA", "roctxRangePop"]},
    {"kind": "KERNEL_DISPATCH", "operations": ["KERNEL_DISPATCH_NONE", "KERNEL_DISPATCH_COMPLETE"]},
    {
        "kind": "MEMORY_COPY",
        "operations": [
            "MEMORY_COPY_NONE",
            "MEMORY_COPY_HOST_TO_HOST",
            "MEMORY_COPY_HOST_TO_DEVICE",
            "MEMORY_COPY_DEVICE_TO_HOST",
            "MEMORY_COPY_DEVICE_TO_DEVICE",
        ],
    },
]
_HIP, _MARKER, _DISPATCH, _COPY = 1, 2, 3, 4


def _ids(big: bool) -> dict[str, int]:
    """Bases of every id space: at or above 2**63 (``big``), or small as on a quiet machine."""
    if not big:
        return {"agent": 9001, "queue": 77, "stream": 1, "corr": 0, "kernel": 0, "code": 0, "tid": 555, "hive": 0}
    return {
        "agent": (1 << 64) - 4096,  # handles near the top of the range, like pointers of a high mapping
        "queue": U63 + 0x7F00_0000_1000,
        "stream": U63 + 3,
        "corr": U63 + 1_000_000,
        "kernel": U63 + 17,
        "code": U63 + 5,
        "tid": U63 + 555,
        "hive": 17332996360099338395 - 8,  # the hive id of the MI350X capture, give or take
    }


def rocprofv3_json(
    path: Path,
    dispatches: int,
    copies: int = 0,
    *,
    big_ids: bool = False,
    seed: int = 1,
    kernels: int = 23,
    odd_values: bool = False,
    indent: bool = True,
) -> dict[str, Any]:
    """Write a rocprofv3 JSON of ``dispatches`` kernel dispatches (each with its hipLaunchKernel) and
    ``copies`` memory copies (each with its hipMemcpyAsync), on two GPUs, streamed record by record.

    Times are raw CLOCK_BOOTTIME ns just before this machine's own BOOTTIME now (so they convert to
    about now with any clock anchoring). ``big_ids``: every id, handle and hive id is at or above
    2**63 (agent, queue and stream handles, correlation, kernel, dispatch, code-object and thread
    ids). ``odd_values``: fields no parser needs also hold 2**64 + 5, 2**80, -1, 1e999 and strings.
    Returns what it wrote: ``kernels``/``kernel_ns`` and ``copies``/``copy_ns`` (count, summed
    end - start), the ids used, ``pid``, ``fini_time``.
    """
    rng = random.Random(seed)
    ids = _ids(big_ids)
    pid = 4242
    gpus = [ids["agent"] + 2, ids["agent"] + 3]
    cpu = ids["agent"] + 1
    span = dispatches * 40_000 + copies * 20_000 + 10**9
    t = time.clock_gettime_ns(time.CLOCK_BOOTTIME) - span - 60 * 10**9
    init = t - 10**6
    odd: dict[str, Any] = {"big": 2**64 + 5, "huge": 2**80, "neg": -1, "inf": float("inf"), "text": "n/a"}
    indent_arg = 1 if indent else None

    def dump(obj: Any) -> str:
        return json.dumps(obj, indent=indent_arg).replace("Infinity", "1e999")

    def agent(handle: int, kind: int, node: int, type_index: int, name: str) -> dict[str, Any]:
        a: dict[str, Any] = {
            "size": 600,
            "id": {"handle": handle},
            "type": kind,
            "node_id": node,
            "logical_node_id": node,
            "logical_node_type_id": type_index,
            "hive_id": ids["hive"] + node if big_ids else 0,
            "gpu_id": ids["hive"] - node if big_ids else node,
            "name": name,
            "product_name": "AMD Instinct MI350X" if kind == 2 else "AMD EPYC 9575F",
        }
        if odd_values:
            a["odd"] = dict(odd)
        return a

    symbols = [
        {
            "size": 200,
            "kernel_id": ids["kernel"] + k,
            "code_object_id": ids["code"] + k % 3,
            "kernel_name": f"_Z6kernel{k}Pf",
            "kernel_object": ids["code"] + 4096 * k,
            "formatted_kernel_name": f"kernel{k}(float*)",
            "demangled_kernel_name": f"kernel{k}(float*)",
            "truncated_kernel_name": f"kernel{k}",
            **({"odd": dict(odd)} if odd_values else {}),
        }
        for k in range(kernels)
    ]
    code_objects = [
        {"size": 88, "code_object_id": ids["code"] + c, "rocp_agent": {"handle": gpus[c % 2]}, "uri": f"file:///x{c}"}
        for c in range(3)
    ]
    durations = [rng.randint(1_000, 30_000) for _ in range(dispatches)]
    gaps = [rng.randint(0, 2_000) for _ in range(dispatches)]
    copy_durations = [rng.randint(2_000, 50_000) for _ in range(copies)]
    fini = t + sum(durations) + sum(gaps) + sum(copy_durations) + 10 * copies + 10**6
    metadata: dict[str, Any] = {
        "pid": pid,
        "init_time": init,
        "fini_time": fini,
        "config": {"kernel_trace": True, "memory_copy_trace": True, "hip_runtime_api_trace": True},
        "command": ["/usr/bin/python3", "train_llm.py", "--steps", "10"],
    }
    head = {
        "metadata": metadata,
        "agents": [
            agent(cpu, 1, 0, 0, "AMD EPYC 9575F"),
            agent(gpus[0], 2, 1, 0, "gfx950"),
            agent(gpus[1], 2, 2, 1, "gfx950"),
        ],
        "counters": [],
        "strings": {
            "callback_records": [],
            "buffer_records": JSON_KINDS,
            "marker_api": [],
            "correlation_id": {"external": []},
        },
        "code_objects": code_objects,
        "kernel_symbols": symbols,
        "host_functions": [],
        "summary": [],
        "callback_records": {"counter_collection": []},
    }
    hip_recs: list[str] = []  # the HIP section follows the dispatches in the file: kept until then
    kernel_ns = copy_ns = 0
    corr = ids["corr"]
    with path.open("w") as fh:
        fh.write('{"rocprofiler-sdk-tool": [')
        fh.write(dump(head)[:-1].rstrip() + ',\n"buffer_records": {\n"kernel_dispatch": [')
        for i in range(dispatches):
            corr += 1
            dur = durations[i]
            hip_recs.append(dump(_hip(corr, ids["tid"], t - 3_000, t - 1_000, 1)))
            rec: dict[str, Any] = {
                "size": 144,
                "kind": _DISPATCH,
                "operation": 1,
                "thread_id": ids["tid"] + 1,
                "correlation_id": {"internal": corr, "external": corr if big_ids else 0},
                "start_timestamp": t,
                "end_timestamp": t + dur,
                "dispatch_info": {
                    "size": 96,
                    "agent_id": {"handle": gpus[i % 2]},
                    "queue_id": {"handle": ids["queue"] + i % 4},
                    "kernel_id": ids["kernel"] + i % kernels,
                    "dispatch_id": corr,
                    "private_segment_size": 0,
                    "group_segment_size": 0,
                    "workgroup_size": {"x": 256, "y": 1, "z": 1},
                    "grid_size": {"x": 65536, "y": 1, "z": 1},
                },
                "stream_id": {"handle": ids["stream"] + i % 2},
            }
            if odd_values:
                rec["odd"] = dict(odd)
            fh.write(("," if i else "") + dump(rec))
            kernel_ns += dur
            t += dur + gaps[i]
        copy_recs: list[str] = []
        for j in range(copies):
            corr += 1
            dur = copy_durations[j]
            to_device = j % 2 == 0
            hip_recs.append(dump(_hip(corr, ids["tid"], t - 500, t + dur + 100, 2)))
            copy_recs.append(
                dump(
                    {
                        "size": 80,
                        "kind": _COPY,
                        "operation": 2 if to_device else 3,
                        "thread_id": ids["tid"],
                        "correlation_id": {"internal": corr, "external": corr if big_ids else 0},
                        "start_timestamp": t,
                        "end_timestamp": t + dur,
                        "dst_agent_id": {"handle": gpus[j % 2] if to_device else cpu},
                        "src_agent_id": {"handle": cpu if to_device else gpus[j % 2]},
                        "bytes": 4096 * (j + 1),
                        "stream_id": {"handle": ids["stream"]},
                    }
                )
            )
            copy_ns += dur
            t += dur + 10
        fh.write("]")
        for name, recs in (("hip_api", hip_recs), ("hsa_api", []), ("marker_api", []), ("rccl_api", [])):
            fh.write(f',\n"{name}": [')
            _write_joined(fh, recs)
            fh.write("]")
        for name, recs in (("memory_copy", copy_recs), ("memory_allocation", [])):
            fh.write(f',\n"{name}": [')
            _write_joined(fh, recs)
            fh.write("]")
        fh.write("}}]}\n")
    return {
        "kernels": dispatches,
        "kernel_ns": kernel_ns,
        "copies": copies,
        "copy_ns": copy_ns,
        "ids": ids,
        "pid": pid,
        "fini_time": fini,
        "gpus": gpus,
    }


def _hip(corr: int, tid: int, start: int, end: int, op: int) -> dict[str, Any]:
    return {
        "size": 64,
        "kind": _HIP,
        "operation": op,
        "correlation_id": {"internal": corr, "external": 0},
        "start_timestamp": start,
        "end_timestamp": end,
        "thread_id": tid,
    }


def _write_joined(fh: IO[str], recs: list[str], step: int = 10_000) -> None:
    for k in range(0, len(recs), step):
        fh.write(("," if k else "") + ",".join(recs[k : k + step]))
