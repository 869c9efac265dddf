"""Trace files: open (gzip by content, not by name), recognise the format from content, identify.

Formats are told apart by what the file holds, so a renamed or compressed file is still read
right. Detection reads at most the first ``SNIFF_BYTES`` (decompressed); a file is read whole
only once it is known to be a trace of a known format, and always within ``trace_limits``.

Identity: a file's identity is a digest of its whole content (SHA-256, 96 bits kept), so two
files that differ anywhere are two files, and the same content under another name or path is the
same file (replaying it again adds nothing). A sampled identity (size and the first 64 KiB) called
different files with the same head one file and skipped the second; size, mtime and inode would
call a copy a new file. Measured on a 1 GiB file in the page cache: 0.7 s (0.1 s of it reading;
BLAKE2b took 1.25 s, SHA-256 runs on the CPU's SHA extensions), a small part of parsing it.
``recognise`` gives the format without hashing, for a poller that looks at a file before it is
complete.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path

from aaco.agent.sources.trace_limits import (
    DEFAULT_MAX_BYTES,
    GZIP_MAGIC,
    TraceLimits,
    open_regular,
    open_trace,
    read_document,
)
from aaco.contract.errors import TraceFormatError

__all__ = [  # GZIP_MAGIC and DEFAULT_MAX_BYTES are defined in trace_limits; the other readers take them from here
    "DEFAULT_MAX_BYTES",
    "FORMATS",
    "GZIP_MAGIC",
    "SNIFF_BYTES",
    "TraceFile",
    "content_identity",
    "expand",
    "identify",
    "read_all",
    "read_head",
    "recognise",
    "sniff",
]

SNIFF_BYTES = 64 * 1024
_HASH_STEP = 1 << 20

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


@dataclass(frozen=True)
class TraceFile:
    """A trace file that was recognised: its path, format, content identity and modification time.

    ``limits``: the bounds its source reads it within (None: the defaults; ``parse_any``'s
    ``max_bytes`` sets the size bound either way).
    """

    path: Path
    format: str
    identity: str
    mtime_ns: int
    size: int
    limits: TraceLimits | None = None


def read_head(path: Path, n: int = SNIFF_BYTES) -> bytes:
    """The first ``n`` bytes of the file's content (decompressed; what precedes a damage)."""
    try:
        with open_trace(path, json_guard=False) as fh:
            return fh.read(n)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"cannot read: {exc}", subject=path) from exc


def read_all(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The whole content (decompressed), refusing more than ``max_bytes`` or a damaged file."""
    try:
        doc = read_document(path, TraceLimits(max_file_bytes=max_bytes))
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc}", subject=path) from exc
    if doc.damage is not None:
        raise TraceFormatError(f"cannot read (truncated or damaged): {doc.damage}", subject=path)
    return bytes(doc.data)


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
    from aaco.agent.sources.rocprof_v1 import sniff_csv as sniff_rocprof_v1_csv
    from aaco.agent.sources.rocprofv3_csv import sniff_csv as sniff_rocprofv3_csv

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


def content_identity(path: Path) -> str:
    """The digest of a file's whole content (see the module doc), 24 hex digits."""
    digest = hashlib.sha256()
    buf = bytearray(_HASH_STEP)
    view = memoryview(buf)
    try:
        with open_regular(path) as fh:
            while n := fh.readinto(buf):
                digest.update(view[:n])
    except OSError as exc:
        raise TraceFormatError(f"cannot read: {exc}", subject=path) from exc
    return digest.hexdigest()[:24]


def identify(path: Path) -> TraceFile:
    """Recognise a trace file and identify it by content, or raise ``TraceFormatError`` saying what is wrong."""
    fmt, st = recognise(path)
    return TraceFile(path, fmt, content_identity(path), st.st_mtime_ns, st.st_size)


def expand(paths: list[Path]) -> list[Path]:
    """Files named directly, plus the files under named directories (sorted, hidden files skipped)."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            out += sorted(
                f for f in p.rglob("*") if f.is_file() and not any(s.startswith(".") for s in f.relative_to(p).parts)
            )
        else:
            out.append(p)
    return out
