"""Small builders of conformed event batches, and recorders standing in for the receiver's sinks (not a test module)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from aaco.contract.ids import span_id, trace_id
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.signals import METRICS, MetricPoint

NODE = "node-a"


def _fill(n: int, cols: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, default in defaults.items():
        out[name] = cols.pop(name, [default] * n)
    out.update(cols)
    return out


def kernels(start_ns: Sequence[int], end_ns: Sequence[int] | None = None, **cols: Any) -> pa.RecordBatch:
    """A conformed kernels batch; every required column has a default (1 us kernels on node-a, pid 1)."""
    n = len(start_ns)
    if end_ns is None:
        end_ns = [s + 1000 for s in start_ns]
    cols = dict(cols)
    data = _fill(
        n,
        cols,
        {
            "node": NODE,
            "pid": 1,
            "tid": 1,
            "device": "0",
            "stream": 0,
            "name": "k",
            "kind": "kernel",
            "correlation_id": None,
            "source": "test",
        },
    )
    table = pa.table(
        {
            "start_ns": pa.array(list(start_ns), pa.int64()),
            "end_ns": pa.array(list(end_ns), pa.int64()),
            **{k: _array(k, v) for k, v in data.items()},
        }
    )
    return conform("kernels", table)


_INT_COLUMNS = {
    "pid",
    "tid",
    "stream",
    "correlation_id",
    "launch_start_ns",
    "launch_end_ns",
    "iteration",
    "graph_nodes",
    "graph_nodes_optimized",
    "bytes",
    "rank",
    "world_size",
    "local_rank",
    "collective_bytes",
    "collective_group_size",
    "collective_seq",
    "cp_length_ns",
    "cp_cpu_ns",
    "cp_compute_ns",
    "cp_comm_ns",
    "cp_launch_ns",
    "cp_gap_ns",
}


def _array(name: str, values: Any) -> pa.Array:
    if isinstance(values, pa.Array):
        return values
    return pa.array(list(values), pa.int64() if name in _INT_COLUMNS else pa.string())


def iterations(
    spans: Sequence[tuple[int, int]],
    *,
    model: str | None = "m",
    run_id: str = "run-1",
    pid: int = 1,
    node: str = NODE,
    with_ids: bool = True,
    **cols: Any,
) -> pa.RecordBatch:
    """A conformed iterations batch, one row per (start_ns, end_ns), iteration index 0.., deterministic IDs."""
    n = len(spans)
    data: dict[str, Any] = {
        "start_ns": pa.array([s for s, _ in spans], pa.int64()),
        "end_ns": pa.array([e for _, e in spans], pa.int64()),
        "node": pa.array([node] * n, pa.string()),
        "pid": pa.array([pid] * n, pa.int64()),
        "model": pa.array([model] * n, pa.string()),
        "run_id": pa.array([run_id] * n, pa.string()),
        "trace_id": pa.array([trace_id(node, run_id, i) if with_ids else None for i in range(n)], pa.string()),
        "span_id": pa.array([span_id(node, run_id, i) if with_ids else None for i in range(n)], pa.string()),
        "source": pa.array(["test"] * n, pa.string()),
        "iteration": pa.array(list(range(n)), pa.int64()),
    }
    for k, v in cols.items():
        data[k] = _array(k, v)
    return conform("iterations", pa.table(data))


def item(kind: str, batch: pa.RecordBatch, source: str = "test") -> EventBatch:
    """Wrap a batch for the bus."""
    return EventBatch(kind, batch, source)


def assert_points_valid(points: list[MetricPoint]) -> None:
    """Every point's labels are exactly its definition's, and the definition is registered."""
    for p in points:
        assert METRICS[p.metric.prom_name] is p.metric or METRICS[p.metric.prom_name] == p.metric
        assert set(p.labels) == set(p.metric.labels), (p.metric.prom_name, dict(p.labels))
        assert all(isinstance(v, str) for v in p.labels.values())


class Bus:
    """Stands in for the agent's bus: keeps what is offered."""

    def __init__(self) -> None:
        self.items: list[EventBatch] = []

    def offer(self, item: EventBatch) -> bool:
        self.items.append(item)
        return True

    def put(self, item: EventBatch, stop: Any = None, timeout_s: float | None = None) -> bool:
        return self.offer(item)


class SpanRecorder:
    """Stands in for the trace exporter's ``accept_spans``: keeps the requests the receiver hands on."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    def accept_spans(self, request: Any, spans: int, nbytes: int = 0) -> None:
        self.requests.append(request)
