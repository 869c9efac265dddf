"""Recognise a trace file's format from its content and identify it (see ``files`` for identity)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from aaco.agent.sources.traces.files import TraceFile, content_identity, read_head
from aaco.agent.sources.traces.registry import TRACE_FORMATS
from aaco.contract.errors import TraceFormatError

# Every format ``sniff`` can name (the rocprofv3 CSVs are one file per domain, see rocprofv3_csv).
FORMATS = TRACE_FORMATS.names


def sniff(head: bytes) -> str | None:
    """The format of a trace whose content starts with ``head`` (one of ``FORMATS``), or None."""
    return TRACE_FORMATS.sniff(head)


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
