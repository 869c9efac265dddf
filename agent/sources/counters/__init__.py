"""The ``counters`` source: hardware counter captures read once, as ``counters`` rows (docs/counters.md).

Each configured path is a ``counter_collection.csv``, JSON output or rocpd database (``.db``) of
rocprofv3 ``--pmc``, a rocprof-compute
workload directory (its ``pmc_perf.csv``, with ``sysinfo.csv`` naming the GPU's architecture), a
Kineto trace taken in CUPTI profiler mode (``.json``, ``.json.gz``), or a directory searched for
them (at most ``MAX_FILES``). Rows the capture does not time take the file's
modification time (so they land in the lake beside the run that wrote them). A file that cannot be
read is a problem of the source, counted and logged; the other files are read.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from itertools import islice
from pathlib import Path
from typing import Final, Literal

import pyarrow as pa
from pydantic import Field

from aaco.agent.sources.base import Source, SourceContext
from aaco.agent.sources.counters.files import WorkloadError
from aaco.agent.sources.counters.kineto import read_kineto_counters
from aaco.agent.sources.counters.rocpd import read_rocpd_counters
from aaco.agent.sources.counters.rocprof_compute import read_pmc_perf, read_sysinfo
from aaco.agent.sources.counters.rocprofv3 import agent_arch, read_counter_collection
from aaco.agent.sources.counters.rocprofv3_json import read_rocprofv3_counters
from aaco.agent.sources.traces import rocprofv3_json as rocprofv3_trace
from aaco.agent.sources.traces.files import read_head
from aaco.contract.config_base import StrictModel
from aaco.contract.counters import CounterRow
from aaco.contract.errors import TraceFormatError
from aaco.contract.schemas import COUNTERS

log = logging.getLogger("aaco.sources.counters")
MAX_FILES: Final = 10_000
BATCH_ROWS: Final = 65_536
NAMES: Final = ("pmc_perf.csv", "counter_collection.csv")


class CountersSourceConfig(StrictModel):
    """Hardware counter captures (rocprofv3 --pmc, rocprof-compute workloads, CUPTI Kineto traces), read once."""

    type: Literal["counters"] = "counters"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    paths: list[Path] = Field(
        ...,
        min_length=1,
        description="counter_collection.csv files, rocprofv3 JSON outputs, rocpd databases, rocprof-compute "
        "workload directories (pmc_perf.csv), Kineto traces in CUPTI profiler mode, or directories holding them "
        "(searched recursively).",
    )
    arch: str | None = Field(
        None, description="The GPU architecture (gfx90a, gfx942) where a capture does not say it (rocprofv3)."
    )
    model: str | None = Field(
        None,
        description="The model the captures profiled (their rows' model; the bottleneck class per model reads it).",
    )


def _known(p: Path) -> bool:
    return p.name in NAMES or p.name.endswith(("_counter_collection.csv", ".json", ".json.gz", ".db", ".db.gz"))


def captures(paths: list[Path]) -> Iterator[Path]:
    """The counter files under ``paths`` (a file as given; in a directory, the known names), bounded."""
    for path in paths:
        if path.is_dir():
            yield from islice((p for p in sorted(path.rglob("*")) if p.is_file() and _known(p)), MAX_FILES)
        else:
            yield path


class CountersSource(Source):
    """Reads each capture once and publishes its rows."""

    type = "counters"
    finite = True

    def __init__(self, config: CountersSourceConfig, name: str) -> None:
        super().__init__(name)
        self.config = config
        self.rows = 0

    def run(self, ctx: SourceContext) -> None:
        """Every capture, in order; a bad one said and skipped."""
        for path in captures(self.config.paths):
            if ctx.stop.is_set():
                return
            self.rows += publish_capture(ctx, self.name, path, arch=self.config.arch, model=self.config.model)


def publish_capture(
    ctx: SourceContext, source: str, path: Path, *, arch: str | None = None, model: str | None = None
) -> int:
    """Read one counter capture and publish its rows as ``counters``; returns how many.

    The architecture is the capture's own where it says it (rocprof-compute's ``sysinfo.csv``,
    rocprofv3's ``agent_info.csv`` or its JSON's and rocpd's agents, a Kineto trace's
    ``deviceProperties``), else ``arch``; ``model`` is
    the rows' model. A file that
    is not a capture, and each bad row, is a problem of ``source`` (counted, logged), not an error.
    """
    problems: list[str] = []
    try:
        read = _publish(ctx, source, path, problems, arch, model)
    except (WorkloadError, TraceFormatError) as exc:  # the second: its first bytes cannot be read
        ctx.problem(source, exc.subject or os.fspath(path), "unreadable", exc.message, fatal=False, count=1)
        read = 0
    for p in problems:
        ctx.problem(source, os.fspath(path), "malformed", p, fatal=False, count=1)
    return read


def _publish(
    ctx: SourceContext, source: str, path: Path, problems: list[str], arch: str | None, model: str | None
) -> int:
    found: dict[str, str] = {}
    if path.name.endswith("pmc_perf.csv"):
        sysinfo = path.with_name("sysinfo.csv")
        if sysinfo.is_file():
            arch = read_sysinfo(sysinfo).get("gpu_arch") or arch
        rows: Iterator[CounterRow] = (r for d in read_pmc_perf(path, problems) for r in d.rows())
    elif path.name.endswith((".db", ".db.gz")):
        rows = read_rocpd_counters(path, problems, found)
    elif path.name.endswith((".json", ".json.gz")) and rocprofv3_trace.sniff(read_head(path)):
        rows = (r for d in read_rocprofv3_counters(path, problems, found) for r in d.rows())
    elif path.name.endswith((".json", ".json.gz")):
        rows = read_kineto_counters(path, problems, found)
    else:
        arch = agent_arch(path) or arch
        rows = read_counter_collection(path, problems)
    mtime, read = path.stat().st_mtime_ns, 0
    while chunk := list(islice(rows, BATCH_ROWS)):
        table = to_table(chunk, ctx.node, source, found.get("arch") or arch, mtime, model)
        ctx.publish(source, "counters", table, durable=True)
        read += table.num_rows
    log.info("%s: %d counter rows from %s", source, read, path)
    return read


def to_table(
    rows: list[CounterRow], node: str, source: str, arch: str | None, mtime_ns: int, model: str | None = None
) -> pa.Table:
    """Rows as a ``counters`` table; an untimed dispatch (start 0) takes ``mtime_ns``."""
    cols = list(zip(*rows, strict=True))
    start = [s or mtime_ns for s in cols[0]]
    end = [e or s for e, s in zip(cols[1], start, strict=True)]
    n = len(rows)
    data = {
        "start_ns": start,
        "end_ns": end,
        "node": [node] * n,
        "pid": cols[2],
        "device": cols[3],
        "dispatch_id": cols[4],
        "kernel": cols[6],
        "counter": cols[7],
        "value": cols[8],
        "source": [source] * n,
        "correlation_id": cols[5],
        "arch": [arch] * n,
        "op_name": [o or None for o in cols[9]],
        "top_op": [o or None for o in cols[10]],
        "model": [model] * n,
    }
    return pa.table({k: pa.array(v, COUNTERS.field(k).type) for k, v in data.items()})


def create(config: CountersSourceConfig, name: str) -> CountersSource:
    """Factory used by the source registry."""
    return CountersSource(config, name)
