"""Bounded reading of trace files: size on disk, decompressed size, gzip ratio, JSON depth.

Every trace file is read through ``open_trace``: a stream that reads in blocks (a ``read(n)`` never
reserves ``n`` bytes up front), decompresses gzip itself in bounded steps, and stops with a
``TraceLimitError`` naming the limit and the setting to raise as soon as a limit is passed:

- ``max_file_bytes``: the file on disk (checked with ``stat`` before reading) and its content once
  decompressed;
- ``max_gzip_ratio``: past ``gzip_grace_bytes`` of output, a gzip stream that expands more than
  this many times its compressed size is a decompression bomb (zeros or spaces compress about
  1000:1; real traces 8-25:1, a CSV of repeated rows near 200:1), stopped there;
- ``max_json_depth``: content that starts like JSON is scanned as it is read (``json_scan``) and
  refused at the first byte nested deeper than this (real traces nest less than 10 deep).

A damaged gzip stream keeps everything decompressed before the damage: the stream hands that out
first (recovering, byte by byte, the output of the step where zlib met the damage), then raises
``EOFError`` (cut short) or ``zlib.error`` (corrupt), as ``gzip`` does. ``read_document`` reads a
whole file within the limits and returns the damage instead of raising it.
"""

from __future__ import annotations

import io
import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from aaco.agent.sources.traces.json_scan import JsonScanner, JsonTooDeepError
from aaco.contract.errors import TraceFormatError

GZIP_MAGIC = b"\x1f\x8b"
DEFAULT_MAX_BYTES = 4 * 1024**3
READ_STEP = 1 << 20  # the most one read asks of the file or yields at once
HINT_GZIP_RATIO = 16  # read_document sizes its buffer from a gzip trailer up to this ratio
_INPUT_STEP = 64 * 1024  # compressed bytes fed to zlib at once
_RECOVER_STEP = 512  # compressed bytes fed at once when finding the output before a damage


@dataclass(frozen=True)
class TraceLimits:
    """The bounds on one trace file (see the module doc); ``max_file_bytes`` None: no size bound.

    Sources name them in their config (``max_file_bytes``, ``max_gzip_ratio``, ``max_json_depth``).
    """

    max_file_bytes: int | None = DEFAULT_MAX_BYTES
    max_gzip_ratio: int = 200
    gzip_grace_bytes: int = 256 << 20
    max_json_depth: int = 128
    critical_path: str = "ranks"  # ranks | all | off: which Kineto traces get a critical path per step
    critical_path_max_events: int = 100_000  # traces of more events do not (kineto_critical)


class TraceLimitError(TraceFormatError):
    """A file passed one of the ``TraceLimits``; ``limit`` names the field."""

    def __init__(self, message: str, *, subject: str | os.PathLike[str] | None, limit: str, hint: str) -> None:
        super().__init__(message, subject=subject, hint=hint)
        self.limit = limit


def size_error(size: int, limit: int, path: Path, decompressed: bool) -> TraceLimitError:
    """The error for a file (or its decompressed content) of ``size`` bytes over ``max_file_bytes``."""
    what = f"decompressed content passed {size} bytes" if decompressed else f"file is {size} bytes"
    return TraceLimitError(
        f"{what}, over the {limit} byte limit (max_file_bytes)",
        subject=path,
        limit="max_file_bytes",
        hint="raise max_file_bytes in the source config",
    )


def check_size(path: Path, limits: TraceLimits, st: os.stat_result | None = None) -> os.stat_result:
    """``stat`` the file and refuse it before reading: not a regular file, or larger than ``max_file_bytes``."""
    st = st or os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise TraceFormatError("not a regular file (a FIFO, socket, device or directory)", subject=path)
    if limits.max_file_bytes is not None and st.st_size > limits.max_file_bytes:
        raise size_error(st.st_size, limits.max_file_bytes, path, False)
    return st


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading, refused without blocking when it is not a regular file.

    O_NONBLOCK keeps a FIFO put in a file's place (a rotating spool) from waiting for a writer;
    it changes nothing for a regular file.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise TraceFormatError("not a regular file (a FIFO, socket, device or directory)", subject=path)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


