"""Seeded mutations of trace files for the fuzz suite (``tests/unit/test_fuzz_formats.py``), and its contract.

Every generator takes the undamaged bytes (or document) and a ``random.Random``, so a failure
is reproduced from its seed alone. Besides the damaged bytes, generators return what a test needs
to say which rows must survive: the cut position, the flipped offsets, the decompressible prefix
of a cut gzip, the reference document of a JSON prefix. ``parse_rows`` runs ``identify`` +
``parse_any`` under the contract (see ``contract_rows``) and ``guarded`` keeps a FIFO from
hanging the suite.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import re
import threading
import traceback
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.clock import ClockOffset, in_epoch_range
from aaco.contract.errors import TraceFormatError
from aaco.contract.schemas import conform

# Raw values written over a number: unsigned 64-bit (valid in rocprofv3), beyond 64 bits, negative,
# infinite, not a number, not numeric, and strings longer than any name a parser keeps.
UINT64_VALUES = (str(2**63), str(2**64 - 1))
OVERFLOW_VALUES = (str(2**64 + 5), str(2**80), str(-(2**63) - 1), "-1", "1e999", "-1e999", "NaN")
TEXT_VALUES = ("abc", "x" * 70_000, "y" * 300_000)
VALUES = UINT64_VALUES + OVERFLOW_VALUES + TEXT_VALUES
SENTINEL = "__aaco_fuzz_sentinel__"
# BOOTTIME-stamped formats (rocprof*, rocpd) land in late 2023 with this offset; others anchor themselves.
CLOCK = ClockOffset(1_700_000_000 * 10**9, 1, "fuzz")


def truncate(data: bytes, rng: random.Random) -> tuple[bytes, int]:
    """``data`` cut at a random byte (at least one byte kept, at least one lost), and the cut."""
    cut = rng.randint(1, max(1, len(data) - 1))
    return data[:cut], cut


def flip_bytes(data: bytes, rng: random.Random, start: int = 0, most: int = 8) -> tuple[bytes, list[int]]:
    """``data`` with 1..``most`` bytes at or after ``start`` XORed with a random non-zero byte; the offsets."""
    out = bytearray(data)
    where = sorted(rng.randrange(start, len(data)) for _ in range(rng.randint(1, most)))
    for pos in where:
        out[pos] ^= rng.randint(1, 255)
    return bytes(out), where


def gzip_cut(data: bytes, rng: random.Random) -> tuple[bytes, bytes]:
    """A gzip of ``data`` cut at a random byte past its header, and what a decoder gets out of the cut."""
    packed = gzip.compress(data, compresslevel=6, mtime=0)
    cut = rng.randint(11, len(packed) - 1)
    return packed[:cut], decompressible(packed[:cut])


def decompressible(packed: bytes) -> bytes:
    """Everything zlib decompresses from a (possibly cut or damaged) gzip stream before it stops."""
    d = zlib.decompressobj(wbits=31)
    out = []
    with contextlib.suppress(zlib.error):  # a damaged stream: what came out of the pieces before the damage
        for i in range(0, len(packed), 4096):
            out.append(d.decompress(packed[i : i + 4096]))
    return b"".join(out)


def gzip_flip(data: bytes, rng: random.Random) -> bytes:
    """A gzip of ``data`` with bytes flipped in its compressed body (inflate or CRC errors)."""
    packed = gzip.compress(data, compresslevel=6, mtime=0)
    return flip_bytes(packed, rng, start=10, most=4)[0]


def gzip_bomb(head: bytes, size: int, fill: bytes = b" ", tail: bytes = b"") -> bytes:
    """A gzip of ``head``, ``size`` bytes of ``fill`` (1 MiB steps), then ``tail``: ~1000x smaller than it inflates.

    Deflate output after a full flush does not refer back, so one compressed MiB of ``fill`` is
    repeated as it is, instead of compressing the whole size (seconds per GiB).
    """
    step = fill * ((1 << 20) // len(fill))
    comp = zlib.compressobj(9, zlib.DEFLATED, -15)
    first = comp.compress(head) + comp.flush(zlib.Z_FULL_FLUSH)
    block = comp.compress(step) + comp.flush(zlib.Z_FULL_FLUSH)
    last = comp.compress(tail) + comp.flush()
    n = max(1, size // len(step))
    crc = zlib.crc32(head)
    for _ in range(n):
        crc = zlib.crc32(step, crc)
    crc = zlib.crc32(tail, crc)
    total = len(head) + n * len(step) + len(tail)
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"
    trailer = crc.to_bytes(4, "little") + (total & 0xFFFFFFFF).to_bytes(4, "little")
    return header + first + block * n + last + trailer


# --- CSV -----------------------------------------------------------------------------------------

_FIELD = re.compile(rb'"(?:[^"]|"")*"|[^,]*')


def csv_fields(line: bytes) -> list[bytes]:
    """The raw fields of one CSV line, quotes kept, so a rewritten line differs only where it was changed."""
    out, pos = [], 0
    while True:
        m = _FIELD.match(line, pos)
        assert m is not None
        out.append(m.group(0))
        pos = m.end()
        if pos >= len(line) or line[pos : pos + 1] != b",":
            return out
        pos += 1


def csv_lines(data: bytes) -> list[bytes]:
    """Lines without their newline (the last one kept even when the file does not end in one)."""
    lines = data.split(b"\n")
    return lines[:-1] if lines and lines[-1] == b"" else lines


def csv_join(lines: list[bytes]) -> bytes:
    """Lines back to a file ending in a newline."""
    return b"\n".join(lines) + b"\n"


def csv_permute_columns(data: bytes, order: list[int]) -> bytes:
    """Every line (header included) with its fields taken in ``order`` (a swap, or a duplicate)."""
    out = []
    for line in csv_lines(data):
        f = csv_fields(line)
        out.append(b",".join(f[i] for i in order) if len(f) > max(order) else line)
    return csv_join(out)


def csv_set_field(data: bytes, row: int, col: int, value: bytes) -> bytes:
    """Data row ``row`` (0 = the line after the header) with field ``col`` replaced by ``value``."""
    lines = csv_lines(data)
    f = csv_fields(lines[row + 1])
    f[col] = value
    lines[row + 1] = b",".join(f)
    return csv_join(lines)


def csv_swap_fields(data: bytes, row: int, a: int, b: int) -> bytes:
    """Data row ``row`` with fields ``a`` and ``b`` exchanged (the header and other rows untouched)."""
    lines = csv_lines(data)
    f = csv_fields(lines[row + 1])
    f[a], f[b] = f[b], f[a]
    lines[row + 1] = b",".join(f)
    return csv_join(lines)


def csv_complete_prefix(data: bytes) -> bytes:
    """The complete lines of ``data`` (up to and including its last newline)."""
    return data[: data.rfind(b"\n") + 1]


# --- JSON ----------------------------------------------------------------------------------------


def numeric_leaves(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Paths of the numbers in a JSON document (and of numeric strings, as rocprof v1 writes numbers)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from numeric_leaves(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from numeric_leaves(v, (*path, i))
    elif (isinstance(obj, int | float) and not isinstance(obj, bool)) or (isinstance(obj, str) and obj.isdigit()):
        yield path


def json_with(doc: Any, path: tuple[Any, ...], literal: str) -> tuple[bytes, int]:
    """``doc`` serialised with the value at ``path`` written as the raw JSON text ``literal``, and its offset.

    ``literal`` need not be valid JSON (``NaN``, ``1e999``): it is what a damaged or foreign
    writer could put there.
    """
    copy = json.loads(json.dumps(doc))
    node = copy
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = SENTINEL
    head, _, tail = json.dumps(copy).partition(f'"{SENTINEL}"')
    return (head + literal + tail).encode(), len(head.encode())


def json_literal(value: str) -> str:
    """A value of ``VALUES`` as JSON text: numbers and NaN raw, text quoted."""
    return json.dumps(value) if value[:1].isalpha() and value != "NaN" else value


def well_formed(literal: str) -> bool:
    """Whether common JSON parsers read ``literal`` (any integer, a string); not NaN, infinities, deep nesting.

    A document with such a value in one event is still a JSON document: nothing but that event may go.
    """
    return literal.lstrip("-").isdigit() or literal.startswith('"')


def complete_values(data: bytes, depth: int) -> Iterator[tuple[int, str]]:
    """Where containers nested at most ``depth`` deep end: (offset just after, closers to end the document).

    A structural scan (strings and escapes skipped) over ``data``; a value closing at that depth
    is a whole event of an event list ``depth`` containers deep (2 for ``{"traceEvents": [...]}``).
    """
    stack: list[bytes] = []
    in_string = False
    skip = -1
    for m in re.finditer(rb'[\\"{}\[\]]', data):
        i = m.start()
        if i < skip:
            continue
        c = m.group(0)
        if in_string:
            if c == b"\\":
                skip = i + 2
            elif c == b'"':
                in_string = False
        elif c == b'"':
            in_string = True
        elif c in (b"{", b"["):
            stack.append(b"}" if c == b"{" else b"]")
        elif stack:
            stack.pop()
            if len(stack) <= depth:
                yield i + 1, b"".join(reversed(stack)).decode()


def json_prefix_reference(data: bytes, cut: int, depth: int) -> bytes | None:
    """The undamaged document's prefix a parser of ``data[:cut]`` should agree with.

    The bytes up to the last container that ends at most ``depth`` deep before the cut, closed:
    every event wholly before the cut, nothing of the one it damaged. None when no such point exists.
    """
    best: tuple[int, str] | None = None
    for end, closers in complete_values(data[:cut], depth):
        best = (end, closers)
    if best is None:
        return None
    return data[: best[0]] + best[1].encode()


def unclosed_nesting(n: int) -> bytes:
    """``n`` opening brackets that never close (the shape that once took a parser to 24 GB)."""
    return b"[" * n


def closed_nesting(n: int) -> str:
    """A valid JSON value ``n`` arrays deep."""
    return "[" * n + "]" * n


# --- special files -------------------------------------------------------------------------------


def make_fifo(path: Path) -> Path:
    """A named pipe at ``path`` (nothing writes to it: opening it for reading blocks)."""
    os.mkfifo(path)
    return path


def release_fifo(path: Path) -> None:
    """Unblock a reader stuck opening ``path``: open the write end without blocking, then close it (EOF)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return  # no reader is waiting
    os.close(fd)


