"""The ``trace_dir`` source: a spool directory workloads write traces into, followed continuously.

The DaemonSet mounts a hostPath that profilers write to (rocprofv3 output directories, Kineto
traces, ONNX Runtime profiles). Every ``poll_interval_s`` the directory is listed (polling, not
inotify: it works the same on every filesystem a hostPath can be, NFS and overlayfs included, and
the cost is one ``stat`` per file):

- A rocprofv3 kernel or memory-copy CSV that is still being written is *tailed*: complete lines
  only, the partial last line held back until its newline arrives; each read is one exactly-once
  range of the file (``pipeline/ledger.py``).
- Any other recognised file (JSON, rocpd databases, gzip files, marker traces) is read once it is
  complete: its size and mtime unchanged for ``settle_s`` (a file renamed into place is already
  settled), within the source's limits (``max_file_bytes``, ``max_gzip_ratio``, ``max_json_depth``).
- A complete file that is not a trace is read no more: a rocprofv3 output AACO does not read
  (statistics, counters: ``traces.rocprofv3_outputs``) is named once (reason ``not_read``), anything
  else is quarantined and counted (``unrecognised``).
- A poll recognises a file's format from its first bytes (``detect.recognise``); the whole file
  is hashed (``detect.identify``, its content identity) only once it is read whole. A tailed file
  is never hashed: its identity is its inode and header line, stable while it grows.
- Files are tracked by device and inode; the identity (a digest of the first bytes) is checked
  against the checkpoint, so a restart resumes where the lake's last commit ended, a file
  replaced under the same inode is read from the start, and one that shrank (truncated, rewritten)
  is read again from the start. A rotated file is a new inode: read from the start; the old one,
  if it is still there under another name, keeps its place.
- One file is the failure boundary, tailed or whole: whatever reading it raises is caught
  (``ingest.file_failed``), the file quarantined and committed as done (``quarantined`` in its
  checkpoint: no restart reads it again unless it is rewritten), and the next file read.

What the spool reads at all is ``spool_policy``'s rule: no symbolic link out of the spool (by
default no link at all: ``follow_symlinks``), only files of an allowed owner (``allowed_uids``) not
writable by others, each opened without following a link and checked again on its descriptor. A
skipped file is counted once (``aaco_source_errors_total{reason="symlink"|"symlink_outside"|"owner_policy"}``),
named once in the log, never read and never copied to the quarantine.

Only tailed files are live data (``aaco_source_lag_seconds``): a whole file is read once complete,
however old, and its age says nothing about how far behind the agent is.

The rows carry their distributed job (docs/jobs.md, ``traces.job_stamp``): ``job`` names it; else
the environment of the process a trace names, if it still runs here and started before the trace;
else the trace's ``distributedInfo``. A job nobody named is named from its ranks as they arrive: a
later rank trace of the same job joins it (``jobs.JobRegistry``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt

from aaco.agent.sources.base import Source, SourceContext, SourceRecord
from aaco.agent.sources.ingest import Quarantine, file_failed, first_offsets, ingest_file, where
from aaco.agent.sources.jobs import JobRegistry, process_job
from aaco.agent.sources.limits_config import TraceLimitSettings
from aaco.agent.sources.spool_policy import Refusal, SpoolPolicy, SpoolRefusedError
from aaco.agent.sources.traces.context import BadRow
from aaco.agent.sources.traces.detect import identify, recognise
from aaco.agent.sources.traces.files import TraceFile, known_not_read
from aaco.agent.sources.traces.job_stamp import with_job
from aaco.agent.sources.traces.limits import GZIP_MAGIC
from aaco.agent.sources.traces.parse import ITERATIONS_FIRST, TAILABLE, kernels_model, with_model
from aaco.agent.sources.traces.rocprofv3_csv import Rocprofv3CsvDecoder, companions, load_companions
from aaco.agent.sources.traces.rocprofv3_outputs import NOT_READ
from aaco.contract.errors import TraceFormatError
from aaco.contract.jobs import JobFields, resolve

log = logging.getLogger("aaco.sources.trace_dir")
IDENTITY_BYTES = 4096


class TraceDirConfig(TraceLimitSettings):
    """Follow a spool directory of trace files: tail growing rocprofv3 CSVs, read others when complete."""

    type: Literal["trace_dir"] = "trace_dir"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    path: Path = Field(..., description="The spool directory (created if missing).")
    recursive: bool = Field(True, description="Follow subdirectories (rocprofv3 writes one per process).")
    poll_interval_s: PositiveFloat = Field(1.0, description="How often the directory is listed.")
    settle_s: PositiveFloat = Field(2.0, description="A non-tailed file is read once unchanged this long.")
    max_files: PositiveInt = Field(10_000, description="Files tracked at most (the newest are kept).")
    tail_block_bytes: PositiveInt = Field(8 << 20, description="Most bytes read from one tailed file per poll.")
    max_line_bytes: PositiveInt = Field(1 << 20, description="A CSV line longer than this is skipped as bad.")
    model: str | None = Field(None, description="Model name for the iterations (default: the file name).")
    job: str | None = Field(
        None,
        description="The distributed job the spooled traces are ranks of (default: the environment of the traced "
        "process, else the traces' own distributedInfo, docs/jobs.md); also their model unless model is set.",
    )
    follow_symlinks: bool = Field(
        False,
        description="Read a symbolic link to a file inside the spool (as its target). A link out of the spool is "
        "never read (counted as symlink_outside); false: every link is skipped (counted as symlink).",
    )
    allowed_uids: list[NonNegativeInt] | Literal["any"] | None = Field(
        None,
        description="Owners whose files are read (null: root, the spool directory's owner and the agent's own "
        "user; 'any': every owner). Other files, and files writable by every user, are skipped (owner_policy).",
    )


@dataclass
class _File:
    key: str
    path: Path
    listed: os.stat_result | None = None  # the listing's stat (device and inode the file must still have)
    companion_refused: str | None = None  # the reason a companion is refused by the spool's rule (counted)
    size: int = -1
    mtime: int = -1
    changed: float = 0.0  # monotonic time of the last size/mtime change
    format: str | None = None
    done: bool = False
    unrecognised: bool = False
    offset: int = 0  # next byte to read (tailed files)
    header: bytes | None = None
    decoder: Rocprofv3CsvDecoder | None = None
    companions_seen: tuple[tuple[str, int], ...] = ()
    skipping_line: bool = False  # inside a line longer than max_line_bytes
    records: int = 0
    events: int = 0  # events published from it (tailed files)
    model: str | None = None  # stamped on a tailed file's kernels (``parse.kernels_model``)
    job: JobFields = dataclasses.field(default_factory=JobFields)  # a tailed file's (config, its process)


def head_digest(fh: BinaryIO, n: int) -> str:
    """Digest of the first ``n`` bytes of an open file."""
    fh.seek(0)
    return hashlib.blake2b(fh.read(n), digest_size=12).hexdigest()


def _mtime(path: Path) -> int | None:
    """A file's mtime, None if it is gone (a companion removed between listing and stat)."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