class _Gunzip:
    """Streamed gzip decompression (multi-member, zero padding allowed) that keeps the output before a damage."""

    def __init__(self, raw: BinaryIO) -> None:
        self.raw = raw
        self.consumed = 0  # compressed bytes read from the file
        self._d = zlib.decompressobj(31)
        self._input = b""  # compressed bytes not yet fed
        self._more = False  # zlib may hold output for the input it has (its last output filled the step)
        self._eof = False
        self.error: Exception | None = None  # the damage, raised once the output before it is handed out

    def read(self, n: int) -> bytes:
        """Up to ``n`` decompressed bytes (b"" at the end); raises the damage after the output before it."""
        while not self._eof:
            if not self._input and not self._more:
                self._input = self.raw.read(_INPUT_STEP)
                self.consumed += len(self._input)
                if not self._input:
                    return self._end_of_input()
            if self._d.eof:
                self._next_member()
                continue
            saved = self._d.copy()
            try:
                out = self._d.decompress(self._input, n)
            except zlib.error as exc:
                return self._damaged(saved, exc)
            # at a member's end, the rest of the input is in unused_data (unconsumed_tail repeats it)
            self._input = self._d.unused_data if self._d.eof else self._d.unconsumed_tail
            self._more = len(out) == n
            if out:
                return out
        if self.error is not None:
            raise self.error
        return b""

    def _next_member(self) -> None:
        self._input = self._input.lstrip(b"\x00")  # gzip allows zero padding after a member
        if self._input:
            self._d = zlib.decompressobj(31)
        self._more = False

    def _end_of_input(self) -> bytes:
        self._eof = True
        if not self._d.eof:
            self.error = EOFError(
                f"gzip stream cut short at compressed byte {self.consumed} (truncated before its end marker)"
            )
            try:
                tail = self._d.flush()
            except zlib.error:
                tail = b""
            if tail:
                return tail
            raise self.error
        return b""

    def _damaged(self, d: zlib._Decompress, exc: zlib.error) -> bytes:
        """Output of the failing step up to the damage: fed again in small pieces, then byte by byte."""
        out: list[bytes] = []
        data = self._input
        for step in (_RECOVER_STEP, 1):
            failed = None
            for i in range(0, len(data), step):
                trial = d.copy()
                try:
                    out.append(trial.decompress(data[i : i + step]))
                except zlib.error:
                    failed = data[i : i + step]
                    break
                d = trial
            if failed is None:
                break
            data = failed
        at = self.consumed - len(self._input)
        self.error = zlib.error(f"damaged gzip stream near compressed byte {at}: {exc}")
        self._eof = True
        got = b"".join(out)
        if not got:
            raise self.error
        return got


class TraceStream(io.RawIOBase):
    """A trace file's content (decompressed) within ``TraceLimits``; see the module doc."""

    def __init__(self, path: Path, limits: TraceLimits, *, json_guard: bool = True) -> None:
        super().__init__()
        self.path = path
        self.limits = limits
        self._raw = open_regular(path)
        try:
            check_size(path, limits, os.fstat(self._raw.fileno()))
            self.compressed = self._raw.read(2) == GZIP_MAGIC
            self._raw.seek(0)
        except BaseException:
            self._raw.close()
            raise
        self._gz = _Gunzip(self._raw) if self.compressed else None
        self.position = 0  # decompressed bytes handed out
        self._guard = json_guard
        self._scanner: JsonScanner | None = None
        self._sniffed = False
        self._too_deep: JsonDepthError | None = None

    def readable(self) -> bool:
        """A trace stream is readable."""
        return True

    def tell(self) -> int:
        """Decompressed bytes read so far."""
        return self.position

    def read(self, size: int | None = -1) -> bytes:
        """Up to ``size`` bytes (all that is left for None or a negative size), read in bounded steps.

        A damage (or the depth limit) after some bytes of this read ends it there; the next read raises it.
        """
        if size is None or size < 0:
            return self.readall()
        parts: list[bytes] = []
        want = size
        while want > 0:
            try:
                piece = self._step(min(want, READ_STEP))
            except (EOFError, zlib.error, JsonDepthError):
                if parts:
                    break
                raise
            if not piece:
                break
            parts.append(piece)
            want -= len(piece)
        return b"".join(parts)

    def read1(self, size: int = -1) -> bytes:
        """At most one step (``READ_STEP`` bytes at most): a damage raises with no bytes of its own step lost."""
        return self._step(READ_STEP if size is None or size < 0 else min(size, READ_STEP))

    def readall(self) -> bytes:
        """Everything left (within the limits)."""
        out = bytearray()
        while piece := self._step(READ_STEP):
            out += piece
        return bytes(out)

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        """Read into ``buffer``; the number of bytes read."""
        data = self.read(len(buffer))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        """Close the file."""
        self._raw.close()
        super().close()

    def _step(self, n: int) -> bytes:
        if self._too_deep is not None:
            raise self._too_deep
        if n <= 0:
            return b""
        data = self._gz.read(n) if self._gz is not None else self._raw.read(n)
        if not data:
            return data
        self.position += len(data)
        limits = self.limits
        if limits.max_file_bytes is not None and self.position > limits.max_file_bytes:
            raise size_error(self.position, limits.max_file_bytes, self.path, True)
        gz = self._gz
        if gz is not None and limits.max_gzip_ratio * max(gz.consumed, 1) < self.position > limits.gzip_grace_bytes:
            raise TraceLimitError(
                f"gzip content expands more than {limits.max_gzip_ratio} times (max_gzip_ratio) its compressed "
                f"size ({self.position} bytes from {gz.consumed}): a decompression bomb? stopped there",
                subject=self.path,
                limit="max_gzip_ratio",
                hint="raise max_gzip_ratio in the source config if this file is genuine",
            )
        if self._guard:
            data = self._scan(data)
        return data

    def _scan(self, data: bytes) -> bytes:
        """``data`` up to where it nests deeper than the limit (then the next read raises that)."""
        if not self._sniffed:
            head = data.lstrip(b" \t\r\n\xef\xbb\xbf")
            if not head:
                return data
            self._sniffed = True
            if head[:1] in (b"{", b"["):
                self._scanner = JsonScanner(self.limits.max_json_depth)
                self._scanner.offset = self.position - len(data)
        if self._scanner is None:
            return data
        start = self._scanner.offset
        try:
            self._scanner.feed(data)
        except JsonTooDeepError as exc:
            self._too_deep = json_depth_error(exc, self.path)
            self.position = exc.offset
            if exc.offset == start:
                raise self._too_deep from None
            return data[: exc.offset - start]
        return data