def make_symlink_loop(path: Path) -> Path:
    """``path`` -> ``path.loop`` -> ``path``: resolving either fails with ELOOP."""
    other = path.with_name(path.name + ".loop")
    path.symlink_to(other.name)
    other.symlink_to(path.name)
    return path


# --- the contract --------------------------------------------------------------------------------

FIFO_WAIT_S = 5.0  # a parser that has not returned from a FIFO by then is blocked on it (it takes ms)


class Rows(Counter):
    """The rows of a parse as (kind, name, duration) counts ("iteration" for iterations), and its skipped counts."""

    skipped: Counter[str]


def contract_rows(parts: list[Any]) -> Rows:
    """Check chunks against the contract; their rows.

    Each chunk's non-empty tables conform to the ``kernels`` / ``iterations`` schemas, every time (and launch time)
    lies in 1990..2100, every end is at or after its start, and skipped counts are named counts.
    """
    rows = Rows()
    rows.skipped = Counter()
    for part in parts:
        assert all(isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in part.skipped.items()), part.skipped
        rows.skipped.update(part.skipped)
        for table in ("kernels", "iterations"):
            if not getattr(part, table).num_rows:
                continue  # empty tables are never published (ingest), so they need not conform
            batch = conform(table, getattr(part, table))
            start = batch.column("start_ns").to_numpy(zero_copy_only=False)
            end = batch.column("end_ns").to_numpy(zero_copy_only=False)
            times = [("start_ns", start), ("end_ns", end)]
            if table == "kernels":
                times += [(c, batch.column(c).drop_null().to_numpy()) for c in ("launch_start_ns", "launch_end_ns")]
            for col, ns in times:
                bad = ns[~in_epoch_range(ns)]
                assert not bad.size, f"{table}.{col} outside 1990..2100: {bad[:3].tolist()} ({bad.size} rows)"
            assert (end >= start).all(), f"{table}: end before start in {(end < start).sum()} rows"
            kinds = batch.column("kind").to_pylist() if table == "kernels" else ["iteration"] * batch.num_rows
            rows.update(zip(kinds, batch.column("name").to_pylist(), (end - start).tolist(), strict=True))
    return rows


