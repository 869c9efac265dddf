"""Generators of large traces built from the real samples (for tests and benchmarks; nothing is checked in).

``rocprofv3_csv`` repeats the dispatches of ``samples/rocprofv3/kernel_trace.csv`` with shifted
timestamps and fresh dispatch/correlation IDs; ``kineto`` builds a PyTorch-profiler trace of
ProfilerSteps whose kernels (with their cudaLaunchKernel calls) copy names from the A100 sample.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
from pathlib import Path

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


def kineto(samples: Path, path: Path, kernels: int, per_step: int = 1000) -> tuple[int, int]:
    """A Kineto trace of ``kernels`` kernels in ProfilerSteps; returns (kernels, summed duration ns)."""
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
        ts = t0 + step * (per_step * 20 + 100) + j * 20
        if j == 0:
            events.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": f"ProfilerStep#{step}",
                    "pid": pid,
                    "tid": tid,
                    "ts": ts - 1,
                    "dur": per_step * 20 + 50,
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