class TraceDirSource(Source):
    """Watches one spool directory."""

    type = "trace_dir"

    def __init__(self, config: TraceDirConfig, name: str) -> None:
        super().__init__(name)
        self.config = config
        self._files: dict[str, _File] = {}
        self.limits = config.trace_limits()
        self._policy: SpoolPolicy | None = None
        self._jobs = JobRegistry()  # jobs named from their ranks as their traces arrive (``jobs``)
        self._refused: set[tuple[int, int, str]] = set()  # (device, inode, reason) counted: once per file

    def run(self, ctx: SourceContext) -> None:
        """Poll until stopped."""
        root = self.config.path
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            ctx.problem(
                self.name, os.fspath(root), "spool", f"cannot create the spool directory: {exc}", fatal=True, count=1
            )
            return
        quarantine = Quarantine(ctx.quarantine, follow_symlinks=False)
        log.info("trace_dir %s: following %s", self.name, root)
        while not ctx.stop.is_set():
            self.poll(ctx, quarantine)
            if ctx.sleep(self.config.poll_interval_s):
                break

    # -- one pass -----------------------------------------------------------------------------------

    def policy(self) -> SpoolPolicy | None:
        """The spool's read rule (``spool_policy``), made once the spool directory exists."""
        if self._policy is None:
            cfg = self.config
            try:
                self._policy = SpoolPolicy(cfg.path, follow_symlinks=cfg.follow_symlinks, allowed_uids=cfg.allowed_uids)
            except OSError:
                return None
            self._policy.warn_unprotected_hardlinks()
        return self._policy

    def _listing(self, ctx: SourceContext, policy: SpoolPolicy) -> list[tuple[Path, os.stat_result]]:
        out = []
        refused: set[tuple[int, int, str]] = set()
        for entry in policy.walk(self.config.recursive):
            if entry.refusal is None:
                out.append((entry.path, entry.st))
                continue
            key = (entry.st.st_dev, entry.st.st_ino, entry.refusal.reason)
            refused.add(key)
            if key not in self._refused:
                self._refuse(ctx, entry.path, entry.refusal)
        self._refused = refused  # what is no longer there is forgotten: the memory is the spool's listing
        out.sort(key=lambda x: x[1].st_mtime_ns)
        return out[-self.config.max_files :]

    def _refuse(self, ctx: SourceContext, path: Path, refusal: Refusal) -> None:
        ctx.problem(self.name, os.fspath(path), refusal.reason, refusal.message, fatal=False, count=1)

    def _open(self, ctx: SourceContext, f: _File) -> BinaryIO | None:
        """``f`` opened under the spool's rule; None (counted if refused) when it may not or cannot be read now."""
        policy = self.policy()
        if policy is None:
            return None
        try:
            return policy.open(f.path, f.listed)
        except SpoolRefusedError as exc:  # it changed since the listing: the next listing sees what it is now
            self._refuse(ctx, f.path, exc.refusal)
        except OSError:
            pass  # gone or replaced since the listing: the next poll sees what is there
        return None

    def poll(self, ctx: SourceContext, quarantine: Quarantine) -> None:
        """List the spool once and read what is new."""
        now = time.monotonic()
        seen: set[str] = set()
        batch: list[_File] = []
        policy = self.policy()
        if policy is None:
            return  # no spool directory (yet)
        for path, st in self._listing(ctx, policy):
            key = f"{self.name}:{st.st_dev}:{st.st_ino}"
            if key in seen:
                continue  # a followed link to a file also listed at its own place
            seen.add(key)
            f = self._files.get(key)
            if f is None:
                f = self._files[key] = self._resume(ctx, key, path, st)
            f.path, f.listed = path, st
            if st.st_size != f.size or st.st_mtime_ns != f.mtime:
                if st.st_size < f.offset:  # truncated or rewritten in place: everything again
                    self._restart(ctx, f, "truncated")
                f.size, f.mtime, f.changed = st.st_size, st.st_mtime_ns, now
            batch.append(f)
        batch.sort(key=lambda f: (f.format not in ITERATIONS_FIRST, f.mtime))
        for f in batch:
            if ctx.stop.is_set():
                return
            if not f.done and not f.unrecognised:
                try:
                    self._read(ctx, quarantine, f, now)
                except Exception as exc:  # the file boundary: one file never stops the spool
                    self._failed(ctx, quarantine, f, exc)
        for key in [k for k in self._files if k not in seen]:  # gone: stop tracking once committed
            f = self._files.pop(key)
            if ctx.ledger.pending(key) == 0:
                ctx.ledger.forget(key)

    def _resume(self, ctx: SourceContext, key: str, path: Path, st: os.stat_result) -> _File:
        f = _File(key, path, st)
        saved = ctx.ledger.committed(key)
        if saved is None:
            return f
        offset, meta = saved
        n = int(meta.get("head_bytes", 0))
        same = False
        if n > 0 and st.st_size >= n and (fh := self._open(ctx, f)) is not None:
            with fh:
                same = head_digest(fh, n) == meta.get("head")
        if not same:  # another file under a reused inode
            ctx.ledger.reset(key, {})
            return f
        if meta.get("quarantined") or meta.get("not_read"):  # failed, or not a trace, in an earlier run
            f.done = True
        elif "chunks" in meta:  # a whole file: ingest_file resumes it by chunk, or skips it when complete
            f.done = offset >= meta["chunks"] and meta.get("identity") is not None
        else:  # a tailed file: byte offsets
            f.offset = offset
        return f

    def _restart(self, ctx: SourceContext, f: _File, why: str) -> None:
        ctx.problem(self.name, os.fspath(f.path), why, f"{why}: reading it again from the start", fatal=False)
        ctx.ledger.reset(f.key, {})
        f.offset, f.header, f.decoder, f.done, f.format, f.skipping_line = 0, None, None, False, None, False
        f.events = 0

    def _failed(self, ctx: SourceContext, quarantine: Quarantine, f: _File, exc: Exception) -> None:
        """A file raised while being read: quarantined, reported, and committed as done at its offset."""
        resumed = f.offset > len(f.header or b"")  # an earlier run published part of it
        reason = file_failed(ctx, self.name, f.path, exc, quarantine, kept=f.events, resumed=resumed)
        f.done = True
        fh = self._open(ctx, f)
        if fh is None:
            return  # gone: nothing left to skip on the next run
        with fh:
            meta = self._meta(f, fh)
        ctx.ledger.register(f.key, f.offset, f.offset, {**meta, "quarantined": reason}).seal()

    def _meta(self, f: _File, fh: BinaryIO) -> dict[str, Any]:
        n = min(IDENTITY_BYTES, max(f.size, 0))
        return {"path": os.fspath(f.path), "head_bytes": n, "head": head_digest(fh, n)}

    def _read(self, ctx: SourceContext, quarantine: Quarantine, f: _File, now: float) -> None:
        if f.size <= 0:
            return
        settled = now - f.changed >= self.config.settle_s
        fh = self._open(ctx, f)  # checked again on its descriptor, just before the file is read
        if fh is None:
            return
        with fh:
            if f.format is None:
                try:
                    f.format, _ = recognise(f.path)  # the first bytes only: no hash of a file still growing
                except TraceFormatError as exc:
                    if settled:  # complete and still not a trace: named once, and not read again
                        f.unrecognised = True
                        self._not_a_trace(ctx, quarantine, f, self._meta(f, fh), exc.message)
                    return
            if not self._companions_allowed(ctx, f):
                return
            gz = fh.read(2) == GZIP_MAGIC
            if f.format in TAILABLE and not gz:
                self._tail(ctx, quarantine, f, fh)
            elif settled:
                self._whole(ctx, quarantine, f, self._meta(f, fh))

    def _not_a_trace(
        self, ctx: SourceContext, quarantine: Quarantine, f: _File, meta: dict[str, Any], why: str
    ) -> None:
        """A complete file that is not a trace, committed so that no restart looks at it again.

        A rocprofv3 output AACO does not read is named; anything else is bad input, quarantined and counted.
        """
        known = known_not_read(f.path)
        if known is not None:
            ctx.problem(self.name, os.fspath(f.path), NOT_READ, known.message, fatal=False)
            ctx.ledger.register(f.key, 0, 0, {**meta, "not_read": True}).seal()
            return
        quarantine.file(f.path)
        ctx.problem(self.name, os.fspath(f.path), "unrecognised", why, fatal=False, count=1)
        ctx.ledger.register(f.key, 0, 0, {**meta, "quarantined": True}).seal()

    def _companions_allowed(self, ctx: SourceContext, f: _File) -> bool:
        """Whether the files read beside ``f`` (a rocprofv3 CSV's companions) pass the spool's rule; else counted."""
        policy = self.policy()
        for path in companions(f.path).values():
            entry = policy.entry(path) if policy is not None else None
            if entry is not None and entry.refusal is not None:
                if f.companion_refused != entry.refusal.reason:  # counted once per file and reason
                    f.companion_refused = entry.refusal.reason
                    why = f"not read: its companion {path.name} is refused ({entry.refusal.message})"
                    self._refuse(ctx, f.path, Refusal(entry.refusal.reason, why))
                return False
        f.companion_refused = None
        return True

    def _whole(self, ctx: SourceContext, quarantine: Quarantine, f: _File, meta: dict[str, Any]) -> None:
        # identified (hashed) once, now that it is read whole; a TraceFormatError here (it changed since) fails it
        tf = dataclasses.replace(identify(f.path), limits=self.limits)
        tctx = self.config.trace_context(tf, node=ctx.node, source=self.name, model=self.config.model, **self._job())
        ingest_file(
            ctx,
            self.name,
            tf,
            tctx,
            quarantine,
            key=f.key,
            max_bytes=self.config.max_file_bytes,
            live=False,  # a complete file, perhaps days old: not live data, no lag
            meta=meta,
        )
        f.done = True

    # -- tailing ------------------------------------------------------------------------------------

    def _decoder(self, ctx: SourceContext, f: _File) -> Rocprofv3CsvDecoder | None:
        seen = tuple(sorted((k, m) for k, p in companions(f.path).items() if (m := _mtime(p)) is not None))
        if f.decoder is not None and seen == f.companions_seen:
            return f.decoder
        comp = load_companions(f.path, self.config.max_file_bytes, self.limits)
        # A growing file's content identity changes as it grows (and hashing it at every poll would
        # cost the whole file each time); its capture identity must not, across polls and restarts:
        # the inode and the header line name it.
        stable = hashlib.blake2b(f"{f.key}".encode() + (f.header or b""), digest_size=12).hexdigest()
        tf = TraceFile(f.path, f.format or "", stable, f.mtime, f.size, self.limits)
        tctx = self.config.trace_context(tf, node=ctx.node, source=self.name, model=self.config.model, pid=comp.pid)
        f.decoder = Rocprofv3CsvDecoder(f.header or b"", tctx, comp.agents, comp.launches)
        f.companions_seen = seen
        f.model = kernels_model(tf, tctx)  # as a replay of the same file names it
        env = process_job(comp.pid, started_before_ns=f.mtime) if comp.pid is not None else None
        f.job = resolve(JobFields(job=self.config.job), env)
        if f.job.job is not None and not self.config.model:
            f.model = f.job.job
        return f.decoder

    def _job(self) -> dict[str, Any]:
        """What the spool's trace contexts know of the job (``traces.job_stamp``)."""
        cfg = self.config
        job = JobFields(job=cfg.job)
        return {"job": job, "job_environ": True, "jobs": self._jobs, "model_configured": bool(cfg.model)}

    def _tail(self, ctx: SourceContext, quarantine: Quarantine, f: _File, fh: BinaryIO) -> None:
        lines = self._complete_lines(ctx, quarantine, f, fh)
        if lines is not None:
            self._publish_lines(ctx, quarantine, f, fh, *lines)

    def _complete_lines(
        self, ctx: SourceContext, quarantine: Quarantine, f: _File, fh: BinaryIO
    ) -> tuple[bytes, int] | None:
        """The complete lines written past ``f.offset`` and where they start; None while there are none."""
        cfg = self.config
        if f.header is None:
            fh.seek(0)
            first = fh.readline(cfg.max_line_bytes)
            if not first.endswith(b"\n"):
                return None  # the header is not complete yet
            f.header = first
            f.offset = max(f.offset, len(first))
        fh.seek(f.offset)
        data = fh.read(cfg.tail_block_bytes)
        if not data:
            return None
        start = f.offset
        if f.skipping_line:  # the rest of an over-long line: drop it up to its newline
            nl = data.find(b"\n")
            if nl < 0:
                f.offset += len(data)
                return None
            data, start, f.skipping_line = data[nl + 1 :], start + nl + 1, False
            f.offset = start
        cut = data.rfind(b"\n") + 1
        if cut == 0 and len(data) >= cfg.max_line_bytes:  # a line with no end in sight: skip it, counted
            f.skipping_line, f.offset = True, start + len(data)
            quarantine.rows(f.path, [BadRow(start, data[:4096], "line_too_long")])
            message = f"a line longer than {cfg.max_line_bytes} bytes at offset {start} was skipped"
            ctx.problem(self.name, os.fspath(f.path), "line_too_long", message, fatal=False, count=1)
        return (data[:cut], start) if cut else None  # a partial last line waits for its newline

    def _publish_lines(
        self, ctx: SourceContext, quarantine: Quarantine, f: _File, fh: BinaryIO, chunk: bytes, start: int
    ) -> None:
        """Decode and publish complete lines as one ledger range, then report what they skipped."""
        decoder = self._decoder(ctx, f)  # what it raises is a failed file (``_failed``)
        assert decoder is not None
        result = decoder.decode(chunk, start)
        r = ctx.ledger.register(f.key, start, start + len(chunk), self._meta(f, fh))
        try:
            if result.table.num_rows:
                table = result.table if f.model is None else with_model(result.table, f.model)
                table = with_job(table, f.job) if f.job.known() else table
                ctx.publish(self.name, "kernels", table, durable=True, live=True, range_=r)
        finally:
            r.seal()  # even if publishing raised: an open range would hold the file's checkpoint back for good
        f.offset = start + len(chunk)
        f.events += result.table.num_rows
        if result.bad_rows:
            quarantine.rows(f.path, result.bad_rows)
        first_at = first_offsets(result.bad_rows, {})
        for reason, count in result.skipped.items():
            at = where(first_at.get(reason))
            message = f"skipped {count} bad row(s): {reason}" + (f", the first{at}" if at else "")
            ctx.problem(self.name, os.fspath(f.path), reason, message, fatal=False, count=count)
        if f.records == 0:
            counts = {"kernels": result.table.num_rows}
            clock = decoder.ctx.clock.to_dict()
            record = SourceRecord(
                self.name, os.fspath(f.path), f.format or "", counts, clock, dict(result.skipped), decoder.devices
            )
            ctx.record(record)
        f.records += 1


def create(config: TraceDirConfig, name: str) -> TraceDirSource:
    """Factory used by the source registry."""
    return TraceDirSource(config, name)
