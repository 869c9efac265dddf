"""Reading one trace file into the pipeline, exactly once: shared by ``replay``, ``trace_dir`` and ``capture``.

A whole file is one ledger range [0, size) (``pipeline/ledger.py``): every chunk ``parse_any`` yields
is published as a piece of it, so the lake commits the file's offset only once every row is stored,
and a file already committed is skipped on the next run. Bad rows are counted by reason
(``aaco_source_errors_total``), logged once per file and reason, and copied to the quarantine
(``DIR/quarantine/<source>/``, bounded, 0640 or tighter): as lines where the parser gives them, else the whole
file. Each problem says where: the byte offset of the first bad row of its reason (in the
decompressed content of a gzip file). A file that is damaged (``INCOMPLETE``: truncated JSON, a
damaged gzip stream, JSON nested past ``max_json_depth``, invalid JSON between good events) keeps the
events read around the damage: its range is sealed as read, the whole file is quarantined, and it is
reported as incomplete.

The file is the failure boundary: whatever one file raises (``TraceFormatError``, or a parser bug:
``OverflowError``, ``KeyError``, ``MemoryError``, ...) is caught here (``file_failed``): the file is
quarantined, committed as done (so no restart reads it again; the rows published before the failure
are kept), counted in ``aaco_source_errors_total{source,reason}`` under ``failure_reason``, named once in
the log (the traceback at debug level), and the source goes on with its next file.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aaco.agent.sources.base import SourceContext, SourceRecord
from aaco.agent.sources.traces.context import BadRow, TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.limits import GZIP_MAGIC, open_regular
from aaco.agent.sources.traces.parse import parse_any
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.contract.clock import ClockOffset
from aaco.contract.errors import TraceFormatError
from aaco.contract.files import make_dirs, open_private
from aaco.contract.ledger import Ledger
from aaco.contract.stats import TRACE_EVENTS_UNRECOGNISED

log = logging.getLogger("aaco.sources.ingest")

QUARANTINE_FILE_BYTES = 1 << 20  # bad rows kept per input file
QUARANTINE_TOTAL_BYTES = 64 << 20  # per source
QUARANTINE_COPY_BYTES = 16 << 20  # whole unreadable files copied up to this size
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
MAX_CATEGORIES = 8  # categories named in the warning about unrecognised events
MESSAGE_CHARS = 300  # an exception's text kept in a problem (a parser's exception can quote a whole line)
# Skipped reasons that mean the file itself is damaged (not a bad value in a good file): the events
# around the damage are kept, the file is incomplete. Reason -> what the problem says.
INCOMPLETE = {
    "truncated_json": "truncated JSON{at}: kept the events before the cut",
    "damaged_gzip": "damaged gzip stream{at}: kept what was decompressed before the damage",
    "json_too_deep": "JSON nested deeper than max_json_depth{at}: kept the events before it",
    "invalid_json": "invalid JSON{at} ({count} place(s)): kept the events around it",
}
# Reasons a file was not read completely, which ``aaco replay`` reports as errors (exit 2): it could
# not be read at all, failed part-way, or is damaged so that all after the damage is lost. An invalid
# event between good ones (invalid_json) loses that event only, like a bad CSV row: a warning.
DAMAGED = frozenset({"unreadable", "parser_error", "io_error", "out_of_memory", *INCOMPLETE}) - {"invalid_json"}


class Quarantine:
    """Bad input kept for a human to look at, bounded per file and in total; thread-safe.

    Its files are 0640 or tighter, a copy never looser than its source (a 0600 file stays 0600), its
    directories 0750 (``pipeline/files.py``). ``follow_symlinks`` False (the spool): a file that is a
    symbolic link when it is copied is not copied.
    """

    def __init__(self, root: Path | None, *, follow_symlinks: bool = True) -> None:
        self.root = root
        self.follow_symlinks = follow_symlinks
        self._used = 0
        self._per_file: Counter[str] = Counter()
        self._lock = threading.Lock()

    def _room(self, name: str, n: int) -> int:
        with self._lock:
            room = min(n, QUARANTINE_FILE_BYTES - self._per_file[name], QUARANTINE_TOTAL_BYTES - self._used)
            room = max(0, room)
            self._per_file[name] += room
            self._used += room
            return room

    def rows(self, subject: Path, bad: list[BadRow]) -> None:
        """Append bad rows as ``offset<TAB>reason<TAB>raw`` lines to ``<file name>.bad``."""
        if self.root is None or not bad:
            return
        text = b"".join(
            f"{b.offset}\t{b.reason}\t".encode() + b.line[:4096].rstrip(b"\r\n").replace(b"\n", b"\\n") + b"\n"
            for b in bad
        )
        room = self._room(subject.name, len(text))
        if room == 0:
            return
        try:
            make_dirs(self.root)
            with os.fdopen(open_private(self.root / f"{subject.name}.bad", os.O_WRONLY | os.O_APPEND), "ab") as fh:
                fh.write(text[:room])
        except OSError as exc:
            log.warning("quarantine: cannot write under %s: %s", self.root, exc)

    def file(self, path: Path) -> None:
        """Copy a file that could not be (fully) read: from the descriptor that was checked, mode no looser."""
        if self.root is None:
            return
        flags = os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC | (0 if self.follow_symlinks else _NOFOLLOW)
        try:
            src = os.open(path, flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                log.warning("quarantine: %s not copied: it is a symbolic link", path)
            return
        with os.fdopen(src, "rb") as fh:
            st = os.fstat(src)
            size = st.st_size
            if not stat.S_ISREG(st.st_mode) or size > QUARANTINE_COPY_BYTES:
                return
            if self._room(path.name + "#file", size) < size:
                return
            mode = 0o600 | (stat.S_IMODE(st.st_mode) & 0o040)  # the agent's copy; group may read if it may the source
            try:
                make_dirs(self.root)
                dest = self.root / path.name
                with os.fdopen(open_private(dest, os.O_WRONLY | os.O_TRUNC, mode), "wb") as out:
                    out.write(fh.read(size))  # what it held when checked (it is at most QUARANTINE_COPY_BYTES)
                os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
            except OSError as exc:
                log.warning("quarantine: cannot copy %s: %s", path, exc)


@dataclass
class IngestResult:
    """What reading one file did."""

    kernels: int = 0
    iterations: int = 0
    skipped: int = 0
    complete: bool = True  # False when the file broke part-way (its readable part is kept)
    already: bool = False  # skipped: the lake already holds this file


def ingest_file(
    ctx: SourceContext,
    source: str,
    tf: TraceFile,
    tctx: TraceContext,
    quarantine: Quarantine,
    *,
    key: str | None,
    max_bytes: int,
    live: bool = False,
    meta: dict | None = None,
    skip_committed: bool = True,
    read: Sequence[ParsedTrace] | None = None,
) -> IngestResult:
    """Publish every event of a recognised file under checkpoint ``key`` (None: no checkpoint).

    Each chunk ``parse_any`` yields is one ledger range [i, i+1) in chunk units: the lake commits
    a big file as it goes (memory stays bounded) and a restart resumes after the last committed
    chunk — ``parse_any`` cuts a file into the same chunks every time. The file's checkpoint
    records its content identity and, once read, its chunk count, so a file the lake already
    holds is skipped (unless not ``skip_committed``: read it all again). ``read``: its chunks, read
    ahead (``job_scan``).
    """
    subject = os.fspath(tf.path)
    info = dict(meta if meta is not None else {"path": subject})
    info["identity"] = tf.identity
    first = _resume_from(ctx.ledger, key, tf.identity, skip_committed) if key is not None else 0
    if first is None:
        return IngestResult(already=True)
    out = IngestResult()
    seen = _Seen(tf.format)
    chunks = 0  # chunks the file gave so far (the ones skipped on resume included)
    r = None
    try:
        for chunk, parsed in enumerate(parse_any(tf, tctx, max_bytes=max_bytes, read=read)):
            chunks = chunk + 1
            if chunk < first:
                continue  # already in the lake
            r = ctx.ledger.register(key, chunk, chunk + 1, info) if key else None
            _publish(ctx, source, parsed, r, live)
            if r is not None:
                r.seal()
            out.kernels += parsed.kernels.num_rows
            out.iterations += parsed.iterations.num_rows
            seen.add(parsed)
            quarantine.rows(tf.path, parsed.bad_rows)
    except Exception as exc:  # the file boundary: nothing one file raises stops the source
        out.complete = False
        if r is not None:
            r.seal()  # what this chunk published stays; the chunk is not read again
        file_failed(ctx, source, tf.path, exc, quarantine, kept=out.kernels + out.iterations, resumed=first > 0)
    if key is not None:  # the file is read (whole, or up to its damage): record how many chunks it has
        done = ctx.ledger.register(key, chunks, chunks, {**info, "chunks": chunks})
        done.seal()
    _report_skipped(ctx, source, tf.path, seen, out, quarantine)
    report_unrecognised(ctx, source, os.fspath(tf.path), seen.fmt, seen.unrecognised, out.kernels)
    counts = {"kernels": out.kernels, "iterations": out.iterations}
    clock = seen.clock.to_dict() if seen.clock else None
    ctx.record(SourceRecord(source, subject, seen.fmt, counts, clock, dict(seen.skipped), seen.devices))
    return out


def _resume_from(ledger: Ledger, key: str, identity: str, skip_committed: bool) -> int | None:
    """The first chunk to publish under ``key``; None when the lake holds, or is receiving, the whole file."""
    if skip_committed and ledger.pending(key):
        return None  # read in this run (a restarted source), rows on their way to the lake
    saved = ledger.committed(key)
    if saved is not None and skip_committed and saved[1].get("identity") == identity:
        chunks = saved[1].get("chunks")
        return None if chunks is not None and saved[0] >= chunks else saved[0]  # else resume after the lake's chunks
    ledger.reset(key, {})
    return 0


class _Seen:
    """What the chunks of one file said: skipped counts, clock, format, devices, where bad rows were."""

    def __init__(self, fmt: str) -> None:
        self.fmt = fmt
        self.skipped: Counter[str] = Counter()
        self.clock: ClockOffset | None = None
        self.devices: dict[str, dict] = {}
        self.shown = False  # the parser listed bad rows (their lines are in the quarantine)
        self.first_at: dict[str, int] = {}  # the smallest byte offset of a bad row, by reason
        self.unrecognised: Counter[str] = Counter()  # GPU-looking events of unknown categories

    def add(self, parsed: ParsedTrace) -> None:
        """Take in one chunk."""
        self.skipped += parsed.skipped
        self.clock = self.clock or parsed.clock
        self.fmt = parsed.format
        self.devices.update(parsed.devices)
        self.unrecognised += parsed.unrecognised
        self.shown = self.shown or bool(parsed.bad_rows)
        first_offsets(parsed.bad_rows, self.first_at)


def _report_skipped(
    ctx: SourceContext, source: str, path: Path, seen: _Seen, out: IngestResult, quarantine: Quarantine
) -> None:
    """Quarantine a damaged file, mark it incomplete, and report each kind of skipped row once."""
    damaged = INCOMPLETE.keys() & seen.skipped.keys()
    if out.complete and (damaged or (seen.skipped and not seen.shown)):
        quarantine.file(path)  # damaged, or bad events the parser cannot show as lines: keep the file
    out.complete = out.complete and not damaged
    gz = bool(seen.first_at) and _gzipped(path)
    for reason, count in seen.skipped.items():
        at = where(seen.first_at.get(reason), gz)
        if reason in INCOMPLETE:
            message = INCOMPLETE[reason].format(at=at, count=count)
        else:
            message = f"skipped {count} bad row(s)/event(s): {reason}" + (f", the first{at}" if at else "")
        ctx.problem(source, os.fspath(path), reason, message, fatal=False, count=count)
    out.skipped = sum(seen.skipped.values())


def report_unrecognised(
    ctx: SourceContext, source: str, subject: str, fmt: str, counts: Counter[str], kernels: int
) -> None:
    """GPU-looking events of categories the reader does not know: counted, and named once for the file.

    Counted in ``aaco_trace_events_unrecognised_total{source,format}``; the warning names the
    categories and their counts, and says so when they were all the GPU work the file held.
    """
    total = sum(counts.values())
    if not total:
        return
    ctx.stats.inc(TRACE_EVENTS_UNRECOGNISED, total, source=source, format=fmt)
    what = f"{total} event(s) that look like GPU work are of categories the {fmt} reader does not know"
    seen = ", ".join(f"{cat} ({n})" for cat, n in counts.most_common(MAX_CATEGORIES))
    if len(counts) > MAX_CATEGORIES:
        seen += f" and {len(counts) - MAX_CATEGORIES} more"
    lead = "no GPU work read: " if kernels == 0 else "not read: "
    ctx.problem(source, subject, "unrecognised_events", f"{lead}{what}: {seen}", fatal=False)


def first_offsets(bad: list[BadRow], into: dict[str, int]) -> dict[str, int]:
    """Fold the smallest byte offset of each reason among ``bad`` into ``into``; returns it."""
    for b in bad:
        if b.reason not in into or b.offset < into[b.reason]:
            into[b.reason] = b.offset
    return into


def where(offset: int | None, decompressed: bool = False) -> str:
    """`` at byte N`` (`` of the decompressed content`` for a gzip file) for a problem's message; empty if unknown."""
    if offset is None:
        return ""
    return f" at byte {offset}" + (" of the decompressed content" if decompressed else "")


