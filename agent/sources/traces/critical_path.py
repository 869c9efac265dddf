"""The critical path of each step of one rank, as Holistic Trace Analysis 0.5.0 finds it.

HTA's lightweight critical path (``TraceAnalysis.critical_path_analysis``, ``CPGraph`` in
``hta/analyzers/critical_path_analysis.py``) builds a graph of one step's CPU operators, runtime
calls, GPU work and synchronisations, and takes its longest path. The path's edges are spans of
CPU operators and calls, spans of GPU work, kernel launch delays (launch call to kernel start),
kernel-kernel delays (one stream's gap between two kernels) and weightless dependencies (between
top-level operators; a sync from GPU work to the CPU call or stream waiting on it). HTA's breakdown
(``get_critical_path_breakdown``, ``bound_by``) sorts them into CPU, GPU compute, GPU communication
(NCCL/RCCL kernels), launch overhead and kernel-kernel overhead; ``CriticalPath`` carries those five
times, which add up to the path's length.

``critical_paths(events)`` takes one rank's ``traceEvents`` as loaded and needs nothing else from
the file. The graph and the path are HTA's, tie for tie (``critical_path_trace``, the frame HTA
reads; ``critical_path_sync``, its whole-trace tables; ``critical_path_graph``, the graph and its
longest path); docs/jobs.md, "Critical path", cites the lines followed. HTA works in whole
microseconds (it rounds fractional timestamps inwards), so the times here are multiples of 1000 ns.

Where HTA fails on a step (an assertion, a sync between two events of one stream, a cycle), the
step has no path here (None, or no entry in ``critical_paths``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from aaco.agent.sources.traces.critical_path_graph import (
    DEPENDENCY,
    KERNEL_DELAY,
    LAUNCH_DELAY,
    OPERATOR,
    SYNC,
    Graph,
    PathEdge,
)
from aaco.agent.sources.traces.critical_path_sync import SyncTables, sync_tables
from aaco.agent.sources.traces.critical_path_trace import STEP, CpTrace, CriticalPathError, Ev, load_trace

_MEMORY = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
_COMM = re.compile(r"^nccl.*Kernel")  # hta.utils.utils.is_comm_kernel (RCCL's kernels are named nccl* too)


@dataclass(frozen=True, slots=True)
class CriticalPath:
    """One step's critical path: its length and where that time went (HTA's ``bound_by``)."""

    name: str  # the annotation the step is ("ProfilerStep#12"); "" for a whole trace
    event: int  # the annotation's position in traceEvents (-1 for a whole trace)
    instance: int  # HTA's instance_id of the annotation
    length_ns: int  # = cpu + compute + comm + launch + gap
    cpu_ns: int  # cpu_bound: CPU operators and runtime calls
    compute_ns: int  # gpu_compute_bound: kernels, copies and sets other than communication
    comm_ns: int  # gpu_communication_bound: NCCL/RCCL kernels
    launch_ns: int  # gpu_kernel_launch_overhead: launch call start to kernel start
    gap_ns: int  # gpu_kernel_kernel_overhead: a stream's gap between consecutive kernels
    nodes: int  # nodes on the path (HTA's len(critical_path_nodes))
    events: tuple[int, ...]  # positions in traceEvents of the events on the path (critical_path_events_set)

    @property
    def wait_ns(self) -> int:
        """Time the path spends waiting for the GPU to start work: launch and kernel-kernel delays."""
        return self.launch_ns + self.gap_ns

    def shares(self) -> dict[str, float]:
        """Each category's fraction of the length (all 0 for an empty path)."""
        parts = {
            "cpu": self.cpu_ns,
            "compute": self.compute_ns,
            "comm": self.comm_ns,
            "launch": self.launch_ns,
            "gap": self.gap_ns,
        }
        return {k: (v / self.length_ns if self.length_ns else 0.0) for k, v in parts.items()}