@dataclass(frozen=True)
class Refused:
    """``identify`` or ``parse_any`` refused the file (``TraceFormatError``), naming it: what it said."""

    message: str


def refused(exc: TraceFormatError, path: Path) -> Refused:
    """A refusal names the file."""
    assert path.name in str(exc), f"the error does not name {path.name}: {exc}"
    return Refused(str(exc)[-300:])


def rows(got: Rows | Refused) -> Counter:
    """The rows of an outcome (none when refused)."""
    return got if isinstance(got, Counter) else Counter()


def parse_rows(path: Path, fmt: str | None = None, *, then: Callable[[Path], Any] | None = None) -> Rows | Refused:
    """``identify`` + ``parse_any`` on ``path`` under the contract: its rows, or ``Refused`` (TraceFormatError).

    ``fmt`` parses the file as that format when ``identify`` does not recognise it (references);
    ``then`` changes the file between recognition and parsing. Any other exception propagates: a bug.
    """
    try:
        tf = identify(path)
    except TraceFormatError as exc:
        if fmt is None:
            return refused(exc, path)
        st = path.stat()
        tf = TraceFile(path, fmt, "reference", st.st_mtime_ns, st.st_size)
    if then is not None:
        then(path)
    try:
        parts = list(parse_any(tf, context_for(tf, node="fuzz", source="fuzz", clock=CLOCK)))
    except TraceFormatError as exc:
        return refused(exc, path)
    return contract_rows(parts)


