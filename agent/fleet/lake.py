"""The fleet's lake opened for queries: one pyarrow dataset per event kind, every node's parts together.

The layout is the local lake's (docs/architecture.md): ``<kind>/date=YYYY-MM-DD/node=<node>/part-*.parquet``,
so ``node`` and ``date`` come from the hive partitioning. The lake is a local directory or an object
store (``s3://``, ``gs://``, ``abfs://``), opened by ``aaco.contract.stores`` as a pyarrow filesystem;
only paths of that shape are read, so an upload's temporary object or a stray file is not. DuckDB
reads a local lake's parts itself (``read_parquet`` of the listed files, hive partitions as text: its
own scan, parallel and pushing filters down, is 1.7x faster than through Arrow on a 10 M-kernel lake,
benchmarks/fleet_query.py), and an object store's through its Arrow scan, so no DuckDB extension is
downloaded. Either way each view has the kind's full schema, a column that no part has being null.
A kind with no part yet is an empty table of its schema, so every query runs on a lake that has only
some kinds. The ``versions`` dataset (what software each node ran) is opened beside the event kinds.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from aaco.contract import versions
from aaco.contract.errors import AacoError
from aaco.contract.schemas import SCHEMAS, TIME_COLUMN
from aaco.contract.stores import Store, StoreError, explain, open_store

KINDS = ("kernels", "iterations", "telemetry", "counters")
TABLES = (*KINDS, versions.KIND)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_PART = re.compile(r"date=[^/]+/node=[^/]+/part-[^/]+\.parquet")


class FleetError(AacoError):
    """A fleet lake that cannot be read, or a query asked wrongly."""


def parse_duration(text: str) -> int:
    """``30m``, ``24h``, ``7d``, ``2w``, ``90s`` in nanoseconds."""
    found = _DURATION.match(text)
    if found is None:
        raise FleetError(
            f"{text!r} is not a duration: write a number and s, m, h, d or w (e.g. 24h)", subject="--since"
        )
    return int(float(found.group(1)) * _UNIT_S[found.group(2)] * 10**9)


_PARTITIONS = pa.schema([("date", pa.string()), ("node", pa.string())])


def _schema(kind: str) -> pa.Schema:
    """The kind's full schema (optional columns included, null where a part lacks them), node from the path."""
    fields = versions.SCHEMA if kind == versions.KIND else SCHEMAS[kind]
    return pa.schema([f for f in fields if f.name != "node"] + list(_PARTITIONS))


def store_error(url: str, exc: OSError) -> FleetError:
    """A store's failure as one line naming the lake and the fix (unreachable, refused, or as it said)."""
    what, hint = explain(exc)
    if what == str(exc):
        return FleetError(f"{url}: cannot read the lake: {what}", hint=hint)
    return FleetError(f"{url}: {what}", hint=hint)


def list_parts(store: Store, kind: str) -> list[str]:
    """The paths of ``kind``'s parts in the store (``date=*/node=*/part-*.parquet`` under ``kind/``), sorted."""
    base = store.key(kind)
    infos = store.fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return sorted(
        i.path
        for i in infos
        if i.type == pafs.FileType.File and i.path.startswith(base + "/") and _PART.fullmatch(i.path[len(base) + 1 :])
    )


def _lakes(store: Store) -> list[tuple[Store, dict[str, list[str]]]]:
    """The lake at ``store``'s base, or else the lakes one level below it (a folder of nodes' lakes), with their parts.

    Only lakes holding a kernels, iterations, telemetry or counters part count; none found is an empty list.
    """
    parts = {kind: list_parts(store, kind) for kind in TABLES}
    if any(parts[kind] for kind in KINDS):
        return [(store, parts)]
    infos = store.fs.get_file_info(pafs.FileSelector(store.base, recursive=False, allow_not_found=True))
    out = []
    for info in sorted(infos, key=lambda i: i.path):
        if info.type != pafs.FileType.Directory:
            continue
        sub = dataclasses.replace(store, base=info.path.rstrip("/"))
        sub_parts = {kind: list_parts(sub, kind) for kind in TABLES}
        if any(sub_parts[kind] for kind in KINDS):
            out.append((sub, sub_parts))
    return out


def _check_root(store: Store, found_any: bool) -> None:
    """Why a lake with no part is not one: no directory, no bucket, or no parts."""
    if not store.remote:
        if store.fs.get_file_info(store.base).type != pafs.FileType.Directory:
            raise FleetError(f"{store.base}: no such lake directory", subject="--lake")
    elif not found_any:
        bucket = store.base.split("/", 1)[0]
        if store.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise FleetError(
                f"{store.url}: no such bucket {bucket!r}", hint="check the URL, AWS_ENDPOINT_URL and AWS_REGION"
            )
    if not found_any:
        where = store.url if store.remote else store.base
        raise FleetError(
            f"{where}: no kernels, iterations, telemetry or counters parts, here or in the folders one level down: "
            "not a lake",
            subject="--lake",
        )


