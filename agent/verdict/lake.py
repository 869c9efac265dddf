"""Reading a local lake back (``DIR/<kind>/date=/node=/part-*.parquet``, ``sources.json``, ``analysis.json``).

For commands that work on finished lakes (``aaco baseline save``, ``aaco diff``). Every part is read
on its own, so a damaged one is reported by name (``AacoError``: the CLI prints one line and exits
2) rather than as a dataset-wide error. ``date`` and ``node`` come from the hive path, as any hive
reader would take them; rows come back conformed to their kind's schema (``schemas.conform``) and
sorted by time, ready to be fed to the analyzers.
"""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from aaco.contract.errors import AacoError
from aaco.contract.schemas import SCHEMAS, TIME_COLUMN, EventBatch, conform

ANALYZED_KINDS = ("telemetry", "sched", "iterations", "kernels", "counters")  # findings are output, not input
FEED_ROWS = 16_384


@dataclass
class Lake:
    """A lake read into memory: a table per kind, and its JSON documents."""

    root: Path
    tables: dict[str, pa.Table] = field(default_factory=dict)
    sources: list[dict[str, Any]] = field(default_factory=list)
    analysis: dict[str, Any] | None = None

    def table(self, kind: str) -> pa.Table:
        """The rows of ``kind`` (an empty table of its schema when the lake has none)."""
        t = self.tables.get(kind)
        return t if t is not None else SCHEMAS[kind].empty_table()

    def nodes(self) -> list[str]:
        """Every node that wrote to the lake."""
        out: set[str] = set()
        for t in self.tables.values():
            out.update(v for v in pc.unique(t.column("node")).to_pylist() if v is not None)
        return sorted(out)

    def batches(self) -> Iterator[EventBatch]:
        """Every analysed kind's rows as event batches, chunks of all kinds merged in time order."""
        chunks: list[tuple[int, int, EventBatch]] = []
        for order, kind in enumerate(ANALYZED_KINDS):
            t = self.tables.get(kind)
            if t is None or t.num_rows == 0:
                continue
            for b in t.combine_chunks().to_batches(max_chunksize=FEED_ROWS):
                first = b.column(TIME_COLUMN[kind])[0].as_py()
                chunks.append((first, order, EventBatch(kind, b, "lake")))
        chunks.sort(key=lambda c: (c[0], c[1]))
        for _, _, item in chunks:
            yield item


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise AacoError(f"cannot read ({exc.strerror or exc})", subject=path) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise AacoError(f"not valid JSON ({exc})", subject=path, hint="the lake is damaged") from None


def _partition_value(part: Path, key: str) -> str | None:
    for parent in part.parents:
        if parent.name.startswith(f"{key}="):
            return urllib.parse.unquote(parent.name.split("=", 1)[1])
    return None


def read_kind(root: Path, kind: str) -> pa.Table | None:
    """Every part of ``DIR/<kind>``, conformed and sorted by time; None when the lake has no such dataset."""
    base = root / kind
    if not base.is_dir():
        return None
    parts = sorted(p for p in base.rglob("*.parquet") if not p.name.startswith("."))
    batches: list[pa.RecordBatch] = []
    for part in parts:
        try:
            t = pq.read_table(part)
        except (OSError, pa.ArrowException) as exc:
            raise AacoError(f"not a readable Parquet part ({exc})", subject=part, hint="the lake is damaged") from None
        node = _partition_value(part, "node")
        if node is None and "node" not in t.column_names:
            raise AacoError("a part outside any node=<node> folder", subject=part, hint="not an AACO lake layout")
        if "date" in t.column_names:
            t = t.drop_columns(["date"])
        if node is not None:
            if "node" in t.column_names:
                t = t.drop_columns(["node"])
            t = t.append_column("node", pa.array([node] * t.num_rows, pa.string()))
        try:
            batches.append(conform(kind, t))
        except (pa.ArrowException, ValueError, KeyError) as exc:
            raise AacoError(f"rows do not fit the {kind} schema ({exc})", subject=part) from None
    if not batches:
        return SCHEMAS[kind].empty_table()
    table = pa.Table.from_batches(batches, schema=SCHEMAS[kind])
    return table.sort_by(TIME_COLUMN[kind])


def read_lake(root: Path) -> Lake:
    """Read the lake at ``root``; ``AacoError`` naming the file when it is missing or damaged."""
    root = Path(root)
    if not root.exists():
        raise AacoError("no such lake directory", subject=root, hint="give a directory written by aaco run or replay")
    if not root.is_dir():
        raise AacoError("not a directory (a lake is a directory written by aaco run or replay)", subject=root)
    lake = Lake(root)
    for kind in ANALYZED_KINDS:
        t = read_kind(root, kind)
        if t is not None:
            lake.tables[kind] = t
    sources = root / "sources.json"
    if sources.exists():
        doc = _json(sources)
        if not isinstance(doc, dict) or not isinstance(doc.get("sources", []), list):
            raise AacoError('not a sources.json document (expected {"sources": [...]})', subject=sources)
        lake.sources = [s for s in doc.get("sources", []) if isinstance(s, dict)]
    analysis = root / "analysis.json"
    if analysis.exists():
        doc = _json(analysis)
        if not isinstance(doc, dict):
            raise AacoError("not an analysis.json document (expected an object)", subject=analysis)
        lake.analysis = doc
    return lake
