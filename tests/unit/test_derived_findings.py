"""Findings a derived analyzer reaches while deriving reach the same snapshot and the findings batch."""

from __future__ import annotations

from aaco.agent.pipeline.bus import Bus
from aaco.agent.pipeline.correlator import Correlator
from aaco.agent.pipeline.worker import FINDINGS, Pipeline
from aaco.analyzers.base import DerivedAnalyzer
from aaco.contract.snapshot import Finding
from aaco.contract.stats import Stats
from aaco.exporters.testing import InMemoryExporter


class _Empty:
    def to_dict(self):
        return {}

    def points(self):
        return []


class Concluder(DerivedAnalyzer):
    """Concludes something at every derive."""

    name = "concluder"

    def __init__(self) -> None:
        self.calls = 0

    def derive(self, results):
        self.calls += 1
        self.emit(Finding(self.calls, "n1", self.name, "m", "info", 1.0, f"derive {self.calls}", {"n": self.calls}))
        return _Empty()


def test_a_derived_finding_is_in_the_snapshot_it_was_reached_in():
    stats = Stats()
    mem = InMemoryExporter()
    p = Pipeline(Bus(stats), Correlator(stats), [Concluder()], [mem], stats, "n1")
    snap = p.finish()  # the final snapshot: nothing comes after it
    assert [f.summary for f in snap.findings] == ["derive 1"]
    assert mem.table("findings").column("summary").to_pylist() == ["derive 1"]
    assert stats.get(FINDINGS, analyzer="concluder", severity="info") == 1
    snap = p.publish_snapshot()
    assert [f.summary for f in snap.findings] == ["derive 1", "derive 2"]
    assert mem.table("findings").num_rows == 2
