"""What analyzers hand the exporters: results, findings, and the snapshot that carries them."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from aaco.contract.signals import MetricPoint


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
