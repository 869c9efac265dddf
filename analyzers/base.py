"""The analyzer contract and the snapshot that carries every analyzer's result to the exporters."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from aaco.agent.pipeline.schemas import EventBatch
from aaco.agent.pipeline.signals import MetricPoint


class AnalyzerResult(Protocol):
    """An immutable analyzer result: a JSON form for ``analysis.json`` and metric points."""

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        ...

    def points(self) -> list[MetricPoint]:
        """The result as metric points."""
        ...


@dataclass(frozen=True)
class Finding:
    """Something an analyzer concluded, with its evidence (a row of the ``findings`` schema)."""

    ts_ns: int
    node: str
    analyzer: str
    subject: str  # what it is about: a model, a device, a process
    severity: str  # info | warning | critical
    confidence: float  # 0..1
    summary: str
    evidence: Mapping[str, Any]
    trace_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``analysis.json``)."""
        return {
            "ts_ns": self.ts_ns,
            "node": self.node,
            "analyzer": self.analyzer,
            "subject": self.subject,
            "severity": self.severity,
            "confidence": self.confidence,
            "summary": self.summary,
            "evidence": dict(self.evidence),
            "trace_id": self.trace_id,
        }


class Analyzer(ABC):
    """A pure, streaming analyzer: no I/O, no clocks, no knowledge of exporters.

    An analyzer that reaches conclusions queues ``Finding``s while it folds events in
    (``emit``); the pipeline takes them (``drain_findings``) at each snapshot and stores them.
    """

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str]]
    MAX_PENDING_FINDINGS: ClassVar[int] = 1000

    def emit(self, finding: Finding) -> None:
        """Queue a finding (bounded: beyond the cap the oldest are dropped, counted)."""
        pending = self.__dict__.setdefault("_findings", [])
        pending.append(finding)
        if len(pending) > self.MAX_PENDING_FINDINGS:
            del pending[0]
            self.__dict__["_findings_dropped"] = self.__dict__.get("_findings_dropped", 0) + 1

    def drain_findings(self) -> list[Finding]:
        """The findings queued since the last call."""
        return self.__dict__.pop("_findings", [])

    def drain_dropped_findings(self) -> int:
        """How many findings the cap dropped since the last call."""
        return self.__dict__.pop("_findings_dropped", 0)

    @abstractmethod
    def update(self, item: EventBatch) -> None:
        """Fold a batch of one of ``kinds`` in."""

    @abstractmethod
    def snapshot(self) -> AnalyzerResult:
        """The current result (immutable; later updates do not change it)."""


class DerivedAnalyzer(Analyzer):
    """An analyzer that concludes from the other analyzers' results rather than from events.

    At each snapshot the pipeline calls ``derive`` with every other analyzer's result (by name),
    after computing them; it may ``emit`` findings. ``update`` and ``snapshot`` are not used for it.
    """

    kinds: ClassVar[frozenset[str]] = frozenset()

    def update(self, item: EventBatch) -> None:
        """Derived analyzers take no events."""

    def snapshot(self) -> AnalyzerResult:
        """Derived analyzers are computed by ``derive``."""
        raise NotImplementedError("a derived analyzer is computed by derive(results)")

    @abstractmethod
    def derive(self, results: Mapping[str, AnalyzerResult]) -> AnalyzerResult:
        """Conclude from the other analyzers' results (pure)."""


@dataclass(frozen=True)
class AnalysisSnapshot:
    """Every analyzer's result at one moment, as exporters receive it."""

    ts_ns: int
    node: str
    results: Mapping[str, AnalyzerResult]
    findings: tuple[Finding, ...] = ()  # the most recent, newest last

    def to_dict(self) -> dict[str, Any]:
        """The ``analysis.json`` document: one object per analyzer, and the recent findings."""
        doc: dict[str, Any] = {"generated_at_ns": self.ts_ns, "node": self.node}
        for name, result in self.results.items():
            doc[name] = result.to_dict()
        doc["findings"] = [f.to_dict() for f in self.findings]
        return doc

    def points(self) -> Iterator[MetricPoint]:
        """All analyzers' metric points."""
        for result in self.results.values():
            yield from result.points()


def ratio(num: float, den: float) -> float | None:
    """Num / den, or None when the denominator is not positive."""
    return num / den if den > 0 else None
