"""The correlator: kernels get their iteration's trace context by (node, pid) time containment."""

from __future__ import annotations

import pyarrow as pa
import pytest

from aaco.agent.pipeline.correlator import CORRELATED, Correlator
from aaco.contract.ids import span_id, trace_id
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.stats import EVENTS_EMITTED, EVENTS_RECEIVED, Stats

from .builders import NODE, item, iterations, kernels

# Two iterations of pid 1: [1000, 2000] and [3000, 4000].
SPANS = [(1000, 2000), (3000, 4000)]
T0, T1 = trace_id(NODE, "run-1", 0), trace_id(NODE, "run-1", 1)
S0, S1 = span_id(NODE, "run-1", 0), span_id(NODE, "run-1", 1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def stats() -> Stats:
    return Stats()


@pytest.fixture
def corr(stats, clock) -> Correlator:
    c = Correlator(stats, hold_s=2.0, clock=clock)
    out = c.process(item("iterations", iterations(SPANS, model="resnet")))
    assert len(out) == 1
    return c


def rows(out: list[EventBatch]) -> list[dict]:
    assert all(b.kind == "kernels" for b in out)
    return [r for b in out for r in b.batch.to_pylist()]


def by_name(out: list[EventBatch]) -> dict[str, dict]:
    return {r["name"]: r for r in rows(out)}


def outcomes(stats: Stats) -> tuple[float, float]:
    return stats.get(CORRELATED, outcome="matched"), stats.get(CORRELATED, outcome="unmatched")


def test_matches_by_time_containment(corr, stats):
    out = corr.process(item("kernels", kernels([1500, 3000, 4000], name=["a", "b", "c"])))
    got = by_name(out)
    assert got["a"]["trace_id"] == T0
    assert got["a"]["parent_span_id"] == S0
    assert got["a"]["iteration"] == 0
    assert got["a"]["model"] == "resnet"
    assert got["a"]["run_id"] == "run-1"
    # iteration bounds are inclusive
    assert got["b"]["trace_id"] == T1
    assert got["c"]["trace_id"] == T1
    assert got["c"]["iteration"] == 1
    assert outcomes(stats) == (3, 0)
    assert corr.pending_events == 0


def test_launch_time_wins_over_gpu_start(corr, stats):
    # GPU work runs after its launching iteration ended: the launch decides.
    out = corr.process(
        item(
            "kernels",
            kernels(
                [2500, 2500, 1500],
                name=["launched-in-0", "no-launch-in-gap", "launched-in-1"],
                launch_start_ns=[1900, None, 3100],
            ),
        )
    )
    got = by_name(out)
    assert got["launched-in-0"]["trace_id"] == T0
    assert got["launched-in-1"]["trace_id"] == T1
    assert got["no-launch-in-gap"]["trace_id"] is None
    assert got["no-launch-in-gap"]["iteration"] is None
    assert got["no-launch-in-gap"]["parent_span_id"] is None
    assert outcomes(stats) == (2, 1)


def test_kernel_before_first_iteration_is_unmatched_immediately(corr, stats):
    out = corr.process(item("kernels", kernels([10])))
    assert rows(out)[0]["trace_id"] is None
    assert corr.pending_events == 0
    assert outcomes(stats) == (0, 1)


def test_output_keeps_schema_and_other_columns(corr):
    src = kernels([1500, 2500], name=["a", "b"], stream=[3, 4], device=["1", "2"])
    out = corr.process(item("kernels", src, source="kin"))
    assert len(out) == 1
    assert out[0].source == "kin"
    assert out[0].batch.schema == src.schema
    for col in ("start_ns", "end_ns", "name", "stream", "device", "pid"):
        assert out[0].batch.column(col).equals(src.column(col))


def test_source_provided_run_id_is_kept(corr):
    out = corr.process(item("kernels", kernels([1500], run_id=["from-source"])))
    r = rows(out)[0]
    assert r["run_id"] == "from-source"
    assert r["trace_id"] == T0
    assert r["model"] == "resnet"


def test_source_provided_trace_context_passes_unchanged(corr, stats):
    b = kernels([10, 20], trace_id=["a" * 32, "b" * 32], parent_span_id=["c" * 16, "d" * 16])
    out = corr.process(item("kernels", b))
    assert len(out) == 1
    assert out[0].batch.equals(b)
    assert outcomes(stats) == (2, 0)


def test_other_pid_and_other_node_do_not_match(stats, clock):
    c = Correlator(stats, hold_s=0.0, clock=clock)
    c.process(item("iterations", iterations(SPANS)))
    out = c.process(
        item("kernels", kernels([1500, 1500], name=["other-pid", "other-node"], pid=[2, 1], node=[NODE, "b"]))
    )
    got = by_name(out)
    assert got["other-pid"]["trace_id"] is None
    assert got["other-node"]["trace_id"] is None
    assert outcomes(stats) == (0, 2)


def test_kernels_of_a_process_without_iterations_go_on_at_once(corr, stats, clock):
    """No iteration of pid 99 is known: there is nothing to wait for, so nothing is held."""
    out = corr.process(item("kernels", kernels([1500], pid=[99])))
    assert rows(out)[0]["trace_id"] is None
    assert rows(out)[0]["pid"] == 99
    assert corr.pending_events == 0
    assert outcomes(stats) == (0, 1)


def test_newer_kernels_held_then_released_unmatched_after_hold(corr, stats, clock):
    out = corr.process(item("kernels", kernels([1500, 5000, 6000], name=["now", "later1", "later2"])))
    assert [r["name"] for r in rows(out)] == ["now"]
    assert corr.pending_events == 2
    assert outcomes(stats) == (1, 0)
    # a later unrelated batch does not release them before hold_s
    clock.now += 1.0
    out = corr.process(item("telemetry", _telemetry()))
    assert [b.kind for b in out] == ["telemetry"]
    assert corr.pending_events == 2
    clock.now += 1.0  # exactly hold_s after: due
    out = corr.process(item("telemetry", _telemetry()))
    assert [b.kind for b in out] == ["telemetry", "kernels"]
    released = rows(out[1:])
    assert [r["name"] for r in released] == ["later1", "later2"]
    assert all(r["trace_id"] is None for r in released)
    assert corr.pending_events == 0
    assert outcomes(stats) == (1, 2)


def test_held_kernels_match_when_their_iteration_arrives(corr, stats, clock):
    corr.process(item("kernels", kernels([5000, 9000], name=["in-next", "beyond"])))
    assert corr.pending_events == 2
    clock.now += 1.0
    it = iterations([(4500, 5500)], model="resnet", run_id="run-2")
    out = corr.process(item("iterations", it))
    assert out[0].kind == "iterations"
    assert out[0].batch.equals(it)
    got = by_name(out[1:])
    assert got["in-next"]["trace_id"] == trace_id(NODE, "run-2", 0)
    assert got["in-next"]["parent_span_id"] == span_id(NODE, "run-2", 0)
    assert got["in-next"]["run_id"] == "run-2"
    # still newer than everything known: held with its original deadline
    assert "beyond" not in got
    assert corr.pending_events == 1
    clock.now += 0.5
    assert corr.expire() == []
    clock.now += 0.5  # 2 s after it first arrived
    released = corr.expire()
    assert rows(released)[0]["name"] == "beyond"
    assert outcomes(stats) == (1, 1)


def test_flush_releases_everything(corr, stats):
    corr.process(item("kernels", kernels([5000, 6000])))
    passed = corr.process(item("kernels", kernels([7000], pid=[5])))  # no iteration of pid 5: not held
    assert sum(b.rows for b in passed) == 1
    assert corr.pending_events == 2
    before = stats.get(EVENTS_EMITTED, component="correlator")
    out = corr.flush()
    assert sum(b.rows for b in out) == 2
    assert corr.pending_events == 0
    assert outcomes(stats) == (0, 3)
    assert stats.get(EVENTS_EMITTED, component="correlator") == before + 2
    assert corr.flush() == []


def test_max_pending_events_releases_oldest(stats, clock):
    c = Correlator(stats, hold_s=100.0, max_pending_events=3, clock=clock)
    c.process(item("iterations", iterations(SPANS)))
    assert c.process(item("kernels", kernels([5000, 5001], name=["o1", "o2"]))) == []
    assert c.pending_events == 2
    out = c.process(item("kernels", kernels([5002, 5003], name=["n1", "n2"])))
    # 4 > 3: the oldest held batch leaves unmatched, the newest stays
    assert [r["name"] for r in rows(out)] == ["o1", "o2"]
    assert c.pending_events == 2
    assert outcomes(stats) == (0, 2)


def test_zero_hold_releases_in_the_same_call(stats, clock):
    c = Correlator(stats, hold_s=0.0, clock=clock)
    c.process(item("iterations", iterations(SPANS)))
    out = c.process(item("kernels", kernels([1500, 9000])))
    assert sum(b.rows for b in out) == 2
    assert c.pending_events == 0
    assert outcomes(stats) == (1, 1)


def test_non_kernel_kinds_pass_through(corr, stats):
    tel = item("telemetry", _telemetry())
    out = corr.process(tel)
    assert out == [tel]
    assert outcomes(stats) == (0, 0)


def test_empty_kernel_batch_passes(corr, stats):
    b = kernels([])
    out = corr.process(item("kernels", b))
    assert len(out) == 1
    assert out[0].rows == 0
    assert outcomes(stats) == (0, 0)


def test_received_and_emitted_counters(corr, stats):
    corr.process(item("kernels", kernels([1500, 2500, 9000])))
    # 2 iterations + 3 kernels in, 2 iterations + 2 kernels out (one held)
    assert stats.get(EVENTS_RECEIVED, component="correlator") == 5
    assert stats.get(EVENTS_EMITTED, component="correlator") == 4


def test_iterations_of_several_processes_in_one_batch(stats, clock):
    c = Correlator(stats, clock=clock)
    a = iterations([(1000, 2000)], pid=1, run_id="ra")
    b = iterations([(1000, 2000)], pid=2, run_id="rb")
    both = conform("iterations", pa.Table.from_batches([a, b]))
    c.process(item("iterations", both))
    out = c.process(item("kernels", kernels([1500, 1500], name=["p1", "p2"], pid=[1, 2])))
    got = by_name(out)
    assert got["p1"]["trace_id"] == trace_id(NODE, "ra", 0)
    assert got["p2"]["trace_id"] == trace_id(NODE, "rb", 0)


def test_iterations_arriving_out_of_order_are_indexed_sorted(stats, clock):
    c = Correlator(stats, clock=clock)
    c.process(item("iterations", iterations([(5000, 6000)], run_id="late")))
    c.process(item("iterations", iterations([(1000, 2000)], run_id="early")))
    got = by_name(c.process(item("kernels", kernels([1500, 5500], name=["e", "l"]))))
    assert got["e"]["trace_id"] == trace_id(NODE, "early", 0)
    assert got["l"]["trace_id"] == trace_id(NODE, "late", 0)


def test_max_iterations_per_process_forgets_oldest(stats, clock):
    c = Correlator(stats, hold_s=0.0, max_iterations_per_process=1, clock=clock)
    c.process(item("iterations", iterations(SPANS)))
    got = by_name(c.process(item("kernels", kernels([1500, 3500], name=["old", "new"]))))
    assert got["old"]["trace_id"] is None
    assert got["new"]["trace_id"] == T1


def _telemetry() -> pa.RecordBatch:
    return conform(
        "telemetry",
        {
            "ts_ns": pa.array([1], pa.int64()),
            "node": [NODE],
            "device": ["0"],
            "metric": ["hw.power"],
            "value": pa.array([1.0]),
            "unit": ["W"],
        },
    )


def test_max_processes_forgets_least_recently_updated(stats, clock):
    c = Correlator(stats, hold_s=0.0, max_processes=1, clock=clock)
    c.process(item("iterations", iterations([(1000, 2000)], pid=1)))
    c.process(item("iterations", iterations([(1000, 2000)], pid=2, run_id="r2")))
    got = by_name(c.process(item("kernels", kernels([1500, 1500], name=["p1", "p2"], pid=[1, 2]))))
    assert got["p1"]["trace_id"] is None
    assert got["p2"]["trace_id"] == trace_id(NODE, "r2", 0)


def test_partial_source_context_is_not_mixed_with_an_iteration_of_another_trace(corr):
    src_trace = "f" * 32
    out = corr.process(item("kernels", kernels([1500, 1500], name=["src", "plain"], trace_id=[src_trace, None])))
    got = by_name(out)
    assert got["plain"]["trace_id"] == T0
    assert got["plain"]["parent_span_id"] == S0
    assert got["src"]["trace_id"] == src_trace
    assert got["src"]["parent_span_id"] != S0