@contextlib.contextmanager
def case(what: str) -> Iterator[None]:
    """Name the damage in any exception other than a failed expectation (a parser bug) raised inside."""
    try:
        yield
    except AssertionError:
        raise
    except Exception as exc:
        raise AssertionError(f"{what}: {type(exc).__name__} escaped identify/parse_any: {exc}") from exc


def expect_refused(path: Path, what: str) -> None:
    """``path`` is no trace: ``identify`` (or, if it passes, ``parse_any``) refuses it by name."""
    assert isinstance(parse_rows(path), Refused), f"{what} at {path.name} was read as a trace"


def guarded(fifo: Path, fn: Callable[[], Any]) -> None:
    """Run ``fn`` (which touches ``fifo``) and fail, instead of hanging, if it blocks on the FIFO.

    A blocked open is released by opening the write end and closing it (the reader sees EOF).
    """
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(FIFO_WAIT_S)
    blocked = t.is_alive()
    while t.is_alive():
        release_fifo(fifo)
        t.join(0.2)
    if errors:
        raise errors[0]
    assert not blocked, f"blocked on the FIFO {fifo.name}"


class Cases:
    """The cases of one mutation: each runs to its end, every failure is kept with its traceback."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.failures: list[str] = []

    @contextlib.contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        try:
            with case(what):
                yield
        except Exception:
            self.failures.append(f"--- {self.label}: {what}\n{traceback.format_exc(limit=-8)}")
