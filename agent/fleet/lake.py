"""The fleet's lake opened for queries: one pyarrow dataset per event kind, every node's parts together.

The layout is the local lake's (docs/architecture.md): ``<kind>/date=YYYY-MM-DD/node=<node>/part-*.parquet``,
so ``node`` and ``date`` come from the hive partitioning. DuckDB reads the datasets in process through
its Arrow scan, so no DuckDB extension is downloaded. A kind with no part yet is an empty table of its
schema, so every query runs on a lake that has only some kinds.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds

from aaco.contract.errors import AacoError
from aaco.contract.schemas import SCHEMAS

KINDS = ("kernels", "iterations", "telemetry")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_TIME = {"kernels": "start_ns", "iterations": "start_ns", "telemetry": "ts_ns"}


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


def lake_path(url: str) -> Path:
    """The local directory a lake URL names (a path or ``file://``)."""
    if url.startswith("file://"):
        return Path(url[len("file://") :])
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", url):
        raise FleetError(
            f"{url}: only local lakes (a path or file://) can be queried in this version", subject="--lake"
        )
    return Path(url)


_PARTITIONS = pa.schema([("date", pa.string()), ("node", pa.string())])


def _schema(kind: str) -> pa.Schema:
    """The kind's full schema (optional columns included, null where a part lacks them), node from the path."""
    return pa.schema([f for f in SCHEMAS[kind] if f.name != "node"] + list(_PARTITIONS))


@dataclass
class FleetLake:
    """The lake's datasets by kind (an empty table where a kind has no part)."""

    root: Path
    tables: dict[str, ds.Dataset | pa.Table]

    @classmethod
    def open(cls, url: str) -> FleetLake:
        """Open the lake at ``url``; an error names the directory when it holds no lake."""
        root = lake_path(url)
        if not root.is_dir():
            raise FleetError(f"{root}: no such lake directory", subject="--lake")
        tables: dict[str, ds.Dataset | pa.Table] = {}
        for kind in KINDS:
            parts = sorted((root / kind).glob("date=*/node=*/*.parquet")) if (root / kind).is_dir() else []
            tables[kind] = (
                ds.dataset(
                    [str(p) for p in parts],
                    schema=_schema(kind),
                    format="parquet",
                    partitioning=ds.partitioning(_PARTITIONS, flavor="hive"),
                    partition_base_dir=str(root / kind),
                )
                if parts
                else _schema(kind).empty_table()
            )
        if all(isinstance(t, pa.Table) for t in tables.values()):
            raise FleetError(f"{root}: no kernels, iterations or telemetry parts: not a lake", subject="--lake")
        return cls(root, tables)

    def connect(self, since_ns: int | None = None) -> duckdb.DuckDBPyConnection:
        """An in-process DuckDB with one view per kind (rows since ``since_ns`` ago when given)."""
        con = duckdb.connect()
        floor = time.time_ns() - since_ns if since_ns is not None else None
        for kind, table in self.tables.items():
            con.register(f"_{kind}", table)
            where = f" WHERE {_TIME[kind]} >= {int(floor)}" if floor is not None else ""
            con.execute(f"CREATE VIEW {kind} AS SELECT * FROM _{kind}{where}")
        return con