class JsonDepthError(TraceLimitError, ValueError):
    """Content nested deeper than ``max_json_depth``.

    A ``ValueError`` too, so that a streaming JSON parser that keeps the rows before a damage does
    so here; ``reason`` names what to count.
    """

    reason = "json_too_deep"


def json_depth_error(exc: JsonTooDeepError, path: Path) -> JsonDepthError:
    """The error for a document nested deeper than ``max_json_depth``."""
    return JsonDepthError(
        f"JSON nested deeper than {exc.limit} levels (max_json_depth) at byte {exc.offset}; real traces nest "
        "less than 10 deep",
        subject=path,
        limit="max_json_depth",
        hint="raise max_json_depth in the source config if this file is genuine",
    )


def open_trace(path: Path, limits: TraceLimits | None = None, *, json_guard: bool = True) -> TraceStream:
    """Open a trace file's content (gzip by content) within ``limits`` (default: no size bound)."""
    return TraceStream(path, limits or TraceLimits(max_file_bytes=None), json_guard=json_guard)


@dataclass
class Document:
    """A whole file's content, and the damage that ended it early (None when it was read whole)."""

    data: bytearray
    damage: str | None = None


def read_document(path: Path, limits: TraceLimits, *, json_guard: bool = False) -> Document:
    """A whole file's content within ``limits``; a damaged gzip keeps what came before the damage.

    The buffer is sized once from the file's size (a gzip file's: its trailer's), so that reading a
    large file does not hold two copies while the buffer grows.
    """
    out = bytearray(_size_hint(path, limits))
    at = 0
    with TraceStream(path, limits, json_guard=json_guard) as fh:
        try:
            while piece := fh.read(READ_STEP):
                out[at : at + len(piece)] = piece
                at += len(piece)
        except (EOFError, zlib.error) as exc:
            del out[at:]
            return Document(out, str(exc))
    del out[at:]
    return Document(out)


def _size_hint(path: Path, limits: TraceLimits) -> int:
    """The content's size as the file says it (gzip: ISIZE, the size modulo 2^32), within ``limits``; 0 if unknown."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if fh.read(2) != GZIP_MAGIC:
                claimed, most = size, size
            else:
                fh.seek(-4, os.SEEK_END)
                # trusted up to a text file's usual ratio: a bomb's claim allocates nothing up front
                claimed, most = int.from_bytes(fh.read(4), "little"), size * HINT_GZIP_RATIO
    except OSError:
        return 0
    return max(0, min(claimed, most, limits.max_file_bytes or claimed))
