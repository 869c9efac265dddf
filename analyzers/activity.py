"""Device activity: the union of busy intervals over a capture's window, split compute / non-compute.

For each (node, device, run) — a run is one capture: an ORT profiling cycle, one trace file — the
window runs from the first GPU activity to the last. ``active`` is the union of every event's
interval, ``compute`` the union of kernels, ``non-compute`` the part of the active time when only
copies or memsets ran, and ``idle`` the rest of the window: the temporal breakdown of Holistic
Trace Analysis. Unions are computed streaming with a frontier per key: for intervals processed in
start order, the new busy time of an interval is what extends past the furthest end seen so far.
Batches within a run are expected in time order (sources emit them so); an interval that starts
before the frontier only adds what reaches beyond it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc
from pydantic import Field, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.analyzers.grouping import group
from aaco.analyzers.intervals import shares, union_extend
from aaco.contract.config_base import StrictModel
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define

ACTIVE_RATIO = define(
    "aaco.gpu.active_ratio",
    "aaco_device_active_ratio",
    "gauge",
    "1",
    "Share of the latest capture window in which the device ran any kernel, copy or memset.",
    ("node", "gpu"),
)
TIME_RATIO = define(
    "aaco.gpu.time_ratio",
    "aaco_device_time_ratio",
    "gauge",
    "1",
    "Temporal breakdown of the latest capture window: compute, non-compute (copies only) and idle.",
    ("node", "gpu", "state"),
)


@dataclass
class _Window:
    start: int
    end: int
    busy: int = 0
    frontier: int = -(2**62)
    compute: int = 0
    compute_frontier: int = -(2**62)
    updated: int = 0


@dataclass(frozen=True)
class ActivityWindow:
    """One device's busy time over one capture window, as shares of the window."""

    node: str
    device: str
    run_id: str
    window_start_ns: int
    window_end_ns: int
    busy_ns: int
    active_ratio: float
    compute_ratio: float
    noncompute_ratio: float
    idle_ratio: float
    seq: int  # when it was last updated (the latest window of a device is the one on /metrics)

    def ratio(self, state: str) -> float:
        """The share of the window in ``state``: compute, noncompute or idle."""
        return {"compute": self.compute_ratio, "noncompute": self.noncompute_ratio, "idle": self.idle_ratio}[state]

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "node": self.node,
            "device": self.device,
            "run_id": self.run_id,
            "window_start_ns": self.window_start_ns,
            "window_end_ns": self.window_end_ns,
            "busy_ns": self.busy_ns,
            "active_ratio": self.active_ratio,
            "compute_ratio": self.compute_ratio,
            "noncompute_ratio": self.noncompute_ratio,
            "idle_ratio": self.idle_ratio,
        }


@dataclass(frozen=True)
class ActivityResult:
    """Per (node, device, run) windows, and the latest run per device for metrics."""

    windows: tuple[ActivityWindow, ...]

    def to_dict(self) -> dict[str, Any]:
        """``{"devices": [...]}``, one entry per device and capture window."""
        return {"devices": [w.to_dict() for w in self.windows]}

    def points(self) -> list[MetricPoint]:
        """Ratios of each device's most recently updated window."""
        latest: dict[tuple[str, str], ActivityWindow] = {}
        for w in self.windows:
            key = (w.node, w.device)
            if key not in latest or w.seq > latest[key].seq:
                latest[key] = w
        pb = PointBuilder()
        for (node, device), w in latest.items():
            pb.add(ACTIVE_RATIO, w.active_ratio, node=node, gpu=device)
            for state in ("compute", "noncompute", "idle"):
                pb.add(TIME_RATIO, w.ratio(state), node=node, gpu=device, state=state)
        return pb.points


class ActivitySettings(StrictModel):
    """Device busy time per capture window."""

    max_windows: PositiveInt = Field(256, description="Capture windows tracked at once (the oldest are forgotten).")


class ActivityAnalyzer(Analyzer):
    """Streams kernel intervals into per-device busy unions."""

    name = "activity"
    kinds = frozenset({"kernels"})

    def __init__(self, max_windows: int = 256) -> None:
        self._max = max_windows
        self._windows: OrderedDict[tuple[str, str, str], _Window] = OrderedDict()
        self._seq = 0

    def update(self, item: EventBatch) -> None:
        """Fold a kernels batch in."""
        b = item.batch
        if b.num_rows == 0:
            return
        starts = b.column("start_ns").to_numpy()
        ends = b.column("end_ns").to_numpy()
        compute = pc.equal(b.column("kind"), "kernel").fill_null(False).to_numpy(zero_copy_only=False)
        groups = group(
            b.column("node"), b.column("device").fill_null("unknown"), b.column("run_id").fill_null(item.source)
        )
        for i, k in enumerate(groups.keys):
            mask = groups.mask(i)
            s, e, c = starts[mask], ends[mask], compute[mask]
            if s.size > 1 and not bool((s[1:] >= s[:-1]).all()):  # batches usually come in time order
                order = np.argsort(s, kind="stable")
                s, e, c = s[order], e[order], c[order]
            w = self._windows.pop(k, None) or _Window(int(s[0]), int(e.max()))
            w.start = min(w.start, int(s[0]))
            w.end = max(w.end, int(e.max()))
            added, w.frontier = union_extend(s, e, w.frontier)
            w.busy += added
            added_c, w.compute_frontier = union_extend(s[c], e[c], w.compute_frontier)
            w.compute += added_c
            self._seq += 1
            w.updated = self._seq
            self._windows[k] = w  # type: ignore[index]
            while len(self._windows) > self._max:
                self._windows.popitem(last=False)

    def snapshot(self) -> ActivityResult:
        """Ratios per window."""
        out = []
        for (node, device, run), w in self._windows.items():
            sh = shares(w.end - w.start, w.busy, w.compute)
            out.append(
                ActivityWindow(
                    node, device, run, w.start, w.end, w.busy, sh.active, sh.compute, sh.noncompute, sh.idle, w.updated
                )
            )
        return ActivityResult(tuple(out))


def create(s: ActivitySettings, hints: AgentHints, max_models: int) -> ActivityAnalyzer:
    """The analyzer for its settings and what the agent derives from its sources."""
    return ActivityAnalyzer(max_windows=s.max_windows)
