"""HTA 0.5.0's critical path graph of one step of one rank, and its longest path.

``CPGraph`` in ``hta/analyzers/critical_path_analysis.py``, without pandas and networkx: the same
nodes, the same edges added in the same order, and the longest path found the way networkx's
``dag_longest_path`` finds it (so that of several paths of one length it is the one HTA reports).
docs/jobs.md, "Critical path", cites the lines each part follows.

- Nodes: the start and the end of every CPU operator, runtime and driver call, and GPU work with a
  launch (``_create_event_nodes``).
- CPU edges, per thread, by a depth-first walk of the thread's call stack (``CallStackGraph``):
  from each operator's start to its first child's start, between siblings, from its last child's
  end to its own end, each weighted by the time between and attributed to the operator it lies in;
  a weightless dependency from each top-level operator's end to the next one's start; a blocking
  call's own span (``cudaStreamSynchronize`` ...) weighs nothing (``_construct_graph_from_call_stack``).
- GPU edges, per stream in time order (``_construct_graph_from_kernels``): the work's span; from
  its launch call's start when nothing was queued on the stream (launch delay), else from the
  previous work's end (kernel-kernel delay); from GPU work to the CPU call that waits on it
  (stream, device and event syncs) and between streams (``cudaStreamWaitEvent``), weightless.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cmp_to_key
from itertools import pairwise
from typing import Any

from aaco.agent.sources.traces.critical_path_sync import SyncTables
from aaco.agent.sources.traces.critical_path_trace import DEVICE_SYNCS, CpTrace, CriticalPathError, Ev, unstable_order

OPERATOR = "critical_path_operator"
DEPENDENCY = "critical_path_dependency"
LAUNCH_DELAY = "critical_path_kernel_launch_delay"
KERNEL_DELAY = "critical_path_kernel_kernel_delay"
SYNC = "critical_path_sync_dependency"

NODE_CATS = frozenset({"cpu_op", "cuda_runtime", "cuda_driver"})
BLOCKING = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventQuery",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpyAsync",
    }
)
_START, _END = 1, -1


@dataclass(frozen=True, slots=True)
class Edge:
    """``CPEdge``: its type and its weight as added (the path's breakdown reads this weight)."""

    type: str
    weight: Any


@dataclass(frozen=True, slots=True)
class PathEdge:
    """An edge of the critical path and the event it is attributed to (None for zero-weight links)."""

    type: str
    weight: Any
    event: Ev | None


def _compare(x: tuple, y: tuple) -> Any:
    """``compare_events`` (hta/common/call_stack.py): the order of a thread's starts and ends."""
    if x[0] == y[0]:
        return -1 if x[3] == _START else 1
    result = x[1] - y[1]
    if result == 0:
        if x[3] == y[3]:
            if x[2] == y[2]:
                lt = -1 if x[3] == _START else 1
                result = lt if x[0] < y[0] else -lt if x[0] > y[0] else 0
            elif x[3] == _START:
                result = 1 if x[2] < y[2] else -1
            else:
                result = -1 if x[2] < y[2] else 1
        elif x[2] > 0 and y[2] > 0:
            result = 1 if x[3] == _START else -1
        elif x[2] == 0 and y[2] == 0:
            result = x[0] - y[0]
        else:
            result = -1 if x[3] == _START else 1
    return result


def _call_tree(rows: list[Ev]) -> tuple[dict[int, int], dict[int, list[int]]]:
    """``CallStackGraph._construct_call_stack_graph``: parent and children of a thread's events."""
    events = []
    for r in rows:
        d = max(r.dur, 0)
        events.append((r.idx, r.ts, d, _START))
        events.append((r.idx, r.ts + d, d, _END))
    events.sort(key=cmp_to_key(_compare))
    parent: dict[int, int] = {}
    children: dict[int, list[int]] = {-1: []}
    stack: list[int] = []
    for idx, _, _, kind in events:
        if kind == _START:
            p = stack[-1] if stack else -1
            if idx not in parent:  # HTA logs a repeated node and keeps the first
                children[p].append(idx)
                parent[idx] = p
                children[idx] = []
            stack.append(idx)
        elif stack:
            stack.pop()
    return parent, children


def _group_key(key: tuple[Any, Any]) -> tuple[str, Any, str, Any]:
    a, b = key
    return (type(a).__name__, a, type(b).__name__, b)


class Graph:
    """The graph of one clipped step (``CPGraph.__init__`` .. ``_construct_graph``)."""

    def __init__(
        self,
        t: CpTrace,
        clipped: list[Ev],
        tables: SyncTables,
        *,
        zero_weight_launch: bool = False,
        gap_limit: Any = None,
    ):
        self.t = t
        self.gap_limit = gap_limit
        self.tables = tables
        self.zero_weight_launch = zero_weight_launch
        self.clipped = {ev.idx: ev for ev in clipped}
        # networkx's DiGraph as HTA fills it: nodes in order of first use, succ/pred in edge order
        self.nodes: dict[int, None] = {}
        self.succ: dict[int, dict[int, Edge]] = {}
        self.pred: dict[int, dict[int, Edge]] = {}
        self.attributed: dict[tuple[int, int], int] = {}
        self._create_nodes(clipped)
        self._cpu_edges(clipped)
        self._gpu_edges(clipped)

    # --- nodes and edges ---------------------------------------------------------------------------

    def _create_nodes(self, clipped: list[Ev]) -> None:
        evs = [ev for ev in clipped if ev.cat in NODE_CATS or (ev.stream != -1 and ev.ic >= 0)]
        keys = [ev.ts for ev in evs] + [ev.ts + ev.dur for ev in evs]
        n = len(evs)
        self.node_ev: list[Ev] = [evs[0]] * len(keys) if evs else []
        self.node_ts: list[Any] = [0] * len(keys)
        self.node_start: list[bool] = [False] * len(keys)
        self.start_of: dict[int, int] = {}
        self.end_of: dict[int, int] = {}
        for node, k in enumerate(unstable_order(keys)):  # node ids as HTA numbers them (by time)
            ev = evs[k % n]
            self.node_ev[node], self.node_ts[node], self.node_start[node] = ev, keys[k], k < n
            (self.start_of if k < n else self.end_of)[ev.idx] = node

    def _nodes_for(self, idx: int) -> tuple[int | None, int | None]:
        return self.start_of.get(idx), self.end_of.get(idx)

    def _add(self, u: int, v: int, kind: str, zero_weight: bool = False) -> Edge:
        """``_add_edge_helper``: networkx keeps the first position of an edge added twice, the last data."""
        if u == v:
            raise CriticalPathError("an edge from a node to itself")
        weight = 0 if kind in (DEPENDENCY, SYNC) or zero_weight else self.node_ts[v] - self.node_ts[u]
        e = Edge(kind, weight)
        for x in (u, v):
            if x not in self.nodes:
                self.nodes[x] = None
                self.succ[x] = {}
                self.pred[x] = {}
        self.succ[u][v] = e
        self.pred[v][u] = e
        return e

    def _attribute(self, u: int, v: int, e: Edge, src_parent: int | None) -> None:
        """``_attribute_edge``: the event an operator span or a kernel-kernel delay belongs to."""
        if e.type not in (OPERATOR, KERNEL_DELAY):
            return
        if e.type == KERNEL_DELAY or self.node_start[u]:
            ev = self.node_ev[u].idx
        elif not self.node_start[v]:
            ev = self.node_ev[v].idx
        else:
            ev = src_parent if src_parent is not None else -1
        self.attributed[(u, v)] = ev

    # --- CPU threads -------------------------------------------------------------------------------

    def _cpu_edges(self, clipped: list[Ev]) -> None:
        """``_construct_graph_from_call_stacks``: every CPU thread's call stack, threads by (pid, tid)."""
        groups: dict[tuple[Any, Any], list[Ev]] = {}
        for ev in clipped:
            if ev.pid is not None and ev.tid is not None:
                groups.setdefault((ev.pid, ev.tid), []).append(ev)
        for key in sorted(groups, key=_group_key):
            rows = groups[key]
            if any(r.stream > 0 for r in rows):
                continue  # a GPU stream (CallGraph keeps its stream > 0 rows: never a CPU stack)
            if all(r.stream < 0 for r in rows):
                self._walk(*_call_tree(rows))

    def _walk(self, parent: dict[int, int], children: dict[int, list[int]]) -> None:
        """``_construct_graph_from_call_stack``: enter and exit each event depth first."""
        last_node: int | None = None
        last_highlevel: int | None = None
        last_parent: int | None = None
        depth = 0
        # iterative form of _dfs_traverse_node; the root (-1) has no nodes
        stack: list[tuple[int, int]] = [(-1, 0)]
        while stack:
            ev_id, i = stack[-1]
            kids = children[ev_id]
            if i < len(kids):
                stack[-1] = (ev_id, i + 1)
                child = kids[i]
                stack.append((child, 0))
                start, end = self._nodes_for(child)
                if start is None or end is None:
                    continue
                if depth == 0 and last_highlevel is not None:
                    self._add(last_highlevel, start, DEPENDENCY)
                depth += 1
                if last_node is not None:
                    self._attribute(last_node, start, self._add(last_node, start, OPERATOR), last_parent)
                last_node, last_parent = start, parent[child]
                continue
            stack.pop()
            if ev_id < 0:
                continue
            start, end = self._nodes_for(ev_id)
            if start is None or end is None:
                continue
            depth -= 1
            if last_node is not None:
                blocking = self.node_ev[start].name in BLOCKING
                self._attribute(last_node, end, self._add(last_node, end, OPERATOR, blocking), last_parent)
            if depth == 0:
                last_node, last_highlevel = None, end
            else:
                last_node, last_parent = end, parent[ev_id]

    # --- GPU streams -------------------------------------------------------------------------------

    def _gpu_edges(self, clipped: list[Ev]) -> None:
        """``_construct_graph_from_kernels``: GPU work and syncs, by start (syncs by end)."""
        rows = [ev for ev in clipped if (ev.stream != -1 or ev.name in DEVICE_SYNCS) and ev.ic >= 0]
        keys = [ev.ts + ev.dur if ev.cat == "cuda_sync" else ev.ts for ev in rows]
        self.last: dict[int, int] = {}  # stream -> end node of its last work
        self.kernel_sync: dict[int, int | None] = {}  # dest GPU event -> GPU event it waits on
        queue = self.tables.queue
        for k in unstable_order(keys):
            ev = rows[k]
            if ev.cat == "cuda_sync":
                self._sync(ev)
            else:
                self._work(ev, queue.get(ev.ic), queue.get(ev.idx))

    def _work(self, ev: Ev, queued_at_launch: int | None, queued_at_start: int | None) -> None:
        start, end = self._nodes_for(ev.idx)
        if start is None or end is None:
            raise CriticalPathError(f"GPU event {ev.idx} has no nodes")
        self._attribute(start, end, self._add(start, end, OPERATOR), -1)
        stream, last = ev.stream, self.last.get(ev.stream)
        sync_src = self.kernel_sync.get(ev.idx)
        sync_end: int | None = None
        launch_added = False
        if sync_src is not None:
            _, sync_end = self._nodes_for(sync_src)
            if sync_end is None:
                sync_src = None
            else:
                self._add(sync_end, start, SYNC)
            self.kernel_sync[ev.idx] = None
        if (
            queued_at_launch == 1
            and queued_at_start == 0
            and (last is None or self.node_ts[last] < self._runtime_ts(ev))
            and (sync_end is None or self.node_ts[sync_end] < self._runtime_ts(ev))
        ):
            if not self._launch_edge(ev.ic, start):
                raise CriticalPathError(f"the launch of GPU event {ev.idx} has no nodes")
            launch_added = True
        elif (
            last is not None
            and (self.gap_limit is None or self.node_ts[start] - self.node_ts[last] < self.gap_limit)
            and (sync_end is None or self.node_ts[sync_end] < self.node_ts[last])
        ):
            self._attribute(last, start, self._add(last, start, KERNEL_DELAY), -1)
        if self.zero_weight_launch and not launch_added:
            self._launch_edge(ev.ic, start, zero_weight=True)
        self.last[stream] = end

    def _runtime_ts(self, ev: Ev) -> Any:
        runtime = self.t.by_idx.get(ev.ic)
        if runtime is None:
            raise CriticalPathError(f"the launch of GPU event {ev.idx} is not in the trace")
        return runtime.ts

    def _launch_edge(self, runtime_idx: int, start: int, zero_weight: bool = False) -> bool:
        runtime_start, _ = self._nodes_for(runtime_idx)
        if runtime_start is None:
            return False
        self._add(runtime_start, start, LAUNCH_DELAY, zero_weight)
        return True

    def _cpu_waits_on(self, gpu_node: int, runtime_idx: int) -> None:
        _, end = self._nodes_for(runtime_idx)
        if end is None:
            raise CriticalPathError(f"the call waiting on GPU work ({runtime_idx}) has no nodes")
        self._add(gpu_node, end, SYNC)

    def _sync(self, ev: Ev) -> None:
        """``handle_cuda_sync``: which GPU work a sync event makes the CPU, or another stream, wait on."""
        if ev.name in ("Stream Wait Event", "Event Sync"):
            prev = self.tables.record_prev_launch
            launch = -1 if prev is None else prev.get(ev.wait_corr, -1)
            if launch == -1:
                return
            src_kernel = self.t.by_idx[launch].ic
            if ev.name == "Stream Wait Event":
                waits = self.tables.wait_next_launch
                if waits is None or ev.ic not in waits:
                    raise CriticalPathError(f"no cudaStreamWaitEvent for {ev.idx}")
                dest_launch = waits[ev.ic]
                if dest_launch >= 0:
                    self.kernel_sync[self.t.by_idx[dest_launch].ic] = src_kernel
            else:
                _, gpu_end = self._nodes_for(src_kernel)
                if gpu_end is not None:
                    self._cpu_waits_on(gpu_end, ev.ic)
            return
        if ev.name == "Context Sync":
            nodes: list[int | None] = list(self.last.values())
        elif ev.name == "Stream Sync":
            nodes = [self.last.get(ev.stream)]
        else:
            raise CriticalPathError(f"unknown sync event {ev.name!r}")
        for node in nodes:
            if node is not None:
                self._cpu_waits_on(node, ev.ic)

    # --- the longest path --------------------------------------------------------------------------

    def _validate(self) -> None:
        """``_validate_graph``: no sync between two events of one stream (negative weights count as 0)."""
        for u, outs in self.succ.items():
            for v, e in outs.items():
                if e.type == SYNC:
                    s = self.clipped[self.node_ev[u].idx].stream
                    if s != -1 and s == self.clipped[self.node_ev[v].idx].stream:
                        raise CriticalPathError("a sync between two events of one stream")

    def _topological(self) -> list[int]:
        """The order of networkx ``topological_sort`` (by generations, in node and successor order)."""
        indegree = {v: len(self.pred[v]) for v in self.nodes if self.pred[v]}
        zero = [v for v in self.nodes if not self.pred[v]]
        out: list[int] = []
        while zero:
            generation, zero = zero, []
            for node in generation:
                for child in self.succ[node]:
                    indegree[child] -= 1
                    if indegree[child] == 0:
                        zero.append(child)
                        del indegree[child]
            out.extend(generation)
        if indegree:
            raise CriticalPathError("the graph has a cycle")
        return out

    def longest_path(self) -> list[PathEdge]:
        """``critical_path``: networkx ``dag_longest_path`` on weights where -1 and below count as 0."""
        self._validate()
        dist: dict[int, tuple[Any, int]] = {}
        for v in self._topological():
            best: tuple[Any, int] | None = None
            for u, e in self.pred[v].items():
                cand = dist[u][0] + (0 if e.weight <= -1 else e.weight)
                if best is None or cand > best[0]:
                    best = (cand, u)
            dist[v] = best if best is not None and best[0] >= 0 else (0, v)
        if not dist:
            raise CriticalPathError("the step has no edges")
        end = max(dist, key=lambda x: dist[x][0])
        path = [end]
        while dist[path[-1]][1] != path[-1]:
            path.append(dist[path[-1]][1])
        path.reverse()
        if len(path) < 2:
            raise CriticalPathError("the critical path has a single node")
        out = []
        for u, v in pairwise(path):
            e = self.succ[u][v]
            ev = self.attributed.get((u, v))
            out.append(PathEdge(e.type, e.weight, None if ev is None else self.clipped.get(ev)))
        self.path_nodes = path
        return out
