"""Recognise a trace file's format from its content and identify it (see ``files`` for identity)."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from aaco.agent.sources.traces.files import TraceFile, content_identity, read_head
from aaco.contract.errors import TraceFormatError

# Categories ONNX Runtime writes into its profile (a JSON list of Chrome-trace events).
_ORT_HEAD = re.compile(rb'^\s*\[\s*\{[^\[\]]*"cat"\s*:\s*"(Session|Node|Kernel)"', re.S)
# Kineto writes schemaVersion/deviceProperties/baseTimeNanoseconds, or at least its own categories.
_KINETO_KEYS = (b'"schemaVersion"', b'"deviceProperties"', b'"baseTimeNanoseconds"', b'"distributedInfo"')
_KINETO_CATS = re.compile(
    rb'"cat"\s*:\s*"(cpu_op|cuda_runtime|kernel|gpu_memcpy|gpu_memset|user_annotation|python_function)"'
)
# rocprofv3 --output-format json: {"rocprofiler-sdk-tool": [...]} (or an object in some releases).
_ROCPROFV3_JSON = re.compile(rb'^\{\s*"rocprofiler-sdk-tool"\s*:\s*[\[{]')
SQLITE_MAGIC = b"SQLite format 3\x00"
# Every format ``sniff`` can name. The rocprofv3 CSVs are one file per domain (see rocprofv3_csv).
FORMATS = (
    "ort_profile",
    "kineto",
    "rocprofv3_kernel_csv",
    "rocprofv3_memcpy_csv",
    "rocprofv3_api_csv",
    "rocprofv3_agent_info_csv",
    "rocprofv3_json",
    "rocpd",
    "rocprof_v1_csv",
    "rocprof_v1_json",
)


def sniff(head: bytes) -> str | None:
    """The format of a trace whose content starts with ``head`` (one of ``FORMATS``), or None."""
    if head.startswith(SQLITE_MAGIC):
        return "rocpd" if b"rocpd_" in head else None
    text = head.lstrip()
    if text.startswith(b"[") and _ORT_HEAD.match(text):
        return "ort_profile"
    if text.startswith(b"{"):
        if _ROCPROFV3_JSON.match(text):
            return "rocprofv3_json"
        if b'"BeginNs"' in head:  # rocprof v1/v2 results.json: a Chrome trace, but not Kineto's
            return "rocprof_v1_json" if b'"traceEvents"' in head else None
        if any(k in head for k in _KINETO_KEYS) or (b'"traceEvents"' in head and _KINETO_CATS.search(head)):
            return "kineto"
        return None
    from aaco.agent.sources.traces.rocprof_v1 import sniff_csv as sniff_rocprof_v1_csv
    from aaco.agent.sources.traces.rocprofv3_csv import sniff_csv as sniff_rocprofv3_csv

    return sniff_rocprofv3_csv(head) or sniff_rocprof_v1_csv(head)


def recognise(path: Path) -> tuple[str, os.stat_result]:
    """The format of a trace file and its ``stat``, or ``TraceFormatError`` saying what is wrong with it."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise TraceFormatError("no such file", subject=path) from None
    except OSError as exc:
        raise TraceFormatError(f"cannot stat: {exc.strerror or exc}", subject=path) from None
    if stat.S_ISDIR(st.st_mode):
        raise TraceFormatError("is a directory; expected a trace file", subject=path)
    if not stat.S_ISREG(st.st_mode):
        raise TraceFormatError("not a regular file (a FIFO, socket or device); expected a trace file", subject=path)
    if not os.access(path, os.R_OK):
        raise TraceFormatError("not readable (permission denied)", subject=path)
    if st.st_size == 0:
        raise TraceFormatError("empty file", subject=path)
    fmt = sniff(read_head(path))
    if fmt is None:
        raise TraceFormatError(
            "not a recognised trace (expected an ONNX Runtime profile, a Kineto/PyTorch profiler JSON, "
            "a rocprofv3 CSV/JSON/rocpd database, or a rocprof v1/v2 results.csv/results.json)",
            subject=path,
        )
    return fmt, st


def identify(path: Path) -> TraceFile:
    """Recognise a trace file and identify it by content, or raise ``TraceFormatError`` saying what is wrong."""
    fmt, st = recognise(path)
    return TraceFile(path, fmt, content_identity(path), st.st_mtime_ns, st.st_size)