def _gzipped(path: Path) -> bool:
    try:
        with open_regular(path) as fh:
            return fh.read(2) == GZIP_MAGIC
    except (OSError, TraceFormatError):
        return False


def failure_reason(exc: BaseException) -> str:
    """The reason a failed file is counted under, by what failed."""
    if isinstance(exc, TraceFormatError):
        return "unreadable"
    if isinstance(exc, MemoryError):
        return "out_of_memory"
    if isinstance(exc, OSError):
        return "io_error"
    return "parser_error"


def file_failed(
    ctx: SourceContext,
    source: str,
    path: Path,
    exc: BaseException,
    quarantine: Quarantine,
    *,
    kept: int = 0,
    resumed: bool = False,
) -> str:
    """Report a file that raised: copied to the quarantine, counted, named once in the log; returns the reason.

    ``kept``: events published from it before the failure; ``resumed``: earlier runs published some.
    The traceback goes to the debug log: the warning names the file and the exception only.
    """
    quarantine.file(path)
    reason = failure_reason(exc)
    if isinstance(exc, TraceFormatError):
        detail = exc.message
    else:
        text = str(exc)
        text = text if len(text) <= MESSAGE_CHARS else text[:MESSAGE_CHARS] + "..."
        detail = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    fatal = kept == 0 and not resumed
    what = "nothing could be read" if fatal else f"kept the {kept} event(s) before it"
    log.debug("%s: %s failed", source, path, exc_info=exc)
    ctx.problem(source, os.fspath(path), reason, f"{detail} ({what})", fatal=fatal, count=1)
    return reason


def publish_parsed(ctx: SourceContext, source: str, subject: str, parsed: ParsedTrace, live: bool = False) -> None:
    """Publish a parsed capture that is not a file of the spool (the ORT workload's own profile)."""
    _publish(ctx, source, parsed, None, live)
    for reason, count in parsed.skipped.items():
        ctx.problem(source, subject, reason, f"skipped {count} event(s): {reason}", fatal=False, count=count)
    ctx.record(
        SourceRecord(
            source,
            subject,
            parsed.format,
            {"kernels": parsed.kernels.num_rows, "iterations": parsed.iterations.num_rows},
            parsed.clock.to_dict(),
            dict(parsed.skipped),
        )
    )


def _publish(ctx: SourceContext, source: str, parsed: ParsedTrace, r: object, live: bool) -> None:
    """Iterations first (so the correlator knows them before their kernels), then kernels."""
    if parsed.iterations.num_rows:
        ctx.publish(source, "iterations", parsed.iterations, durable=True, live=live, range_=r)  # type: ignore[arg-type]
    if parsed.kernels.num_rows:
        ctx.publish(source, "kernels", parsed.kernels, durable=True, live=live, range_=r)  # type: ignore[arg-type]
