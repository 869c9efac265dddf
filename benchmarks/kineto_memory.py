"""Kineto in bounded memory: a 1,000,000-event trace through the agent against ``orjson.loads`` of it.

The trace is generated in a temporary directory, shaped like the real samples
(``examples/data/kineto*``): per kernel, the ``cpu_op`` that ran it (with the args Kineto writes:
External id, Record function id, Sequence number, Ev Idx, Input Dims), its ``cudaLaunchKernel``
(``cuda_runtime``, correlation, cbid), the ``ac2g`` flow start and end linking them, and the kernel
(device, stream, grid, block, occupancy args; names taken from the real A100 sample), in
``ProfilerStep#N`` iterations of 1,000 kernels, with Kineto's layout (one key group a line, two
spaces of indent). ``deviceProperties``, ``baseTimeNanoseconds`` and ``traceName`` come after
``traceEvents``, as some Kineto versions write them.

Each measured run is its own process (so its peak RSS, ``ru_maxrss`` from ``wait4``, is its own);
rounds are interleaved (orjson, source, replay, orjson, ...) and medians reported:

- ``orjson``: read the file and ``orjson.loads`` it whole (the floor: the parse alone, no conversion);
- ``source``: the agent's trace source path (``parse_any``: read, parse, convert to kernel and
  iteration tables), timed in the child after its imports;
- ``replay``: the whole ``aaco replay`` command (start-up, parse, correlator, analyzers, Parquet
  lake), wall time of the process.

Throughput ratio (the goal, >= 1.5 since issue 32; 0.5 in issue 18): replay events/s over orjson
events/s, the replay's whole process (start-up and pipeline included) against orjson's parse timed
after its imports, the file read included. The source's ratio (timed after imports like orjson's)
is reported beside it, and both in CPU seconds of the child (``process_time`` for orjson and the
source, user + system of the whole replay process from ``wait4``): on a shared machine CPU time
moves less than wall time. RSS goal: ``aaco replay``'s peak <= 1024 MiB. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "examples" / "data" / "kineto" / "a100_alexnet_trace.json.gz"
AACO = str(Path(sys.executable).parent / "aaco")
PER_STEP = 1000
PID, TID = 2869224, 2869224

ORJSON_CHILD = """
import sys, time, orjson
t0, c0 = time.perf_counter(), time.process_time()
with open(sys.argv[1], "rb") as fh:
    doc = orjson.loads(fh.read())
