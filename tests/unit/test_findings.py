"""Findings: analyzers queue them, the pipeline stores them as a `findings` batch and counts them."""

from __future__ import annotations

import json

from aaco.agent.pipeline.bus import Bus
from aaco.agent.pipeline.correlator import Correlator
from aaco.agent.pipeline.worker import FINDINGS, Pipeline
from aaco.analyzers.base import Analyzer
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.snapshot import Finding
from aaco.contract.stats import EVENTS_DROPPED, Stats
from aaco.exporters.testing import InMemoryExporter


class Alarm(Analyzer):
    """Finds something in every telemetry batch."""

    name = "alarm"
    kinds = frozenset({"telemetry"})

    def update(self, item: EventBatch) -> None:
        self.emit(Finding(7, "n1", self.name, "gpu 0", "warning", 0.9, "too hot", {"temp_c": 99.0}, "a" * 32))

    def snapshot(self):
        class R:
            def to_dict(self):
                return {}

            def points(self):
                return []

        return R()


def telemetry():
    return conform(
        "telemetry",
        {"ts_ns": [1], "node": ["n1"], "device": ["0"], "metric": ["hw.temperature"], "value": [99.0], "unit": ["Cel"]},
    )


def test_findings_reach_the_exporters_once_and_are_counted():
    stats = Stats()
    mem = InMemoryExporter()
    p = Pipeline(Bus(stats), Correlator(stats), [Alarm()], [mem], stats, "n1")
    p.dispatch(EventBatch("telemetry", telemetry(), "smi"))
    snap = p.publish_snapshot()
    table = mem.table("findings")
    assert table is not None and table.num_rows == 1
    row = table.to_pylist()[0]
    assert row["summary"] == "too hot" and json.loads(row["evidence_json"]) == {"temp_c": 99.0}
    assert row["trace_id"] == "a" * 32
    assert stats.get(FINDINGS, analyzer="alarm", severity="warning") == 1
    assert snap.to_dict()["findings"][0]["evidence"] == {"temp_c": 99.0}
    p.publish_snapshot()  # nothing new: nothing stored again
    assert mem.table("findings").num_rows == 1


def test_pending_findings_are_bounded():
    a = Alarm()
    a.MAX_PENDING_FINDINGS = 3
    for _ in range(10):
        a.update(EventBatch("telemetry", telemetry(), "smi"))
    assert len(a.drain_findings()) == 3
    assert a.drain_findings() == []


def test_findings_past_the_cap_are_counted_as_dropped():
    stats = Stats()
    a = Alarm()
    a.MAX_PENDING_FINDINGS = 3
    p = Pipeline(Bus(stats), Correlator(stats), [a], [InMemoryExporter()], stats, "n1")
    for _ in range(10):
        p.dispatch(EventBatch("telemetry", telemetry(), "smi"))
    p.publish_snapshot()
    assert stats.get(FINDINGS, analyzer="alarm", severity="warning") == 3
    assert stats.get(EVENTS_DROPPED, component="analyzer.alarm", reason="findings_overflow") == 7
    p.publish_snapshot()  # counted once
    assert stats.get(EVENTS_DROPPED, component="analyzer.alarm", reason="findings_overflow") == 7
