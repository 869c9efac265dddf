"""The local lake (docs/architecture.md, The local lake): Parquet datasets per event kind, analysis.json, checkpoints/.

``DIR/<kind>/date=YYYY-MM-DD/node=<node>/part-<seq>.parquet``, hive-partitioned, every part of one
kind with the full schema of that kind (``schemas.conform``) so the dataset reads as one table with
pyarrow.dataset, pandas or DuckDB. ``date`` and ``node`` live only in the path (as hive partitions
do): a ``node`` column inside the files would clash with the partition key when a reader infers it
(a node named ``7`` reads as an integer key) and would be replaced by it anyway. The node is
URI-encoded in the path (``rack/7`` -> ``node=rack%2F7``), which hive readers decode.

Rows are buffered per partition and written when a buffer holds ``flush_rows`` rows, when
``flush_interval_s`` passed, or on flush/shutdown. A part is written to a
hidden temporary file and then hard-linked to its final name, which fails rather than overwrite if
the name exists: the sequence number then moves on. Readers never see a half-written part; the
temporary names start with ``.`` which pyarrow.dataset skips.

Exactly once, for durable inputs (trace files, see ``contract/ledger.py``). Every flush is one
*commit*, write-ahead:

1. the parts are written under temporary names;
2. an intent ``checkpoints/commit-<seq>.json`` names them and the input offsets they complete;
3. ``checkpoints/offsets.json`` takes the new offsets;
4. the parts are linked into place and the intent is removed.

A failure up to step 3 (a full disk) removes the temporary parts and the intent; the rows wait for
the next attempt. No part is sealed before its offsets are on disk: none is stored twice.

A commit only takes the rows of ranges whose offset it advances past (all earlier ranges of the
same input complete too): rows still waiting on a piece (a kernel the correlator holds) wait for a
later commit. On start, an intent left by a crash is finished (its temporary parts still exist:
they are linked) and its offsets folded in; stray temporary files are removed. So after a
``kill -9`` anywhere, the offsets say exactly what the visible parts hold. One agent per lake: a
lock on ``DIR/.lock`` refuses a second one.

Every file the lake writes (parts, checkpoints, ``analysis.json``, ``sources.json``, the lock) is
0640 or tighter and every directory it makes 0750 (``contract/files.py``): a part is created
0640 before pyarrow writes into it and checked again before it is linked into place.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from aaco.contract import versions
from aaco.contract.errors import AacoError
from aaco.contract.files import make_dirs, open_private, tighten, write_bytes_atomic
from aaco.contract.ledger import Ledger, Range
from aaco.contract.schemas import SCHEMAS, TIME_COLUMN, EventBatch
from aaco.contract.snapshot import AnalysisSnapshot
from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, EVENTS_RECEIVED, EXPORT_ERRORS, Stats
from aaco.contract.stores import StoreOptions, open_store
from aaco.exporters.base import Exporter, ExportResult
from aaco.exporters.context import ExporterContext
from aaco.exporters.lake_config import LakeConfig
from aaco.exporters.lake_ship import Shipper

log = logging.getLogger("aaco.exporters.lake")
_PART = re.compile(r"^part-(\d+)\.parquet$")
_INTENT = re.compile(r"^commit-(\d+)\.json$")
OFFSETS = "offsets.json"
# scheme:/ or scheme:// (a Path made of "s3://b/p" keeps one slash): a URL, never a relative directory name


NS_PER_DAY = 86_400 * 10**9


def partitions(b: pa.RecordBatch, time_column: str) -> list[tuple[str, str, pa.RecordBatch]]:
    """The rows of ``b`` per (UTC date, node), vectorised: integer days, dictionary-coded nodes.

    Almost every batch falls in one date and one node; then nothing is filtered or copied.
    """
    days = np.floor_divide(b.column(time_column).to_numpy(), NS_PER_DAY)
    nodes = (
        pc.dictionary_encode(b.column("node")).combine_chunks()
        if isinstance(b.column("node"), pa.ChunkedArray)
        else pc.dictionary_encode(b.column("node"))
    )
    codes = nodes.indices.to_numpy(zero_copy_only=False)
    names = nodes.dictionary.to_pylist()
    first_day, first_code = days[0], codes[0]
    if (days == first_day).all() and (codes == first_code).all():
        return [(_date(int(first_day)), names[first_code], b)]
    keys = days * len(names) + codes
    out = []
    for key in np.unique(keys):
        day, code = divmod(int(key), len(names))
        out.append((_date(day), names[code], b.filter(pa.array(keys == key))))
    return out


def _date(day: int) -> str:
    return (datetime.date(1970, 1, 1) + datetime.timedelta(days=day)).isoformat()


def parquet_options(schema: pa.Schema) -> dict[str, Any]:
    """Per-column Parquet encodings for a part of ``schema``: delta packing for times and ids, dictionaries elsewhere.

    Times (int64 ``*_ns``) and correlation ids are nearly all distinct and increasing: the dictionary
    the writer tries first is wasted work (it gives up past its page limit, then writes them plain),
    while ``DELTA_BINARY_PACKED`` (Parquet 2 encoding, read by pyarrow, DuckDB, Spark) stores their
    small differences. On 1M rocprofv3 kernels it cut the write time by about 40 % and the files by
    half or more. Names, labels and small integers keep their dictionaries.
    """
    delta = [
        f.name for f in schema if pa.types.is_int64(f.type) and (f.name.endswith("_ns") or f.name == "correlation_id")
    ]
    return {
        "use_dictionary": [f.name for f in schema if f.name not in delta],
        "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED"),
    }


# orjson, not json: analysis.json is written every few seconds and the standard library's indenting
# encoder is pure Python (0.65 ms for 16 KB against 0.02 ms). Numpy numbers are written as numbers,
# NaN and infinities as null (json wrote NaN, which is not JSON), anything else unknown as its str().
_JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


def dump_json(doc: Any) -> bytes:
    """``doc`` as indented JSON (UTF-8, a newline at the end)."""
    try:
        return orjson.dumps(doc, default=str, option=_JSON_OPTIONS)
    except orjson.JSONEncodeError:  # what orjson refuses (integers beyond 64 bits, ...) the standard library writes
        return (json.dumps(doc, indent=2, default=str) + "\n").encode()


def write_json_atomic(path: Path, doc: Any) -> None:
    """Write JSON to ``path`` via a temporary file and rename (readers see old or new, never half)."""
    write_bytes_atomic(path, dump_json(doc))


@dataclass
class _Entry:
    """One exported batch: its rows split by partition, and the ranges of input they came from."""

    kind: str
    parts: list[tuple[str, str, pa.RecordBatch]]  # (date, node, rows)
    ranges: tuple[Range, ...]
    rows: int


class LakeExporter(Exporter):
    """Buffers event batches and writes them in commits of Parquet parts; analysis.json on snapshots."""

    name = "lake"
    durable = True

    def __init__(
        self,
        config: LakeConfig,
        stats: Stats,
        records: Callable[[], list[dict[str, Any]]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        ledger: Ledger | None = None,
        node: str = "",
        versions: Mapping[str, object] | None = None,
    ) -> None:
        self.config = config
        self.root = Path(config.path)
        self.ledger = ledger if ledger is not None else Ledger()
        self._stats = stats
        self._records = records
        self._clock = clock
        self._lock = threading.RLock()
        self._entries: list[_Entry] = []
        self._partition_rows: dict[tuple[str, str, str], int] = {}
        self._seq: dict[Path, int] = {}
        self._commit_seq = 0
        self._last_flush = clock()
        self._lock_file: Any = None
        self._sources_written: bytes | None = None
        self._closed = False
        self._started = False
        self._node = node
        self._versions = versions
        self.shipper: Shipper | None = None

    @classmethod
    def from_config(cls, config: LakeConfig, ctx: ExporterContext) -> LakeExporter | None:
        """The lake ``config`` describes (keeping ``ctx.records`` and marking ``ctx.ledger``); None when disabled."""
        if not config.enabled:
            return None
        return cls(config, ctx.stats, ctx.records, ledger=ctx.ledger, node=ctx.node, versions=ctx.versions)

    @property
    def checkpoints(self) -> Path:
        """Where commit intents and input offsets live."""
        return self.root / "checkpoints"

    # -- start and recovery -------------------------------------------------------------------------

    def start(self) -> None:
        """Create the lake, take its lock, finish any commit a crash interrupted, load the offsets."""
        try:
            for sub in (*SCHEMAS, versions.KIND, "checkpoints"):
                make_dirs(self.root / sub)
            self._lock_file = os.fdopen(open_private(self.root / ".lock", os.O_RDWR), "r+")
        except OSError as exc:  # a file in the way, a read-only mount, a place no directory can be made (/proc)
            raise AacoError(
                f"cannot write the lake here: {exc.strerror or exc}"
                + (f" ({exc.filename})" if exc.filename and Path(exc.filename) != self.root else ""),
                subject=self.root,
                hint="choose a writable directory with --out, --lake or exporters.lake.path",
            ) from None
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            self._lock_file.close()
            raise AacoError(
                "the lake is in use by another agent",
                subject=self.root,
                hint="give each agent its own --lake / exporters.lake.path",
            ) from exc
        self._recover()
        if self.config.remote is not None:
            u = self.config.upload
            # One attempt per request: the shipper retries with its own backoff, and a shutdown is not held up
            # by the SDK retrying a request to a store that stalls.
            options = StoreOptions(u.endpoint_url, u.region, u.connect_timeout_s, u.request_timeout_s, max_attempts=1)
            store = open_store(self.config.remote, options)
            self.shipper = Shipper(self.root, store, u, self._stats, (*SCHEMAS, versions.KIND))
            self.shipper.start()
        if self._versions is not None and self._node:
            self._write_versions()
        self._started = True

    def _recover(self) -> None:
        offsets_path = self.checkpoints / OFFSETS
        state: dict[str, Any] = {"commit": 0, "inputs": {}}
        if offsets_path.exists():
            try:
                state = json.loads(offsets_path.read_text())
            except (OSError, ValueError) as exc:
                raise AacoError(
                    f"unreadable checkpoint: {exc}",
                    subject=offsets_path,
                    hint="move it aside to re-ingest durable inputs from the start",
                ) from exc
        referenced: set[Path] = set()
        intents = sorted((int(m.group(1)), f) for f in self.checkpoints.iterdir() if (m := _INTENT.match(f.name)))
        for seq, path in intents:
            intent = json.loads(path.read_text())
            for tmp, final in intent["parts"]:
                tmp_p, final_p = self.root / tmp, self.root / final
                if not final_p.exists() and tmp_p.exists():
                    os.link(tmp_p, final_p)
                referenced.add(tmp_p)
                tmp_p.unlink(missing_ok=True)
            state["inputs"].update(intent["offsets"])
            state["commit"] = max(int(state.get("commit", 0)), seq)
            write_json_atomic(offsets_path, state)
            path.unlink()
            log.warning("lake: finished commit %d that an earlier run left incomplete", seq)
        for stray in self.root.rglob(".part-*.tmp"):
            stray.unlink(missing_ok=True)
        self._commit_seq = int(state.get("commit", 0))
        self.ledger.load(state.get("inputs", {}))

    # -- buffering ----------------------------------------------------------------------------------

    def export(self, batch: EventBatch) -> ExportResult:
        """Buffer a batch under its partitions; commit when a partition is full or the interval passed."""
        if self._closed:
            return ExportResult.FAILURE
        b = batch.batch
        if b.num_rows == 0:
            if batch.ranges:  # nothing to store: the piece is done when the next commit takes it
                with self._lock:
                    self._entries.append(_Entry(batch.kind, [], batch.ranges, 0))
            return ExportResult.SUCCESS
        self._stats.inc(EVENTS_RECEIVED, b.num_rows, component="exporter:lake")
        with self._lock:
            parts = []
            full = False
            for date, node, rows in partitions(b, TIME_COLUMN[batch.kind]):
                parts.append((date, node, rows))
                pk = (batch.kind, date, node)
                self._partition_rows[pk] = self._partition_rows.get(pk, 0) + rows.num_rows
                full |= self._partition_rows[pk] >= self.config.flush_rows
            self._entries.append(_Entry(batch.kind, parts, batch.ranges, b.num_rows))
            if full or self._clock() - self._last_flush >= self.config.flush_interval_s:
                return ExportResult.SUCCESS if self.commit() else ExportResult.FAILURE
        return ExportResult.SUCCESS

    def tick(self) -> None:
        """Commit what is buffered if the flush interval passed (called by the pipeline when idle)."""
        with self._lock:
            due = self._clock() - self._last_flush >= self.config.flush_interval_s
            if due and (self._entries or self.ledger.foldable()):
                self.commit()

    # -- commits ------------------------------------------------------------------------------------

    def _writable(self) -> tuple[list[_Entry], dict[str, dict[str, Any]]]:
        """The entries this commit may write, and the offsets it will commit.

        An entry with ranges is written only if the commit moves its input's offset past all of them;
        found by fixed point: drop entries whose ranges would stay uncommitted, recompute, repeat.
        """
        candidates = [e for e in self._entries if not any(r.failed for r in e.ranges)]
        while True:
            pieces = [r for e in candidates for r in e.ranges]
            offsets = self.ledger.preview(pieces)
            committed = {k: v["offset"] for k, v in offsets.items()}
            keep = [e for e in candidates if all(committed.get(r.key, self._offset(r.key)) >= r.end for r in e.ranges)]
            if len(keep) == len(candidates):
                return keep, offsets
            candidates = keep

    def _offset(self, key: str) -> int:
        now = self.ledger.committed(key)
        return now[0] if now else 0

    def _next_part(self, directory: Path) -> int:
        if directory not in self._seq:
            existing = [int(m.group(1)) for f in directory.glob("part-*.parquet") if (m := _PART.match(f.name))]
            shipped = self.shipper.mark(directory) if self.shipper is not None else -1  # parts retired locally
            self._seq[directory] = max(*existing, shipped, -1) + 1
        seq = self._seq[directory]
        self._seq[directory] += 1
        return seq

    def commit(self, final: bool = False) -> bool:
        """Write one commit of everything that may be written now; True if nothing failed.

        ``final`` (shutdown): rows whose ranges cannot complete are dropped (counted); their input is
        read again from its committed offset on the next start, so nothing is lost or doubled.
        """
        with self._lock:
            self._last_flush = self._clock()
            if not self._entries and not self.ledger.foldable():
                return True
            entries, offsets = self._writable()
            if not entries and not offsets and not final:
                return True  # everything buffered waits for pieces still in flight
            chosen = {id(e) for e in entries}
            seq = self._commit_seq + 1
            grouped: dict[tuple[str, str, str], list[pa.RecordBatch]] = {}
            for e in entries:
                for date, node, rows in e.parts:
                    grouped.setdefault((e.kind, date, node), []).append(rows)
            plan: list[tuple[Path, Path, int]] = []
            intent_path = self.checkpoints / f"commit-{seq:08d}.json"
            try:
                for i, ((kind, date, node), batches) in enumerate(sorted(grouped.items())):
                    directory = self._directory(kind, date, node)
                    table = pa.Table.from_batches(batches, schema=SCHEMAS[kind]).drop_columns(["node"])
                    tmp = self._write_tmp(directory / f".part-c{seq}-{i}.tmp", table)
                    final_path = self._final_name(directory)
                    plan.append((tmp, final_path, table.num_rows))
                parts = [[str(t.relative_to(self.root)), str(f.relative_to(self.root))] for t, f, _ in plan]
                write_json_atomic(intent_path, {"commit": seq, "parts": parts, "offsets": offsets})
                # Offsets on disk before any part is sealed; from here the commit is durable (module doc).
                inputs = {**self.ledger.snapshot(), **offsets}
                write_json_atomic(self.checkpoints / OFFSETS, {"commit": seq, "inputs": inputs})
            except OSError as exc:
                for tmp, _, _ in plan:
                    tmp.unlink(missing_ok=True)
                intent_path.unlink(missing_ok=True)  # abandoned: never recovered
                self._stats.inc(EXPORT_ERRORS, 1, exporter="lake")
                log.error("lake: commit %d under %s failed (rows kept for the next attempt): %s", seq, self.root, exc)
                return False
            self.ledger.apply([r for e in entries for r in e.ranges], upto=offsets)
            try:
                for tmp, final_path, _ in plan:
                    os.link(tmp, final_path)
                    tmp.unlink()
                intent_path.unlink()
            except OSError as exc:
                self._stats.inc(EXPORT_ERRORS, 1, exporter="lake")
                log.error("lake: commit %d under %s not in place (a restart finishes it): %s", seq, self.root, exc)
            self._commit_seq = seq
            if self.shipper is not None and plan:
                self.shipper.wake()
            written = sum(e.rows for e in entries)
            self._stats.inc(EVENTS_EMITTED, written, component="exporter:lake")
            rest = [e for e in self._entries if id(e) not in chosen]
            if final:
                dropped = sum(e.rows for e in rest)
                if dropped:
                    self._stats.inc(EVENTS_DROPPED, dropped, component="exporter:lake", reason="uncommitted_input")
                    log.warning(
                        "lake: %d event(s) of inputs not complete at shutdown were not stored; they will "
                        "be read again from the last checkpoint",
                        dropped,
                    )
                rest = []
            self._entries = rest
            self._partition_rows = {}
            for e in rest:
                for date, node, rows in e.parts:
                    pk = (e.kind, date, node)
                    self._partition_rows[pk] = self._partition_rows.get(pk, 0) + rows.num_rows
            return True

    # -- snapshots and lifecycle --------------------------------------------------------------------

    def export_snapshot(self, snapshot: AnalysisSnapshot) -> ExportResult:
        """Replace analysis.json (and sources.json) with the latest snapshot."""
        if not self._started:
            return ExportResult.FAILURE
        try:
            write_json_atomic(self.root / "analysis.json", snapshot.to_dict())
            if self._records is not None:
                sources = dump_json({"sources": self._records()})
                if sources != self._sources_written:  # what was read changes rarely once sources run
                    write_bytes_atomic(self.root / "sources.json", sources)
                    self._sources_written = sources
        except OSError as exc:
            self._stats.inc(EXPORT_ERRORS, 1, exporter="lake")
            log.error("lake: cannot write analysis.json under %s: %s", self.root, exc)
            return ExportResult.FAILURE
        return ExportResult.SUCCESS

    def _write_versions(self) -> None:
        """One ``versions`` row when what this node runs differs from the last row written (contract/versions.py)."""
        assert self._versions is not None
        found = {k: self._versions.get(k) for k in versions.FIELDS}
        last_path = self.checkpoints / "versions.json"
        text = dump_json({"node": self._node, **found})
        if last_path.exists() and last_path.read_bytes() == text:
            return
        now = time.time_ns()
        directory = self._directory(versions.KIND, _date(now // NS_PER_DAY), self._node)
        table = versions.row(now, self._node, found).drop_columns(["node"])
        tmp = self._write_tmp(directory / ".part-versions.tmp", table)
        os.link(tmp, self._final_name(directory))
        tmp.unlink()
        write_bytes_atomic(last_path, text)

    def _directory(self, kind: str, date: str, node: str) -> Path:
        """The partition directory of (kind, date, node), made if missing (the node URI-encoded)."""
        directory = self.root / kind / f"date={date}" / f"node={urllib.parse.quote(node, safe='')}"
        make_dirs(directory)
        return directory

    def _write_tmp(self, tmp: Path, table: pa.Table) -> Path:
        """``table`` written as Parquet to the hidden ``tmp``, 0640 or tighter before it is linked into place."""
        os.close(open_private(tmp, os.O_WRONLY))  # made 0640: the writer truncates it, keeping its mode
        pq.write_table(table, tmp, compression=self.config.compression, **parquet_options(table.schema))
        tighten(tmp)  # whatever the writer did
        return tmp

    def _final_name(self, directory: Path) -> Path:
        """The next free ``part-NNNNNN.parquet`` name of ``directory``."""
        final_path = directory / f"part-{self._next_part(directory):06d}.parquet"
        while final_path.exists():
            final_path = directory / f"part-{self._next_part(directory):06d}.parquet"
        return final_path

    def unshipped(self) -> tuple[int, int, str | None] | None:
        """After shutdown, when shipping: the parts and bytes left unshipped, and why the last attempt failed."""
        if self.shipper is None:
            return None
        parts, size = self.shipper.unshipped
        return parts, size, self.shipper.last_error

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Commit what may be committed now, and ship what is sealed within ``timeout_s``."""
        if not self._started:
            return True
        deadline = time.monotonic() + timeout_s
        done = self.commit()
        if self.shipper is not None:
            done = self.shipper.drain(max(0.0, deadline - time.monotonic())) and done
        return done

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Final commit, ship what is sealed until the deadline, release the lock; idempotent, safe before start."""
        if self._closed:
            return
        deadline = time.monotonic() + timeout_s
        if self._started:
            self.commit(final=True)
        if self.shipper is not None:
            self.shipper.drain(max(0.0, deadline - time.monotonic()))
            self.shipper.stop(max(0.0, deadline - time.monotonic()))
        self._closed = True
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