n = len(doc["traceEvents"])
print(time.perf_counter() - t0, time.process_time() - c0, n)
"""

SOURCE_CHILD = """
import sys, time
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.parse import context_for, parse_any
t0, c0 = time.perf_counter(), time.process_time()
tf = identify(__import__("pathlib").Path(sys.argv[1]))
kernels = sum(p.kernels.num_rows for p in parse_any(tf, context_for(tf, node="n", source="kineto")))
print(time.perf_counter() - t0, time.process_time() - c0, kernels)
"""


def _kernel_names() -> list[str]:
    doc = json.loads(gzip.decompress(SAMPLE.read_bytes()))
    return [e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel"]


def _event(head: str, args: dict[str, object] | None) -> str:
    """One event as Kineto lays it out: fields on one line, args on their own lines."""
    if args is None:
        return "  {\n    " + head + "\n  }"
    body = ",\n".join(f"      {json.dumps(k)}: {json.dumps(v)}" for k, v in args.items())
    return "  {\n    " + head + ',\n    "args": {\n' + body + "\n    }\n  }"


def generate(path: Path, n_events: int) -> tuple[int, int]:
    """Write a Kineto trace of about ``n_events`` events; returns (events, kernels)."""
    names = _kernel_names()
    ops = ["aten::conv2d", "aten::addmm", "aten::relu_", "aten::add_", "aten::copy_", "aten::mm"]
    per_kernel = 5
    kernels = n_events // per_kernel
    events = 0
    t = 1000.0
    with path.open("w") as fh:
        fh.write('{\n  "schemaVersion": 1,\n  "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},\n')
        fh.write('  "traceEvents": [\n')
        meta = [
            f'"name": "process_name", "ph": "M", "ts": 0.0, "pid": {PID}, "tid": 0, "args": {{"name": "resnet50"}}',
            f'"name": "process_labels", "ph": "M", "ts": 0.0, "pid": {PID}, "tid": 0, "args": {{"labels": "CPU"}}',
            '"name": "process_name", "ph": "M", "ts": 0.0, "pid": 0, "tid": 0, "args": {"name": "python3"}',
            '"name": "process_labels", "ph": "M", "ts": 0.0, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}',
        ]
        fh.write(",\n".join("  {\n    " + m + "\n  }" for m in meta))
        events += len(meta)
        parts: list[str] = []
        for k in range(kernels):
            step, j = divmod(k, PER_STEP)
            ext, corr = 2 * k + 1, k + 1
            if j == 0:
                head = f'"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": {PID}, '
                head += f'"tid": {TID},\n    "ts": {t - 1.5:.3f}, "dur": {PER_STEP * 21.0 + 3:.3f}'
                parts.append(_event(head, {"External id": ext, "Record function id": 0, "Ev Idx": ext - 1}))
                events += 1
            op = ops[k % len(ops)]
            head = f'"ph": "X", "cat": "cpu_op", "name": "{op}", "pid": {PID}, "tid": {TID},\n'
            head += f'    "ts": {t:.3f}, "dur": {12.25 + k % 5:.3f}'
            op_args = {
                "External id": ext,
                "Record function id": 0,
                "Sequence number": k,
                "Fwd thread id": 0,
                "Ev Idx": ext,
                "Input Dims": [[64, 256, 56, 56], [256, 256, 3, 3], [256]],
                "Input type": ["float", "float", "float"],
            }
            parts.append(_event(head, op_args))
            launch = t + 2.125
            head = f'"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {PID}, "tid": {TID},\n'
            head += f'    "ts": {launch:.3f}, "dur": 4.375'
            parts.append(_event(head, {"External id": ext, "cbid": 211, "correlation": corr}))
            flow = f'"ph": "s", "id": {corr}, "pid": {PID}, "tid": {TID}, "ts": {launch:.3f}, "cat": "ac2g", '
            parts.append("  {\n    " + flow + '"name": "ac2g"\n  }')
            start = t + 9.5
            name = json.dumps(names[k % len(names)])
            head = f'"ph": "X", "cat": "kernel", "name": {name}, "pid": 0, "tid": 7,\n'
            head += f'    "ts": {start:.3f}, "dur": {5.0 + k % 7:.3f}'
            kernel_args = {
                "External id": ext,
                "queued": 0,
                "device": 0,
                "context": 1,
                "stream": 7,
                "correlation": corr,
                "registers per thread": 32,
                "shared memory": 0,
                "blocks per SM": 2.5,
                "warps per SM": 20.0,
                "grid": [270, 1, 1],
                "block": [256, 1, 1],
                "est. achieved occupancy %": 31,
            }
            parts.append(_event(head, kernel_args))
            flow = f'"ph": "f", "id": {corr}, "pid": 0, "tid": 7, "ts": {start:.3f}, "cat": "ac2g", '
            parts.append("  {\n    " + flow + '"name": "ac2g", "bp": "e"\n  }')
            events += per_kernel
            t += 21.0
            if len(parts) >= 50_000:
                fh.write(",\n" + ",\n".join(parts))
                parts = []
        if parts:
            fh.write(",\n" + ",\n".join(parts))
        props = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85_100_000_000, "computeMajor": 8}]
        fh.write("\n  ],\n")
        fh.write(f'  "deviceProperties": {json.dumps(props)},\n')
        fh.write('  "baseTimeNanoseconds": 1790857026000000000,\n  "traceName": "generated.pt.trace.json"\n}\n')
    return events, kernels


def run_child(args: list[str]) -> tuple[float, int, str, float]:
    """(wall seconds, peak RSS bytes, stdout, CPU seconds) of one child process, measured with ``wait4``."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out_fh, tempfile.TemporaryFile() as err_fh:
        proc = subprocess.Popen(args, stdout=out_fh, stderr=err_fh, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out_fh.seek(0)
        err_fh.seek(0)
        out, err = out_fh.read().decode(), err_fh.read().decode()
    if proc.returncode != 0:
        raise SystemExit(f"{args[:3]} failed: {err[-2000:]}")
    return wall, usage.ru_maxrss * 1024, out, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    runs: dict[str, list[tuple[float, int]]] = {"orjson": [], "source": [], "replay": []}
    cpu: dict[str, list[float]] = {"orjson": [], "source": [], "replay": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        path = work / "generated.pt.trace.json"
        events, kernels = generate(path, args.events)
        mb = path.stat().st_size / 1e6
        for i in range(args.rounds):
            _, rss, out, _ = run_child([sys.executable, "-c", ORJSON_CHILD, str(path)])
            secs, cpu_s, n = out.split()
            assert int(n) == events, (n, events)
            runs["orjson"].append((float(secs), rss))
            cpu["orjson"].append(float(cpu_s))
            _, rss, out, _ = run_child([sys.executable, "-c", SOURCE_CHILD, str(path)])
            secs, cpu_s, n = out.split()
            assert int(n) == kernels, (n, kernels)
            runs["source"].append((float(secs), rss))
            cpu["source"].append(float(cpu_s))
            wall, rss, _, cpu_s = run_child([AACO, "replay", str(path), "--out", str(work / f"lake{i}"), "--force"])
            runs["replay"].append((wall, rss))
            cpu["replay"].append(cpu_s)
    med = {k: statistics.median(s for s, _ in v) for k, v in runs.items()}
    rss = {k: max(r for _, r in v) / 2**20 for k, v in runs.items()}
    ratio = med["orjson"] / med["replay"]
    goal = 1.5
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        json.dumps(
            {
                "benchmark": "kineto_memory",
                "events": events,
                "kernels": kernels,
                "file_mb": round(mb, 1),
                "rounds": args.rounds,
                "orjson_s": round(med["orjson"], 3),
                "orjson_events_per_s": round(events / med["orjson"]),
                "orjson_peak_rss_mib": round(rss["orjson"]),
                "source_s": round(med["source"], 3),
                "source_events_per_s": round(events / med["source"]),
                "source_peak_rss_mib": round(rss["source"]),
                "replay_s": round(med["replay"], 3),
                "replay_events_per_s": round(events / med["replay"]),
                "replay_peak_rss_mib": round(rss["replay"]),
                "throughput_ratio_source_vs_orjson": round(med["orjson"] / med["source"], 3),
                "throughput_ratio_source_vs_orjson_cpu": round(cpu_med["orjson"] / cpu_med["source"], 3),
                "throughput_ratio_replay_vs_orjson": round(ratio, 3),
                "throughput_ratio_replay_vs_orjson_cpu": round(cpu_med["orjson"] / cpu_med["replay"], 3),
                "goal_ratio": goal,
                "goal_rss_mib": 1024,
                "goal_met_throughput": ratio >= goal,
                "goal_met_rss": rss["replay"] <= 1024,
            }
        )
    )


if __name__ == "__main__":
    main()
