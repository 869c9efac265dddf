"""Trace files: open (gzip by content, not by name), recognise the format from content, identify.

Formats are told apart by what the file holds, so a renamed or compressed file is still read
right. Detection reads at most the first ``SNIFF_BYTES`` (decompressed); a file is read whole
only once it is known to be a trace of a known format, and never beyond ``max_bytes``.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

from aaco.agent.errors import TraceFormatError

SNIFF_BYTES = 64 * 1024
DEFAULT_MAX_BYTES = 4 * 1024**3
GZIP_MAGIC = b"\x1f\x8b"

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
    """A trace file that was recognised: its path, format, content identity and modification time."""

    path: Path
    format: str
    identity: str
    mtime_ns: int
    size: int


def _open(path: Path):
    with path.open("rb") as fh:
        magic = fh.read(2)
    return gzip.open(path, "rb") if magic == GZIP_MAGIC else path.open("rb")


def read_head(path: Path, n: int = SNIFF_BYTES) -> bytes:
    """The first ``n`` bytes of the file's content (decompressed)."""
    try:
        with _open(path) as fh:
            return fh.read(n)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"cannot read: {exc}", subject=path) from exc


def read_all(path: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The whole content (decompressed), refusing more than ``max_bytes``."""
    try:
        with _open(path) as fh:
            data = fh.read(max_bytes + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFormatError(f"cannot read (truncated or damaged?): {exc}", subject=path) from exc
    if len(data) > max_bytes:
        raise TraceFormatError(
            f"larger than the {max_bytes} byte limit", subject=path, hint="raise max_file_bytes in the source config"
        )
    return data


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
    from .rocprof_v1 import sniff_csv as sniff_rocprof_v1_csv
    from .rocprofv3_csv import sniff_csv as sniff_rocprofv3_csv

    return sniff_rocprofv3_csv(head) or sniff_rocprof_v1_csv(head)


def identify(path: Path) -> TraceFile:
    """Recognise a trace file, or raise ``TraceFormatError`` saying what is wrong with it."""
    if not path.exists():
        raise TraceFormatError("no such file", subject=path)
    if path.is_dir():
        raise TraceFormatError("is a directory; expected a trace file", subject=path)
    if not os.access(path, os.R_OK):
        raise TraceFormatError("not readable (permission denied)", subject=path)
    st = path.stat()
    if st.st_size == 0:
        raise TraceFormatError("empty file", subject=path)
    head = read_head(path)
    fmt = sniff(head)
    if fmt is None:
        raise TraceFormatError(
            "not a recognised trace (expected an ONNX Runtime profile, a Kineto/PyTorch profiler JSON, "
            "a rocprofv3 CSV/JSON/rocpd database, or a rocprof v1/v2 results.csv/results.json)",
            subject=path,
        )
    digest = hashlib.blake2b(head, digest_size=12)
    digest.update(str(st.st_size).encode())
    return TraceFile(path, fmt, digest.hexdigest(), st.st_mtime_ns, st.st_size)


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
