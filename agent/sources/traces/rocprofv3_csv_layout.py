"""rocprofv3 CSV files: their formats, required columns, companion names, and the header parser.

Shared by the kernel/copy decoder (``rocprofv3_csv``) and the API-trace and agent readers
(``rocprofv3_csv_api``); the layouts themselves are described in ``rocprofv3_csv``.
"""

from __future__ import annotations

import csv
import zlib
from pathlib import Path

import pyarrow as pa

from aaco.agent.sources.traces.limits import TraceLimits, open_trace

FORMAT_KERNEL = "rocprofv3_kernel_csv"
FORMAT_MEMCPY = "rocprofv3_memcpy_csv"
FORMAT_API = "rocprofv3_api_csv"
FORMAT_AGENTS = "rocprofv3_agent_info_csv"
FORMATS = (FORMAT_KERNEL, FORMAT_MEMCPY, FORMAT_API, FORMAT_AGENTS)

_TIMES = ("Correlation_Id", "Start_Timestamp", "End_Timestamp")
REQUIRED = {
    FORMAT_KERNEL: ("Kind", "Agent_Id", "Queue_Id", "Kernel_Name", *_TIMES),
    FORMAT_MEMCPY: ("Kind", "Direction", "Source_Agent_Id", "Destination_Agent_Id", *_TIMES),
    FORMAT_API: ("Domain", "Function", "Process_Id", "Thread_Id", *_TIMES),
    FORMAT_AGENTS: ("Node_Id", "Logical_Node_Id", "Agent_Type"),
}
# Companion file names: <prefix><suffix>[.gz]
SUFFIXES = {
    "kernel_trace.csv": FORMAT_KERNEL,
    "memory_copy_trace.csv": FORMAT_MEMCPY,
    "hip_api_trace.csv": FORMAT_API,
    "marker_api_trace.csv": FORMAT_API,
    "agent_info.csv": FORMAT_AGENTS,
}
MARKER_RANGE_DOMAINS = ("MARKER_CORE_API", "MARKER_CORE_RANGE_API")
LAUNCH_DOMAIN_PREFIX = "HIP_"
MAX_TIME_NS = 1 << 62  # BOOTTIME ns beyond this is damage (146 years of uptime); rocprof v1 checks it

I64 = pa.int64()
DICT = pa.dictionary(pa.int32(), pa.string())
# Integer columns the decoders read (only those a kernels row or a launch needs: an id nobody
# reads, like Kernel_Id or Dispatch_Id, is never converted, whatever it holds).
INT_COLUMNS = (
    "Queue_Id",
    "Stream_Id",
    "Thread_Id",
    "Process_Id",
    "Correlation_Id",
    "Start_Timestamp",
    "End_Timestamp",
    "Workgroup_Size_X",
    "Workgroup_Size_Y",
    "Workgroup_Size_Z",
    "Grid_Size_X",
    "Grid_Size_Y",
    "Grid_Size_Z",
    "Size",
)
DICT_COLUMNS = ("Kind", "Agent_Id", "Direction", "Source_Agent_Id", "Destination_Agent_Id", "Domain", "Function")


def parse_header(head: bytes) -> list[str] | None:
    """The column names of a CSV whose content starts with ``head`` (None if the first line is not text)."""
    first = head.split(b"\n", 1)[0].rstrip(b"\r")
    if not first or b"\x00" in first:
        return None
    try:
        text = first.decode("utf-8").lstrip("\ufeff")
    except UnicodeDecodeError:
        return None
    try:
        cols = next(csv.reader([text]))
    except (csv.Error, StopIteration):
        return None
    return [c.strip() for c in cols]


def sniff_csv(head: bytes) -> str | None:
    """Which rocprofv3 CSV this is, from its header (None if none)."""
    names = parse_header(head)
    if not names:
        return None
    have = set(names)
    for fmt in (FORMAT_KERNEL, FORMAT_MEMCPY, FORMAT_API, FORMAT_AGENTS):
        if all(c in have for c in REQUIRED[fmt]):
            return fmt
    return None


def companions(path: Path) -> dict[str, Path]:
    """Files beside ``path`` from the same rocprofv3 run: suffix (e.g. ``hip_api_trace.csv``) -> path."""
    name = path.name.removesuffix(".gz")
    prefix = None
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            prefix = name[: -len(suffix)]
            break
    if prefix is None:
        return {}
    out: dict[str, Path] = {}
    for suffix in SUFFIXES:
        for cand in (path.parent / f"{prefix}{suffix}", path.parent / f"{prefix}{suffix}.gz"):
            if cand.is_file():
                out[suffix] = cand
                break
    return out


def read_bytes(path: Path, max_bytes: int, limits: TraceLimits | None = None) -> bytes:
    """At most ``max_bytes`` of the (decompressed) content of ``path``; of a damaged gzip, what precedes the damage.

    Read within ``limits`` (``TraceLimits``; None: the defaults), a step at a time (``read1``):
    ``read(n)`` would drop everything with the error.
    """
    parts: list[bytes] = []
    size = 0
    with open_trace(path, limits or TraceLimits(), json_guard=False) as fh:
        while size < max_bytes:
            try:
                data = fh.read1(min(max_bytes - size, 1 << 20))
            except (EOFError, OSError, zlib.error):
                break
            if not data:
                break
            parts.append(data)
            size += len(data)
    return b"".join(parts)


def column_types(names: list[str]) -> dict[str, pa.DataType]:
    """The Arrow types the decoders read the known columns of a header with (others are not read)."""
    types: dict[str, pa.DataType] = {}
    for c in names:
        if c in INT_COLUMNS:
            types[c] = I64
        elif c in DICT_COLUMNS:
            types[c] = DICT
        elif c == "Kernel_Name":
            types[c] = pa.string()
    return types
