"""The analyzer contract: streaming analyzers and derived analyzers (results in ``aaco.contract.snapshot``)."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar

from aaco.contract.component import Component
from aaco.contract.schemas import EventBatch
from aaco.contract.snapshot import AnalyzerResult, Finding


class Analyzer(Component):
    """A pure, streaming analyzer: no I/O, no clocks, no knowledge of exporters.

    It holds no resources, so the ``Component`` lifecycle hooks (``start``, ``shutdown``) are no-ops.

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


def ratio(num: float, den: float) -> float | None:
    """Num / den, or None when the denominator is not positive."""
    return num / den if den > 0 else None


@dataclass(frozen=True)
class AgentHints:
    """What the agent derives from its sources' settings for the analyzers.

    ``smi_compat``: compatibility names per ``smi`` source name (sources that ask for them);
    ``smi_interval_s``: the slowest ``smi`` interval (1 s without one); ``sched_max_workloads``: the
    largest ``max_workloads`` of the ``sched`` sources (64 without one); ``request_spans``: whether
    request spans can arrive at all (the OTLP receiver is on), so analyzers waiting for them hold
    nothing when they cannot.
    """

    smi_compat: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    smi_interval_s: float = 1.0
    sched_max_workloads: int = 64
    request_spans: bool = True
