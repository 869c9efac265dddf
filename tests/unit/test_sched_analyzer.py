"""The sched rows (long form) and the sched analyzer: totals, indices, histogram, bounded labels."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aaco.analyzers.sched import (
    FAULT_PENALTY,
    INTERFERENCE,
    RQ_BOUNDS_S,
    RUNQUEUE_LATENCY,
    SWITCHES,
    SchedAnalyzer,
    fault_penalty_index,
    interference_index,
)
from aaco.analyzers.stats import log2_quantile
from aaco.contract import sched as rows
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.signals import HistogramValue

S = 1_000_000_000


def drain(ts: int, threads: list[tuple[int, int, str, dict[str, int]]], **kw) -> rows.Drain:
    """A drain of ``threads`` = [(tgid, tid, comm, {metric: value})] over 1 s ending at ``ts``."""
    metrics = sorted({m for *_, vals in threads for m in vals})
    deltas = rows.ThreadDeltas(
        np.array([t[0] for t in threads], dtype=np.int64),
        np.array([t[1] for t in threads], dtype=np.int64),
        [t[2] for t in threads],
        {m: np.array([t[3].get(m, 0) for t in threads], dtype=np.int64) for m in metrics},
    )
    return rows.Drain(ts_ns=ts, interval_ns=kw.pop("interval_ns", S), threads=deltas, **kw)


def batch(d: rows.Drain, node: str = "n1") -> EventBatch:
    return EventBatch("sched", conform("sched", rows.drain_to_table(d, node=node, source="sched")), "sched")


def test_rows_are_long_form_without_zeros_and_conform():
    d = drain(
        10 * S,
        [
            (100, 100, "main", {rows.ONCPU: 5, rows.VOLUNTARY: 0}),
            (100, 101, "worker", {rows.ONCPU: 0, rows.VOLUNTARY: 3}),
        ],
        hist_tgid=np.array([100, 100]),
        hist_slot=np.array([10, 12]),
        hist_count=np.array([4, 0]),
        exited=[100],
        events=rows.OffcpuEvents(
            start_ns=np.array([7 * S]), end_ns=np.array([8 * S]), tgid=np.array([100]), tid=np.array([101]), comm=["w"]
        ),
    )
    t = rows.drain_to_table(d, node="n1", source="s")
    out = conform("sched", t).to_pylist()
    got = {(r["tid"], r["metric"]): r for r in out}
    assert set(got) == {
        (100, rows.ONCPU),
        (101, rows.VOLUNTARY),
        (None, rows.RQ_LATENCY),
        (None, rows.EXITED),
        (101, rows.OFFCPU_INTERVAL),
    }
    assert got[(None, rows.RQ_LATENCY)]["bucket_le_ns"] == 1 << 11
    assert got[(None, rows.RQ_LATENCY)]["value"] == 4
    assert got[(None, rows.RQ_LATENCY)]["comm"] == "main"  # the process's name: its main thread's
    ev = got[(101, rows.OFFCPU_INTERVAL)]
    assert (ev["offcpu_start_ns"], ev["offcpu_end_ns"], ev["value"]) == (7 * S, 8 * S, S)
    assert all(r["ts_ns"] == 10 * S and r["interval_ns"] == S and r["node"] == "n1" for r in out)
    assert got[(100, rows.ONCPU)]["offcpu_start_ns"] is None


def test_empty_drain_gives_an_empty_conforming_table():
    t = rows.drain_to_table(rows.Drain(1, 1, rows.ThreadDeltas.empty()), node="n", source="s")
    assert conform("sched", t).num_rows == 0


def test_log2_slot_matches_the_kernel():
    assert rows.log2_slot(np.array([0, 1, 2, 3, 1023, 1024, 2**40])).tolist() == [0, 0, 1, 1, 9, 10, 40]
    assert rows.slot_le_ns(np.array([0, 9])).tolist() == [2, 1024]


def test_interference_index_definition():
    # 2 busy threads, 1 s interval, 0.5 s of waiting in total: a quarter of their wall time.
    assert interference_index(0.5 * S, S, 2) == pytest.approx(0.25)
    assert interference_index(5 * S, S, 1) == 1.0  # capped
    assert interference_index(1, S, 0) == 0.0


def test_fault_penalty_index_definition():
    # 100 faults in 2 s, a quarter of the off-CPU time in fault sleeps: 50/s x 0.25.
    assert fault_penalty_index(100, 2 * S, 4 * S, 1 * S, None) == pytest.approx(12.5)
    # /proc: weighted by the major share.
    assert fault_penalty_index(100, S, S, None, 10) == pytest.approx(10.0)
    assert fault_penalty_index(100, S, S, None, None) == 0.0
    assert fault_penalty_index(0, S, S, 0, None) == 0.0


def test_log2_quantile_interpolates_within_slots():
    slots = np.zeros(64, dtype=np.int64)
    slots[10] = 100  # all in [1024, 2048) ns
    assert log2_quantile(slots, 0.5) == pytest.approx(1536e-9)
    assert log2_quantile(slots, 0.99) == pytest.approx((1024 + 0.99 * 1024) * 1e-9)
    assert log2_quantile(np.zeros(64, dtype=np.int64), 0.5) is None


def test_analyzer_totals_indices_and_histogram():
    a = SchedAnalyzer()
    d1 = drain(
        10 * S,
        [
            (100, 100, "feeder", {rows.ONCPU: S // 2, rows.RQ_WAIT: S // 4, rows.VOLUNTARY: 10, rows.INVOLUNTARY: 5}),
            (100, 101, "feeder-w", {rows.ONCPU: S // 2, rows.RQ_WAIT: S // 4, rows.FAULTS: 40}),
            (100, 102, "idle", {rows.OFFCPU: S}),  # asleep all along: not busy
            (200, 200, "other-proc", {rows.VOLUNTARY: 1, rows.ONCPU: 1}),
        ],
        hist_tgid=np.array([100, 100]),
        hist_slot=np.array([12, 20]),
        hist_count=np.array([3, 1]),
    )
    a.update(batch(d1))
    doc = a.snapshot().to_dict()
    w = {x["pid"]: x for x in doc["workloads"]}
    assert w[100]["comm"] == "feeder"
    assert (w[100]["context_switches"], w[100]["voluntary"], w[100]["involuntary"]) == (15, 10, 5)
    assert w[100]["interference_ratio"] == pytest.approx(0.25)  # 0.5 s wait / (1 s x 2 busy threads)
    assert w[100]["threads"] == 2
    assert w[100]["page_faults"] == 40
    assert w[100]["fault_penalty_index"] == 0.0  # no fault sleeps measured
    assert w[100]["oncpu_s"] == pytest.approx(1.0)
    assert w[100]["offcpu_s"] == pytest.approx(1.0)
    assert w[100]["runqueue_latency_p50_s"] == pytest.approx((4096 + (2 / 3) * 4096) * 1e-9)
    assert w[100]["runqueue_latency_p99_s"] > 2**20 * 1e-9
    # A second interval: totals add up, the index is the latest interval's.
    a.update(batch(drain(11 * S, [(100, 100, "feeder", {rows.ONCPU: S, rows.RQ_WAIT: 0, rows.VOLUNTARY: 1})])))
    w = {x["pid"]: x for x in a.snapshot().to_dict()["workloads"]}
    assert w[100]["interference_ratio"] == 0.0
    assert w[100]["interference_ratio_overall"] == pytest.approx(0.5 * S / (2 * S + 1 * S))
    assert w[100]["voluntary"] == 11

    points = a.snapshot().points()
    sw = {(p.labels["pid"], p.labels["kind"]): p.value for p in points if p.metric is SWITCHES}
    assert sw[("100", "voluntary")] == 11 and sw[("100", "involuntary")] == 5
    hist = next(p for p in points if p.metric is RUNQUEUE_LATENCY and p.labels["pid"] == "100")
    assert isinstance(hist.value, HistogramValue)
    assert hist.value.bounds == RQ_BOUNDS_S
    assert hist.value.count == 4
    assert hist.value.bucket_counts[-1] == 4
    assert hist.value.bucket_counts[RQ_BOUNDS_S.index(2**13 / 1e9)] == 3  # slot 12 ends at 2**13 ns
    assert hist.value.total == pytest.approx(0.5)
    assert {p.labels["pid"] for p in points if p.metric is INTERFERENCE} == {"100", "200"}
    assert all(set(p.labels) == set(p.metric.labels) for p in points)


def test_fault_penalty_from_ebpf_fault_sleeps():
    a = SchedAnalyzer()
    a.update(
        batch(
            drain(
                5 * S,
                [(7, 7, "x", {rows.FAULTS: 10, rows.OFFCPU: 4 * S, rows.FAULT_OFFCPU: S, rows.ONCPU: 1})],
                interval_ns=2 * S,
            )
        )
    )
    w = a.snapshot().to_dict()["workloads"][0]
    assert w["fault_penalty_index"] == pytest.approx(10 / 2 * 0.25)
    assert w["fault_penalty_index_overall"] == pytest.approx(1.25)
    fp = [p for p in a.snapshot().points() if p.metric is FAULT_PENALTY]
    assert [p.value for p in fp] == [pytest.approx(1.25)]


def test_label_cardinality_is_bounded_and_totals_kept():
    a = SchedAnalyzer(max_workloads=3)
    threads = [(pid, pid, f"p{pid}", {rows.VOLUNTARY: pid}) for pid in range(1, 11)]
    a.update(batch(drain(S, threads)))
    a.update(batch(drain(2 * S, threads)))
    res = a.snapshot()
    doc = res.to_dict()
    assert [w["pid"] for w in doc["workloads"]] == [1, 2, 3]
    assert doc["other"][0]["voluntary"] == 2 * sum(range(4, 11))
    total = sum(w["voluntary"] for w in doc["workloads"]) + doc["other"][0]["voluntary"]
    assert total == 2 * sum(range(1, 11))
    pids = {p.labels["pid"] for p in res.points()}
    assert pids == {"1", "2", "3", "other"}


def test_exited_processes_fold_into_other_after_retention():
    a = SchedAnalyzer(retain_s=10)
    a.update(batch(drain(S, [(5, 5, "short", {rows.VOLUNTARY: 3})], exited=[5])))
    w = a.snapshot().to_dict()["workloads"]
    assert w[0]["exited"] is True
    assert not [p for p in a.snapshot().points() if p.metric is INTERFERENCE]  # no gauge for an exited process
    a.update(batch(drain(20 * S, [(6, 6, "later", {rows.VOLUNTARY: 1})])))
    doc = a.snapshot().to_dict()
    assert [x["pid"] for x in doc["workloads"]] == [6]
    assert doc["other"][0]["voluntary"] == 3
    # A folded pid does not come back as its own series.
    a.update(batch(drain(21 * S, [(5, 5, "short", {rows.VOLUNTARY: 1})])))
    doc = a.snapshot().to_dict()
    assert [x["pid"] for x in doc["workloads"]] == [6]
    assert doc["other"][0]["voluntary"] == 4


def test_nodes_are_kept_apart_and_empty_batches_ignored():
    a = SchedAnalyzer()
    a.update(batch(drain(S, [(1, 1, "a", {rows.ONCPU: 10})]), node="n1"))
    a.update(batch(drain(S, [(1, 1, "a", {rows.ONCPU: 20})]), node="n2"))
    a.update(batch(rows.Drain(S, S, rows.ThreadDeltas.empty())))
    doc = a.snapshot().to_dict()
    assert sorted((w["node"], w["oncpu_s"]) for w in doc["workloads"]) == [("n1", 1e-8), ("n2", 2e-8)]
    assert not math.isnan(doc["workloads"][0]["interference_ratio"])


def test_the_agent_builds_it_with_the_sched_sources_bound():
    from aaco.agent.config import load_config
    from aaco.agent.service import build_analyzers

    def built(overrides: dict) -> SchedAnalyzer:
        (a,) = [x for x in build_analyzers(load_config(None, overrides, env={})) if isinstance(x, SchedAnalyzer)]
        return a

    assert built({"sources": [{"type": "sched", "max_workloads": 7, "backend": "proc"}]}).max_workloads == 7
    assert built({}).max_workloads == 64


def test_the_indices_are_defined_in_docs_metrics():
    """docs/metrics.md defines both indices outside its generated table (regenerate it with splice, not >)."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    end = doc.index("<!-- END GENERATED -->")
    section = doc[doc.index("## Scheduler indices") :]
    assert doc.index("## Scheduler indices") > end
    assert "interference = sum over threads of runqueue_wait_ns / (interval_ns × busy_threads)" in section
    assert "fault_penalty = page_faults / interval_s × fault_offcpu_ns / offcpu_ns" in section