@dataclass
class FleetLake:
    """The lake's datasets by kind (an empty table where a kind has no part), ``versions`` among them."""

    url: str
    tables: dict[str, ds.Dataset | pa.Table]
    files: dict[str, list[str]] = field(default_factory=dict)  # a local lake's part paths by kind

    @classmethod
    def open(cls, url: str) -> FleetLake:
        """Open the lake at ``url`` (a directory, ``file://``, ``s3://``, ``gs://``, ``abfs://``), or the lakes in it.

        A location that holds no parts itself but folders that are lakes (``lakes/node-a/``, ``lakes/node-b/``)
        is read as one lake of all of them.

        An error names the URL and the fix when the store cannot be reached or refuses the
        credentials, the directory or bucket does not exist, or it holds no event part.
        """
        try:
            store = open_store(url)
        except StoreError as exc:
            raise FleetError(exc.message, subject="--lake", hint=exc.hint) from exc
        try:
            lakes = _lakes(store)
            _check_root(store, bool(lakes))
        except OSError as exc:
            raise store_error(url, exc) from exc
        tables: dict[str, ds.Dataset | pa.Table] = {}
        files = {} if store.remote else {kind: [p for _, parts in lakes for p in parts[kind]] for kind in TABLES}
        for kind in TABLES:
            found = [
                ds.dataset(
                    parts[kind],
                    schema=_schema(kind),
                    format="parquet",
                    filesystem=store.fs,
                    partitioning=ds.partitioning(_PARTITIONS, flavor="hive"),
                    partition_base_dir=lake.key(kind),
                )
                for lake, parts in lakes
                if parts[kind]
            ]
            if not found:
                tables[kind] = _schema(kind).empty_table()
            else:
                tables[kind] = found[0] if len(found) == 1 else ds.dataset(found)
        return cls(url, tables, {kind: paths for kind, paths in files.items() if paths})

    def connect(self, since_ns: int | None = None) -> duckdb.DuckDBPyConnection:
        """An in-process DuckDB with one view per table (events since ``since_ns`` ago when given).

        ``versions`` is never cut by ``since_ns``: a row from before the window is still in force.
        """
        con = duckdb.connect()
        con.execute("SET parquet_metadata_cache = true")  # each footer parsed once, not at every bind
        floor = time.time_ns() - since_ns if since_ns is not None else None
        for kind, table in self.tables.items():
            if kind in self.files:
                _parquet_view(con, kind, self.files[kind])
            else:
                con.register(f"_{kind}", table)
            where = f" WHERE {TIME_COLUMN[kind]} >= {int(floor)}" if floor is not None and kind in KINDS else ""
            con.execute(f"CREATE VIEW {kind} AS SELECT * FROM _{kind}{where}")
        return con


def _sql_text(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


@functools.cache
def _template_dir() -> tempfile.TemporaryDirectory[str]:
    """Where this process's empty parts are written (removed at its exit)."""
    return tempfile.TemporaryDirectory(prefix="aaco-fleet-")


@functools.cache
def _template(kind: str) -> str:
    """An empty part of the kind's full schema, written once per process.

    Read first by ``union_by_name``, it gives every view every column of the schema (null in the
    parts of an agent from before the column) with no second pass over the parts' footers.
    """
    path = Path(_template_dir().name, kind, "date=0", "node=0", "part-0.parquet")
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(_schema(kind).empty_table().drop_columns([f.name for f in _PARTITIONS]), path)
    return str(path)


def _parquet_view(con: duckdb.DuckDBPyConnection, kind: str, paths: list[str]) -> None:
    """``_<kind>``: DuckDB's own scan of ``paths``, every column of the kind's schema in its order.

    No casts: the lake's schemas only ever gained columns, so a column's type is the schema's (a cast
    on each column costs its scan a tenth).
    """
    columns = ", ".join('"' + f.name.replace('"', '""') + '"' for f in _schema(kind))
    listed = "[" + ", ".join(_sql_text(p) for p in [_template(kind), *paths]) + "]"
    con.execute(
        f"CREATE VIEW _{kind} AS SELECT {columns} FROM read_parquet({listed}, hive_partitioning = true, "
        "union_by_name = true, hive_types = {'date': 'VARCHAR', 'node': 'VARCHAR'})"
    )
