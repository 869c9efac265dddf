"""Trace files: read their head or whole content (gzip by content, not by name), identify them.

Formats are told apart by what the file holds (``detect``), so a renamed or compressed file is
still read right. Detection reads at most the first ``SNIFF_BYTES`` (decompressed); a file is read
whole only once it is known to be a trace of a known format, and always within ``limits``.

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
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path

from aaco.agent.sources.traces.limits import (
    DEFAULT_MAX_BYTES,
    TraceLimits,
    open_regular,
    open_trace,
    read_document,
)
from aaco.agent.sources.traces.rocprofv3_outputs import NotRead, not_read
from aaco.contract.errors import TraceFormatError

SNIFF_BYTES = 64 * 1024
HEADER_BYTES = 4096  # read of a file to tell a rocprofv3 output that is not read (its CSV header)
_HASH_STEP = 1 << 20


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


@dataclass(frozen=True)
class Expanded:
    """What a list of paths holds: the files to read, and the known files that are not read (``NotRead``)."""

    files: list[Path]
    not_read: list[NotRead]


def expand_paths(paths: list[Path]) -> Expanded:
    """Files named directly, plus the files under named directories (sorted, hidden files skipped).

    Files a rocprofv3 output directory holds beside its traces that AACO does not read (statistics,
    counters, other output formats: ``rocprofv3_outputs``) go to ``not_read``, each with what it is,
    for the caller to name once; everything else (unreadable or unknown files included) to ``files``.
    """
    files: list[Path] = []
    skipped: list[NotRead] = []
    for p in paths:
        if p.is_dir():
            found = sorted(
                f for f in p.rglob("*") if f.is_file() and not any(s.startswith(".") for s in f.relative_to(p).parts)
            )
        else:
            found = [p]
        for f in found:
            known = known_not_read(f)
            if known is None:
                files.append(f)
            else:
                skipped.append(known)
    return Expanded(files, skipped)


def expand(paths: list[Path]) -> list[Path]:
    """The files ``expand_paths`` gives to read (the known files it does not read left out)."""
    return expand_paths(paths).files


def known_not_read(path: Path) -> NotRead | None:
    """``rocprofv3_outputs.not_read`` of a regular file, from its first line; None for anything else."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        return not_read(path, read_head(path, HEADER_BYTES))
    except (OSError, TraceFormatError):
        return None  # left to ``detect.recognise``, which says what is wrong with it
