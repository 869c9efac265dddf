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


class Analyzer(ABC):
    """A pure, streaming analyzer: no I/O, no clocks, no knowledge of exporters."""

    name: ClassVar[str]
    kinds: ClassVar[frozenset[str]]

    @abstractmethod
    def update(self, item: EventBatch) -> None:
        """Fold a batch of one of ``kinds`` in."""

    @abstractmethod
    def snapshot(self) -> AnalyzerResult:
        """The current result (immutable; later updates do not change it)."""


@dataclass(frozen=True)
class AnalysisSnapshot:
    """Every analyzer's result at one moment, as exporters receive it."""

    ts_ns: int
    node: str
    results: Mapping[str, AnalyzerResult]

    def to_dict(self) -> dict[str, Any]:
        """The ``analysis.json`` document: one object per analyzer."""
        doc: dict[str, Any] = {"generated_at_ns": self.ts_ns, "node": self.node}
        for name, result in self.results.items():
            doc[name] = result.to_dict()
        return doc

    def points(self) -> Iterator[MetricPoint]:
        """All analyzers' metric points."""
        for result in self.results.values():
            yield from result.points()


def ratio(num: float, den: float) -> float | None:
    """Num / den, or None when the denominator is not positive."""
    return num / den if den > 0 else None
