"""Shipping the local lake's sealed parts to object storage, exactly once (docs/fleet.md, Shipping).

The local lake stays the crash-safe copy. A part is *sealed* once a commit linked it into place under
its final name (``part-NNNNNN.parquet``): it never changes after that. Each sealed part is uploaded
to a deterministic key, ``<kind>/date=D/node=N/part-<lake id>-NNNNNN.parquet`` under the store's
prefix, where the lake id is a random id made once per local lake (so a lake wiped and started
again never overwrites its predecessor's parts). An upload is one object PUT (a multipart upload is
only visible once completed), so a key holds a whole part or nothing.

What was shipped is a high-water mark per partition directory in ``checkpoints/shipped.json``: a
directory's parts are uploaded in sequence order, and the mark moves past a part only after its
upload was confirmed (the object's size read back). A ``kill -9`` between the upload and the mark
uploads that part again on the next start, to the same key, which replaces the object with the same
bytes: the lake neither loses nor repeats a row.

Failures back off exponentially (with jitter) up to ``retry_max_s`` and are counted; the backlog (parts
sealed and not shipped) is a gauge, bounded by ``max_backlog_mib``: past it the oldest parts are
deleted unshipped and counted as dropped. Parts shipped more than ``retention_h`` ago can be removed
locally; the mark keeps their sequence numbers from being reused.
"""

from __future__ import annotations

import json
import logging
import random
import re
import secrets
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import pyarrow.parquet as pq
from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from aaco.contract.config_base import StrictModel
from aaco.contract.files import write_bytes_atomic
from aaco.contract.signals import define
from aaco.contract.stats import EVENTS_DROPPED, Stats
from aaco.contract.stores import Store, explain

log = logging.getLogger("aaco.exporters.lake")
# What is left unshipped at shutdown; the commands that report it themselves (aaco run, aaco replay) quiet it.
left_log = logging.getLogger("aaco.exporters.lake.unshipped")

SHIPPED = "shipped.json"
LAKE_ID = "lake-id"
COMPONENT = "exporter:lake_upload"
_PART = re.compile(r"^part-(\d+)\.parquet$")
_CHUNK = 8 * 1024 * 1024
RETIRE_EVERY_S = 300.0  # retention is in hours: the whole lake is listed for it at most this often

UPLOADED_PARTS: Final = define(
    "aaco.lake.upload.parts", "aaco_lake_upload_parts", "counter", "{part}", "Lake parts shipped to object storage."
)
UPLOADED_BYTES: Final = define(
    "aaco.lake.upload.bytes",
    "aaco_lake_upload_bytes",
    "counter",
    "By",
    "Bytes of lake parts shipped to object storage.",
)
UPLOAD_FAILURES: Final = define(
    "aaco.lake.upload.failures",
    "aaco_lake_upload_failures",
    "counter",
    "{failure}",
    "Failed uploads of lake parts (each is retried with backoff); 0 from the start when shipping is on.",
)
BACKLOG_PARTS: Final = define(
    "aaco.lake.upload.backlog.parts",
    "aaco_lake_upload_backlog_parts",
    "gauge",
    "{part}",
    "Sealed lake parts not shipped yet.",
)
BACKLOG_BYTES: Final = define(
    "aaco.lake.upload.backlog.bytes",
    "aaco_lake_upload_backlog_bytes",
    "gauge",
    "By",
    "Bytes of sealed lake parts not shipped yet (bounded by exporters.lake.upload.max_backlog_mib).",
)
DROPPED_PARTS: Final = define(
    "aaco.lake.upload.dropped",
    "aaco_lake_upload_dropped_parts",
    "counter",
    "{part}",
    "Lake parts deleted unshipped because the backlog was full; their rows count in aaco_events_dropped.",
)
LAST_SUCCESS: Final = define(
    "aaco.lake.upload.last_success",
    "aaco_lake_upload_last_success_timestamp_seconds",
    "gauge",
    "s",
    "When a part was last shipped (Unix time; 0 before the first).",
)
REMOVED_PARTS: Final = define(
    "aaco.lake.retention.removed",
    "aaco_lake_retention_removed_parts",
    "counter",
    "{part}",
    "Shipped parts removed from the local lake after exporters.lake.upload.retention_h.",
)