def shorten_name(name: str) -> str:
    """``hta.utils.utils.shorten_name``: a kernel or operator name without arguments and templates."""
    if _MEMORY.match(name) is not None or ("<" not in name and "(" not in name):
        return name
    stack: list[str] = []
    for c in name.replace("->", ""):
        close = {">": "<", ")": "("}.get(c)
        if close is None:
            stack.append(c)
            continue
        while stack and stack[-1] != close:
            stack.pop()
        if stack:
            stack.pop()
    return "".join(stack).split(" ")[-1]


@lru_cache(maxsize=4096)
def is_comm_kernel(name: str) -> bool:
    """HTA's communication kernels: a shortened name ``nccl...Kernel...``."""
    return "nccl" in name and _COMM.match(shorten_name(name)) is not None


def _us_to_ns(us: Any) -> int:
    return round(us * 1000)


class CriticalPathAnalysis:
    """HTA's ``TraceAnalysis`` for one rank, reduced to the critical path: load once, ask per step."""

    def __init__(
        self,
        events: Sequence[Mapping[str, Any]],
        *,
        include_last_step: bool = False,
        zero_weight_launch_edges: bool = False,
        kernel_gap_limit_us: float | None = None,
        fractional: bool | None = None,
    ) -> None:
        """``events``: the trace's ``traceEvents`` in file order (an event's index is its position).

        ``include_last_step`` is HTA's ``include_last_profiler_step`` (by default HTA drops the
        trace's last ``ProfilerStep``, whose GPU work may be cut off); ``zero_weight_launch_edges``
        is HTA's ``CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE=1``; ``kernel_gap_limit_us`` is the limit
        HTA put on kernel-kernel delays after 0.5.0 (``KERNEL_KERNEL_DELAY_THRESHOLD_US``, 1500 in
        0.6: a longer gap is no delay edge); ``fractional`` says whether the trace has fractional
        timestamps (read from ``events`` when None).
        """
        self.trace: CpTrace = load_trace(events, include_last_step=include_last_step, fractional=fractional)
        self.zero_weight_launch_edges = zero_weight_launch_edges
        self.kernel_gap_limit_us = kernel_gap_limit_us
        self._tables: SyncTables | None = None
        self._tables_error = False
        self._cpu_by_ic = self.trace.cpu_by_ic()

    def instances(self, annotation: str = STEP) -> list[Ev]:
        """The events HTA numbers as instances of ``annotation`` (names containing it, frame order)."""
        return [r for r in self.trace.rows if annotation in r.name]

    def _sync_tables(self) -> SyncTables | None:
        if self._tables is None and not self._tables_error:
            try:
                self._tables = sync_tables(self.trace)
            except CriticalPathError:
                self._tables_error = True
        return self._tables

    def _window(self, annotation: str, first: int, last: int) -> tuple[Any, Any, Ev | None] | None:
        """``critical_path_analysis``: the time window of instances ``first`` .. ``last``."""
        t = self.trace
        if not t.rows or not any(annotation in s for s in t.symbols):
            return None
        if annotation == "":  # HTA's whole trace: its unshifted end column bounds nothing
            return min(r.ts for r in t.rows), max(r.end_raw for r in t.rows), None
        chosen = self.instances(annotation)[first : last + 1]
        if not chosen:
            return None
        return min(r.ts for r in chosen), max(r.ts + r.dur for r in chosen), chosen[0]

    def _clip(self, start: Any, end: Any) -> list[Ev]:
        """The step's events: CPU events starting in the window, GPU work launched from one.

        Every ``Stream Wait Event`` of the trace comes along, as in HTA.
        """
        keep = []
        for r in self.trace.rows:
            if r.stream == -1:
                if start <= r.ts <= end and r.dur > 0:
                    keep.append(r)
            elif r.name == "Stream Wait Event" or any(
                start <= c.ts <= end and c.dur > 0 for c in self._cpu_by_ic.get(r.idx, ())
            ):
                keep.append(r)
        return sorted(keep, key=lambda r: r.idx)

    def path_edges(
        self, annotation: str = STEP, instance: int | tuple[int, int] | None = 0
    ) -> tuple[Graph, list[PathEdge], Ev | None] | None:
        """HTA's ``critical_path_analysis(rank, annotation, instance_id)``; None where HTA fails.

        The graph, its critical path's edges in order, and the annotation event (None for a whole
        trace).
        """
        first, last = (0, 0) if instance is None else (instance, instance) if isinstance(instance, int) else instance
        window = self._window(annotation, first, last)
        tables = self._sync_tables()
        if window is None or tables is None:
            return None
        start, end, ann = window
        try:
            graph = Graph(
                self.trace,
                self._clip(start, end),
                tables,
                zero_weight_launch=self.zero_weight_launch_edges,
                gap_limit=self.kernel_gap_limit_us,
            )
            return graph, graph.longest_path(), ann
        except CriticalPathError:
            return None

    def path(self, annotation: str = STEP, instance: int | tuple[int, int] | None = 0) -> CriticalPath | None:
        """The path of ``path_edges`` summed by HTA's ``bound_by``; None where HTA fails."""
        solved = self.path_edges(annotation, instance)
        if solved is None:
            return None
        graph, edges, ann = solved
        try:
            times = _breakdown(edges)
        except CriticalPathError:
            return None
        return CriticalPath(
            name="" if ann is None else ann.name,
            event=-1 if ann is None else ann.idx,
            instance=(0 if instance is None else instance if isinstance(instance, int) else instance[0]),
            length_ns=sum(times.values()),
            cpu_ns=times["cpu"],
            compute_ns=times["compute"],
            comm_ns=times["comm"],
            launch_ns=times["launch"],
            gap_ns=times["gap"],
            nodes=len(graph.path_nodes),
            events=tuple(sorted({graph.node_ev[n].idx for n in graph.path_nodes})),
        )


