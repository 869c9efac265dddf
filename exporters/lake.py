"""The local lake (DESIGN section 4): Parquet datasets per event kind, analysis.json, checkpoints/.

``DIR/<kind>/date=YYYY-MM-DD/node=<node>/part-<seq>.parquet``, hive-partitioned, every part of one
kind with the full schema of that kind (``schemas.conform``) so the dataset reads as one table with
pyarrow.dataset, pandas or DuckDB. ``date`` and ``node`` live only in the path (as hive partitions
do): a ``node`` column inside the files would clash with the partition key when a reader infers it
(a node named ``7`` reads as an integer key) and would be replaced by it anyway. The node is
URI-encoded in the path (``rack/7`` -> ``node=rack%2F7``), which hive readers decode.

Rows are buffered per partition and written when a buffer holds ``flush_rows`` rows, when
``flush_interval_s`` passed, or on flush/shutdown. A part is written to a
hidden temporary file and then hard-linked to its final name, which fails rather than overwrite if
the name exists (a second writer, a restart): the sequence number then moves on. Readers never see
a half-written part; the temporary names start with ``.`` which pyarrow.dataset skips.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, PositiveFloat, PositiveInt

from aaco.agent.config_base import StrictModel
from aaco.agent.pipeline.schemas import SCHEMAS, TIME_COLUMN, EventBatch
from aaco.agent.pipeline.stats import EVENTS_EMITTED, EVENTS_RECEIVED, EXPORT_ERRORS, Stats
from aaco.analyzers.base import AnalysisSnapshot

from .base import Exporter, ExportResult

log = logging.getLogger("aaco.exporters.lake")
_PART = re.compile(r"^part-(\d+)\.parquet$")


class LakeConfig(StrictModel):
    """The local Parquet lake."""

    enabled: bool = Field(True, description="Write the lake.")
    path: Path = Field(Path("aaco-data"), description="Lake directory (created if missing).")
    flush_rows: PositiveInt = Field(200_000, description="Write a part when a partition buffers this many rows.")
    flush_interval_s: PositiveFloat = Field(10.0, description="Write buffered rows at least this often.")
    compression: str = Field("zstd", description="Parquet compression codec.")


def write_json_atomic(path: Path, doc: Any) -> None:
    """Write JSON to ``path`` via a temporary file and rename (readers see old or new, never half)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


class LakeExporter(Exporter):
    """Buffers event batches per partition and writes Parquet parts; writes analysis.json on snapshots."""

    name = "lake"

    def __init__(
        self,
        config: LakeConfig,
        stats: Stats,
        records: Callable[[], list[dict[str, Any]]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.root = Path(config.path)
        self._stats = stats
        self._records = records
        self._clock = clock
        self._lock = threading.Lock()
        self._buffers: dict[tuple[str, str, str], list[pa.RecordBatch]] = {}
        self._rows: dict[tuple[str, str, str], int] = {}
        self._seq: dict[Path, int] = {}
        self._last_flush = clock()
        self._closed = False
        self._started = False

    def start(self) -> None:
        """Create the lake's directories."""
        for sub in (*SCHEMAS, "checkpoints"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._started = True

    def export(self, batch: EventBatch) -> ExportResult:
        """Buffer a batch under its partitions; write parts that are due."""
        if self._closed:
            return ExportResult.FAILURE
        b = batch.batch
        if b.num_rows == 0:
            return ExportResult.SUCCESS
        self._stats.inc(EVENTS_RECEIVED, b.num_rows, component="exporter:lake")
        ts = b.column(TIME_COLUMN[batch.kind])
        dates = pc.strftime(pc.cast(ts, pa.timestamp("ns", tz="UTC")), format="%Y-%m-%d")
        keys = pc.binary_join_element_wise(dates, b.column("node"), "\x00")
        due: list[tuple[str, str, str]] = []
        with self._lock:
            unique = pc.unique(keys).to_pylist()
            for key in unique:
                part = b.filter(pc.equal(keys, key)) if len(unique) > 1 else b
                date, node = key.split("\x00", 1)
                k = (batch.kind, date, node)
                self._buffers.setdefault(k, []).append(part)
                self._rows[k] = self._rows.get(k, 0) + part.num_rows
                if self._rows[k] >= self.config.flush_rows:
                    due.append(k)
            if self._clock() - self._last_flush >= self.config.flush_interval_s:
                due = list(self._buffers)
                self._last_flush = self._clock()
            return ExportResult.SUCCESS if self._write(due) else ExportResult.FAILURE

    def tick(self) -> None:
        """Write everything buffered if the flush interval passed (called by the pipeline when idle)."""
        with self._lock:
            if self._buffers and self._clock() - self._last_flush >= self.config.flush_interval_s:
                self._last_flush = self._clock()
                self._write(list(self._buffers))

    def _next_part(self, directory: Path) -> int:
        if directory not in self._seq:
            existing = [int(m.group(1)) for f in directory.glob("part-*.parquet") if (m := _PART.match(f.name))]
            self._seq[directory] = max(existing, default=-1) + 1
        seq = self._seq[directory]
        self._seq[directory] += 1
        return seq

    def _write(self, keys: list[tuple[str, str, str]]) -> bool:
        ok = True
        for key in keys:
            batches = self._buffers.pop(key, None)
            rows = self._rows.pop(key, 0)
            if not batches:
                continue
            kind, date, node = key
            directory = self.root / kind / f"date={date}" / f"node={urllib.parse.quote(node, safe='')}"
            try:
                directory.mkdir(parents=True, exist_ok=True)
                table = pa.Table.from_batches(batches, schema=SCHEMAS[kind]).drop_columns(["node"])
                tmp = directory / f".part-{os.getpid()}-{threading.get_ident()}.tmp"
                pq.write_table(table, tmp, compression=self.config.compression)
                while True:
                    final = directory / f"part-{self._next_part(directory):06d}.parquet"
                    try:
                        os.link(tmp, final)
                        break
                    except FileExistsError:
                        continue
                tmp.unlink()
                self._stats.inc(EVENTS_EMITTED, rows, component="exporter:lake")
            except OSError as exc:
                ok = False
                self._stats.inc(EXPORT_ERRORS, 1, exporter="lake")
                log.error("lake: cannot write %s rows of %s to %s: %s", rows, kind, directory, exc)
                # Keep the rows for the next attempt rather than lose them.
                self._buffers.setdefault(key, []).extend(batches)
                self._rows[key] = self._rows.get(key, 0) + rows
        return ok

    def export_snapshot(self, snapshot: AnalysisSnapshot) -> ExportResult:
        """Replace analysis.json (and sources.json) with the latest snapshot."""
        if not self._started:
            return ExportResult.FAILURE
        try:
            write_json_atomic(self.root / "analysis.json", snapshot.to_dict())
            if self._records is not None:
                write_json_atomic(self.root / "sources.json", {"sources": self._records()})
        except OSError as exc:
            self._stats.inc(EXPORT_ERRORS, 1, exporter="lake")
            log.error("lake: cannot write analysis.json under %s: %s", self.root, exc)
            return ExportResult.FAILURE
        return ExportResult.SUCCESS

    def force_flush(self, timeout_s: float = 10.0) -> bool:
        """Write every buffer now."""
        with self._lock:
            self._last_flush = self._clock()
            return self._write(list(self._buffers))

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Flush and refuse further batches; idempotent."""
        if self._closed:
            return
        if self._started:
            self.force_flush(timeout_s)
        self._closed = True
