"""Trace assembly: off-CPU intervals of the iteration's process become span events on its root."""

from __future__ import annotations

import pyarrow as pa
from opentelemetry.proto.trace.v1 import trace_pb2

from aaco.contract.schemas import conform
from aaco.contract.stats import Stats
from aaco.exporters.otlp_assembly import TraceAssembler

from .builders import NODE, item, iterations

MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def sched(intervals, pid=1):
    """Off-CPU rows (start_ns, end_ns, tid) for ``pid``, as the sched source publishes them."""
    n = len(intervals)
    return item(
        "sched",
        conform(
            "sched",
            pa.table(
                {
                    "ts_ns": pa.array([e for _, e, _ in intervals], pa.int64()),
                    "node": [NODE] * n,
                    "pid": pa.array([pid] * n, pa.int64()),
                    "tid": pa.array([t for _, _, t in intervals], pa.int64()),
                    "metric": ["offcpu"] * n,
                    "value": pa.array([(e - s) / 1e9 for s, e, _ in intervals], pa.float64()),
                    "offcpu_start_ns": pa.array([s for s, _, _ in intervals], pa.int64()),
                    "offcpu_end_ns": pa.array([e for _, e, _ in intervals], pa.int64()),
                }
            ),
        ),
    )


def roots(encoded: list[bytes]) -> list[trace_pb2.Span]:
    spans = [trace_pb2.Span.FromString(b) for b in encoded]
    return [s for s in spans if not s.parent_span_id]


def attr(span: trace_pb2.Span, key: str):
    for kv in span.attributes:
        if kv.key == key:
            v = kv.value
            return v.int_value if v.HasField("int_value") else v.string_value
    return None


def test_offcpu_intervals_inside_an_iteration_become_events_on_its_root():
    clock = Clock()
    asm = TraceAssembler(NODE, Stats(), window_s=1.0, clock=clock)
    # Iteration 0 spans [0, 10 ms), iteration 1 [10, 20 ms), both of pid 1.
    asm.add(sched([(2 * MS, 3 * MS, 11), (9 * MS, 12 * MS, 12), (30 * MS, 31 * MS, 11)]))
    asm.add(sched([(1 * MS, 5 * MS, 99)], pid=2))  # another process: never on these roots
    out = asm.add(item("iterations", iterations([(0, 10 * MS), (10 * MS, 20 * MS)], pid=1)))
    clock.now += 5
    out += asm.expire()
    out += asm.close_all()
    by_start = {r.start_time_unix_nano: r for r in roots(out)}
    assert set(by_start) == {0, 10 * MS}
    first, second = by_start[0], by_start[10 * MS]
    # [2, 3) ms inside; [9, 12) ms straddles both: it counts 1 ms in the first and 2 ms in the second.
    assert attr(first, "aaco.offcpu.count") == 2
    assert attr(first, "aaco.offcpu.ns") == 1 * MS + 1 * MS
    assert [(e.name, e.time_unix_nano) for e in first.events] == [("off-cpu", 2 * MS), ("off-cpu", 9 * MS)]
    threads = [next(kv.value.int_value for kv in e.attributes if kv.key == "thread.id") for e in first.events]
    assert threads == [11, 12]
    assert attr(second, "aaco.offcpu.count") == 1
    assert attr(second, "aaco.offcpu.ns") == 2 * MS


def test_roots_without_offcpu_data_carry_no_offcpu_attributes():
    clock = Clock()
    asm = TraceAssembler(NODE, Stats(), window_s=1.0, clock=clock)
    out = asm.add(item("iterations", iterations([(0, 10 * MS)], pid=5)))
    clock.now += 5
    out += asm.close_all()
    (root,) = roots(out)
    assert attr(root, "aaco.offcpu.count") is None
    assert not root.events


def test_offcpu_memory_is_bounded_per_process_and_in_processes():
    asm = TraceAssembler(NODE, Stats(), clock=Clock())
    asm.add(sched([(i, i + 1, 1) for i in range(1500)]))
    for pid in range(2000):
        asm.add(sched([(0, 1, 1)], pid=pid + 10))
    held = asm._offcpu  # the bounds are the point of this test
    assert len(held) <= 1024
    assert all(len(q) <= 1000 for q in held.values())


def test_a_rank_of_a_job_says_so_on_its_iteration_spans():
    clock = Clock()
    asm = TraceAssembler(NODE, Stats(), window_s=1.0, clock=clock)
    job = {
        "job": ["nccl-8x-20260101T000000"],
        "rank": [3],
        "world_size": [8],
        "local_rank": [3],
        "dist_backend": ["nccl"],
    }
    out = asm.add(item("iterations", iterations([(0, 10 * MS)], **job)))
    out += asm.add(item("iterations", iterations([(20 * MS, 30 * MS)], run_id="run-2", pid=7)))  # not a job's
    clock.now += 5
    out += asm.close_all()
    ranked, plain = sorted(roots(out), key=lambda r: r.start_time_unix_nano)
    assert [attr(ranked, f"aaco.{k}") for k in ("job", "rank", "world_size", "local_rank", "dist_backend")] == [
        "nccl-8x-20260101T000000",
        3,
        8,
        3,
        "nccl",
    ]
    assert attr(plain, "aaco.job") is None and attr(plain, "aaco.rank") is None
