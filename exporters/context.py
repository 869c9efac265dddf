"""What every exporter's factory is built from: its own settings and one ``ExporterContext``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from aaco.contract.budget import ByteBudget
from aaco.contract.config_base import StrictModel
from aaco.contract.ledger import Ledger
from aaco.contract.stats import Stats
from aaco.exporters.routes import Route


class ExporterSettings(StrictModel):
    """Base of an exporter's settings: the key of ``exporters:`` they are read from, and its one-line help."""

    section: ClassVar[str]
    summary: ClassVar[str]


@dataclass(frozen=True)
class ExporterContext:
    """The agent's shared pieces an exporter may use (each takes only what it needs)."""

    node: str
    stats: Stats
    budget: ByteBudget | None = None  # the agent's one budget for OTLP data (None: the exporter's own)
    ledger: Ledger = field(default_factory=Ledger)
    records: Callable[[], list[dict[str, Any]]] | None = None  # the bad-input records the lake keeps
    routes: Mapping[str, Route] = field(default_factory=dict)  # served beside /metrics
    link_window_s: float = 5.0  # how long received spans wait for their GPU iterations
    link_mode: Literal["links", "children"] = "links"
    receiving: bool = False  # a receiver hands application spans to the trace exporter
    env: Mapping[str, str] | None = None  # OTEL_* variables (None: the process's environment)
    versions: Mapping[str, object] | None = None  # the software found on this node (contract/versions.py)