class UploadSettings(StrictModel):
    """How sealed parts are shipped when ``exporters.lake.remote`` is set."""

    endpoint_url: str | None = Field(
        None, description="Object store endpoint (SeaweedFS, MinIO, Ceph); default $AWS_ENDPOINT_URL, else AWS."
    )
    region: str | None = Field(None, description="Region; default $AWS_REGION.")
    interval_s: PositiveFloat = Field(5.0, description="Look for sealed parts to ship at least this often.")
    retry_initial_s: PositiveFloat = Field(1.0, description="First wait after a failed upload (doubles each time).")
    retry_max_s: PositiveFloat = Field(60.0, description="Longest wait between attempts.")
    max_backlog_mib: PositiveInt = Field(
        10_240, description="Sealed parts not shipped yet, at most; past it the oldest are deleted and counted."
    )
    retention_h: NonNegativeFloat | None = Field(
        None, description="Remove local parts this many hours after they were shipped (none: keep them)."
    )
    workers: PositiveInt = Field(4, description="Uploads at once.")
    connect_timeout_s: PositiveFloat = Field(5.0, description="Connection timeout per request.")
    request_timeout_s: PositiveFloat = Field(
        15.0, description="A request that moves no byte this long fails (and is retried): bounds a stalled store."
    )


@dataclass(frozen=True)
class Part:
    """A sealed part of the local lake: where it is, its directory (relative), its sequence number, size."""

    path: Path
    directory: str
    seq: int
    size: int
    mtime: float


