"""The critical path of each ProfilerStep of a Kineto trace (``critical_path``) onto its iteration rows.

Which traces get one (``TraceLimits.critical_path``): ``ranks`` (the default) the ranks of a
distributed job (a ``distributedInfo`` with a world size), ``all`` every Kineto trace, ``off`` none;
and only a trace of at most ``critical_path_max_events`` events, since the path is found over the
events as loaded (kept while the file is read: dicts, or the bytes of a window read a column at a
time, loaded at the end) and the graph costs about as much again. A
trace over the bound is read as always, without the path (said once in the log at info). HTA leaves a
trace's last step out; its row has no path either.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.agent.sources.traces.critical_path import critical_paths
from aaco.agent.sources.traces.json_salvage import loads_lenient
from aaco.agent.sources.traces.limits import TraceLimits

COLUMNS = ("cp_length_ns", "cp_cpu_ns", "cp_compute_ns", "cp_comm_ns", "cp_launch_ns", "cp_gap_ns")
FIELDS = ("length_ns", "cpu_ns", "compute_ns", "comm_ns", "launch_ns", "gap_ns")
log = logging.getLogger("aaco.sources.traces")


class EventKeeper:
    """The events of a trace as they stream past, while there are at most ``limits.critical_path_max_events``.

    A batch read as dicts is kept as it is; a window read a column at a time (``kineto_arrow``) as its
    bytes, parsed into events only when the path is wanted (``events``): a trace over the bound never
    pays for them.
    """

    def __init__(self, limits: TraceLimits) -> None:
        self.on = limits.critical_path != "off"
        self.cap = limits.critical_path_max_events
        self._kept: list[list[Any] | bytes] | None = [] if self.on else None
        self.seen = 0

    def keep(self, batch: list[Any] | memoryview, n: int | None = None) -> None:
        """Keep a batch (in file order; a buffer: a window of ``n`` events, copied), or let all go past the bound."""
        self.seen += len(batch) if n is None else n
        if self._kept is None:
            return
        if self.seen > self.cap:
            self._kept = None
            return
        self._kept.append(bytes(batch) if isinstance(batch, memoryview) else batch)

    @property
    def events(self) -> list[Any] | None:
        """The events kept, in file order (None: off, over the bound, or a window that does not read back)."""
        if self._kept is None:
            return None
        out: list[Any] = []
        for batch in self._kept:
            events = loads_lenient(b"[" + batch + b"]") if isinstance(batch, bytes) else batch
            if not isinstance(events, list):  # Arrow read it, the standard library could not (nesting)
                return None
            out.extend(events)
        return out


def with_critical_paths(iterations: pa.Table, keeper: EventKeeper, limits: TraceLimits, distributed: bool) -> pa.Table:
    """``iterations`` with the cp_* columns of the steps HTA's critical path finds (see the module doc)."""
    if not keeper.on or iterations.num_rows == 0 or (limits.critical_path == "ranks" and not distributed):
        return iterations
    events = keeper.events
    if events is None:
        log.info("no critical path: %d events, over critical_path_max_events (%d)", keeper.seen, keeper.cap)
        return iterations
    by_step = {p.name: p for p in critical_paths(events)}
    names = iterations.column("name").to_pylist()
    found = [by_step.get(n) for n in names]
    out = iterations
    for column, attr in zip(COLUMNS, FIELDS, strict=True):
        values = np.array([getattr(p, attr) if p is not None else 0 for p in found], dtype=np.int64)
        mask = np.array([p is None for p in found])
        array = pa.array(values, pa.int64(), mask=mask)
        i = out.schema.get_field_index(column)
        out = out.set_column(i, column, array) if i >= 0 else out.append_column(column, array)
    return out