def _breakdown(edges: list[PathEdge]) -> dict[str, int]:
    """``get_critical_path_breakdown`` summed by ``bound_by``, in ns (the edges' weights as added)."""
    us = {"cpu": 0, "compute": 0, "comm": 0, "launch": 0, "gap": 0}
    for e in edges:
        if e.type == KERNEL_DELAY:
            us["gap"] += e.weight
        elif e.type == LAUNCH_DELAY:
            us["launch"] += e.weight
        elif e.type in (DEPENDENCY, SYNC):
            continue  # weightless links: HTA's bound_by ""
        elif e.type == OPERATOR:
            if e.event is None:
                raise CriticalPathError("an operator edge attributed to no event")  # HTA asserts
            key = "cpu" if e.event.stream < 0 else "comm" if is_comm_kernel(e.event.name) else "compute"
            us[key] += e.weight
    return {k: _us_to_ns(v) for k, v in us.items()}


def critical_paths(
    events: Sequence[Mapping[str, Any]],
    *,
    annotation: str = STEP,
    include_last_step: bool = False,
    zero_weight_launch_edges: bool = False,
    kernel_gap_limit_us: float | None = None,
) -> list[CriticalPath]:
    """Per step of one rank: the critical path of each CPU ``annotation`` instance HTA can analyse.

    Steps are the annotation's CPU events (a ``gpu_user_annotation`` of the same name is HTA's
    instance too, but not a step); each keeps HTA's instance number. By default the trace's last
    ``ProfilerStep`` is left out, as HTA leaves it out.
    """
    a = CriticalPathAnalysis(
        events,
        include_last_step=include_last_step,
        zero_weight_launch_edges=zero_weight_launch_edges,
        kernel_gap_limit_us=kernel_gap_limit_us,
    )
    out = []
    for i, ev in enumerate(a.instances(annotation)):
        if ev.cat != "gpu_user_annotation" and (p := a.path(annotation, i)) is not None:
            out.append(p)
    return out