class Shipper:
    """Uploads the sealed parts of the lake at ``root`` to ``store``, in order, each exactly once."""

    def __init__(
        self,
        root: Path,
        store: Store,
        settings: UploadSettings,
        stats: Stats,
        kinds: tuple[str, ...],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.root = root
        self.store = store
        self.settings = settings
        self.kinds = kinds
        self._stats = stats
        self._monotonic = monotonic
        self._lock = threading.Lock()  # the marks and the uploads: one shipping pass at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._marks: dict[str, int] = {}
        self._failures = 0
        self._shipped_dirs: dict[str, int] = {}  # directory -> its mtime when no part in it was pending
        self._next_retire = 0.0
        self._pool = ThreadPoolExecutor(settings.workers, thread_name_prefix="aaco-lake-upload")
        self.lake_id = ""
        self.last_error: str | None = None  # why the last pass failed (``stores.explain``), None after a success
        self.unshipped: tuple[int, int] = (0, 0)  # parts and bytes left unshipped when stopped
        for metric in (UPLOADED_PARTS, UPLOADED_BYTES, UPLOAD_FAILURES, DROPPED_PARTS, REMOVED_PARTS, LAST_SUCCESS):
            stats.declare(metric)
        stats.declare(EVENTS_DROPPED, component=COMPONENT, reason="backlog_full")

    # -- state --------------------------------------------------------------------------------------

    @property
    def _state_path(self) -> Path:
        return self.root / "checkpoints" / SHIPPED

    def load(self) -> None:
        """Read the lake id (made on first use) and the marks of what was shipped."""
        id_path = self.root / "checkpoints" / LAKE_ID
        if id_path.exists():
            self.lake_id = id_path.read_text().strip()
        else:
            self.lake_id = secrets.token_hex(4)
            write_bytes_atomic(id_path, self.lake_id.encode())
        if self._state_path.exists():
            doc = json.loads(self._state_path.read_text())
            self._marks = {str(k): int(v) for k, v in doc.get("marks", {}).items()}

    def _save(self) -> None:
        write_bytes_atomic(self._state_path, json.dumps({"store": self.store.url, "marks": self._marks}).encode())

    def mark(self, directory: Path) -> int:
        """The highest sequence number shipped (or dropped) in ``directory`` (-1 when none).

        Read without the shipping lock (one dict lookup), so a commit never waits on an upload.
        """
        return self._marks.get(str(directory.relative_to(self.root)), -1)

    def key(self, part: Part) -> str:
        """The part's key in the store."""
        return self.store.key(f"{part.directory}/part-{self.lake_id}-{part.seq:06d}.parquet")

    # -- finding parts ------------------------------------------------------------------------------

    def sealed(self) -> list[Part]:
        """Every sealed part of the lake beyond its directory's mark, oldest first."""
        out = []
        for kind in self.kinds:
            base = self.root / kind
            if not base.is_dir():
                continue
            for directory in base.glob("date=*/node=*"):
                rel = str(directory.relative_to(self.root))
                # A directory found fully shipped is listed again only once its mtime moved (a part linked
                # in or removed): a long-kept lake is not re-listed part by part every pass.
                mtime = directory.stat().st_mtime_ns
                if self._shipped_dirs.get(rel) == mtime:
                    continue
                floor = self._marks.get(rel, -1)
                found = False
                for f in directory.iterdir():
                    m = _PART.match(f.name)
                    if m and int(m.group(1)) > floor:
                        st = f.stat()
                        out.append(Part(f, rel, int(m.group(1)), st.st_size, st.st_mtime))
                        found = True
                if found:
                    self._shipped_dirs.pop(rel, None)
                else:
                    self._shipped_dirs[rel] = mtime
        return sorted(out, key=lambda p: (p.directory, p.seq))

    # -- shipping -----------------------------------------------------------------------------------

    def _upload(self, part: Part) -> None:
        key = self.key(part)
        fs = self.store.fs
        # An object PUT is atomic; a shared directory (file://) is not: write a hidden name there, then rename.
        target = key
        if not self.store.remote:
            parent, name = key.rsplit("/", 1)
            fs.create_dir(parent, recursive=True)
            target = f"{parent}/.{name}.tmp"
        with open(part.path, "rb") as src, fs.open_output_stream(target) as dst:
            shutil.copyfileobj(src, dst, _CHUNK)  # type: ignore[misc]
        if target != key:
            fs.move(target, key)
        got = fs.get_file_info(key)
        if got.size != part.size:
            raise OSError(f"{key}: the store holds {got.size} bytes after the upload, the part has {part.size}")

    def _attempt(self, part: Part) -> Exception | None:
        try:
            self._upload(part)
        except (OSError, ValueError) as exc:
            return exc
        return None

    def ship_once(self, deadline: float | None = None) -> bool:
        """One pass: bound the backlog, upload what is pending; True when nothing is left pending.

        Up to ``workers`` uploads run at once, a batch at a time; a directory's mark then moves over
        its parts in sequence order up to the first that failed (a later part of it that did upload
        is uploaded again next time, to the same key).
        """
        with self._lock:
            pending = self._bound(self.sealed())
            while pending:
                if (self._stop.is_set() and deadline is None) or (
                    deadline is not None and self._monotonic() >= deadline
                ):
                    return False
                batch, pending = pending[: self.settings.workers * 2], pending[self.settings.workers * 2 :]
                errors = list(self._pool.map(self._attempt, batch)) if len(batch) > 1 else [self._attempt(batch[0])]
                blocked: set[str] = set()
                failed = []
                for part, error in zip(batch, errors, strict=True):
                    if error is None:
                        self._stats.inc(UPLOADED_PARTS)
                        self._stats.inc(UPLOADED_BYTES, part.size)
                        if part.directory not in blocked:
                            self._marks[part.directory] = part.seq
                        continue
                    blocked.add(part.directory)
                    failed.append((part, error))
                if len(failed) < len(batch):
                    self._stats.set(LAST_SUCCESS, time.time())
                self._save()
                if failed:
                    self._failures += 1
                    self._stats.inc(UPLOAD_FAILURES, len(failed))
                    part, error = failed[0]
                    what = explain(error)[0]
                    said, self.last_error = self.last_error, what  # said once while the failure stays the same
                    (log.debug if what == said else log.warning)(
                        "lake: cannot ship %s%s to %s (will retry): %s",
                        part.path,
                        f" and {len(failed) - 1} more" if len(failed) > 1 else "",
                        self.store.url,
                        error,
                    )
                    self._gauges([p for p in batch if self._marks.get(p.directory, -1) < p.seq] + pending)
                    return False
                self._failures = 0
                self.last_error = None
                self._gauges(pending)
            self._gauges([])
            self._retire()
            return True

    def _gauges(self, pending: list[Part]) -> None:
        self._stats.set(BACKLOG_PARTS, len(pending))
        self._stats.set(BACKLOG_BYTES, sum(p.size for p in pending))

    def _bound(self, pending: list[Part]) -> list[Part]:
        """Delete the oldest pending parts while the backlog is over its limit (counted); the rest."""
        limit = self.settings.max_backlog_mib * 1024 * 1024
        total = sum(p.size for p in pending)
        if total <= limit:
            self._gauges(pending)
            return pending
        dropped: set[int] = set()
        for part in sorted(pending, key=lambda p: p.mtime):  # within a directory, time order is sequence order
            if total <= limit:
                break
            try:
                rows = pq.read_metadata(part.path).num_rows
            except (OSError, ValueError):
                rows = 0
            part.path.unlink(missing_ok=True)
            total -= part.size
            dropped.add(id(part))
            self._marks[part.directory] = max(self._marks.get(part.directory, -1), part.seq)
            self._stats.inc(DROPPED_PARTS)
            self._stats.inc(EVENTS_DROPPED, rows, component=COMPONENT, reason="backlog_full")
            log.error("lake: backlog over %d MiB: dropped unshipped %s", self.settings.max_backlog_mib, part.path)
        self._save()
        rest = [p for p in pending if id(p) not in dropped]
        self._gauges(rest)
        return rest

    def _retire(self) -> None:
        """Remove local parts shipped more than ``retention_h`` ago (their marks stay)."""
        hours = self.settings.retention_h
        now = self._monotonic()
        if hours is None or now < self._next_retire:
            return
        self._next_retire = now + min(RETIRE_EVERY_S, hours * 360)  # a tenth of the retention, at most 5 min
        cutoff = time.time() - hours * 3600
        for kind in self.kinds:
            for directory in (self.root / kind).glob("date=*/node=*"):
                mark = self._marks.get(str(directory.relative_to(self.root)), -1)
                for f in directory.iterdir():
                    m = _PART.match(f.name)
                    if m and int(m.group(1)) <= mark and f.stat().st_mtime < cutoff:
                        f.unlink(missing_ok=True)
                        self._stats.inc(REMOVED_PARTS)

    def backoff_s(self) -> float:
        """How long to wait before the next attempt after the failures so far (full jitter)."""
        if self._failures == 0:
            return self.settings.interval_s
        cap = min(self.settings.retry_max_s, self.settings.retry_initial_s * 2 ** min(self._failures - 1, 30))
        return random.uniform(cap / 2, cap)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Load the marks and ship in the background."""
        self.load()
        self._thread = threading.Thread(target=self._loop, name="aaco-lake-upload", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """A commit sealed new parts: look now rather than at the next interval."""
        if self._failures == 0:
            self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.ship_once()
            except OSError as exc:  # the local lake itself (a part removed under us, a full disk): said, retried
                self._failures += 1
                log.error("lake: shipping pass failed: %s", exc)
            self._wake.wait(self.backoff_s())
            self._wake.clear()

    def drain(self, timeout_s: float) -> bool:
        """Ship everything pending within ``timeout_s`` (retrying with backoff); True when nothing is left."""
        deadline = self._monotonic() + timeout_s
        while True:
            if self.ship_once(deadline):
                return True
            left = deadline - self._monotonic()
            if left <= 0:
                return False
            self._stop.wait(min(left, self.backoff_s()))

    def stop(self, timeout_s: float) -> None:
        """Stop the background thread; what is left pending ships on the next start."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(max(0.0, timeout_s))
        self._pool.shutdown(wait=False, cancel_futures=True)
        if not self._lock.acquire(timeout=max(0.0, timeout_s)):  # an upload still waits on a stalled store
            self.unshipped = (max(1, int(self._stats.get(BACKLOG_PARTS))), int(self._stats.get(BACKLOG_BYTES)))
            log.warning(
                "lake: an upload to %s was still in flight at shutdown; it is retried on the next start", self.store.url
            )
            return
        try:
            left = self.sealed()
        finally:
            self._lock.release()
        self.unshipped = (len(left), sum(p.size for p in left))
        if left:
            left_log.warning(
                "lake: %d part(s) (%d bytes) not shipped to %s yet: they stay in %s and ship on the next start",
                len(left),
                sum(p.size for p in left),
                self.store.url,
                self.root,
            )
