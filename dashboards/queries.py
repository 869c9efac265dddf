"""The Prometheus queries of generated dashboards, and their expansion into plain PromQL.

Grafana fills template variables and interval macros before it sends a query; ``expand`` does the
same for a check outside Grafana: every variable becomes ``.*`` (the All value of the dashboards'
variables) and every interval macro a fixed duration.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .lib import iter_panels

INTERVAL_MACROS: Final = ("$__rate_interval", "$__interval", "$__range")
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
# Identifiers that are metric names in a PromQL expression: not followed by "(" (functions),
# not label names inside braces, not keywords.
_KEYWORDS: Final = frozenset(
    {
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "offset",
        "bool",
        "inf",
        "nan",
    }
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACES = re.compile(r"\{[^}]*\}")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGES = re.compile(r"\[[^\]]*\]")
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")


@dataclass(frozen=True)
class PanelQuery:
    """One Prometheus target of one panel."""

    dashboard: str
    panel: str
    ref: str
    expr: str
    instant: bool

    @property
    def where(self) -> str:
        """``dashboard / panel [ref]``, for messages."""
        return f"{self.dashboard} / {self.panel} [{self.ref}]"


def load(path: Path) -> dict[str, Any]:
    """A dashboard JSON model from a file."""
    return json.loads(path.read_text())


def panel_queries(doc: dict[str, Any]) -> Iterator[PanelQuery]:
    """Every Prometheus target of every panel of ``doc``."""
    for panel in iter_panels(doc):
        for target in panel.get("targets", []):
            ds = target.get("datasource") or panel.get("datasource") or {}
            if ds.get("type", "prometheus") != "prometheus" or "expr" not in target:
                continue
            yield PanelQuery(doc["title"], panel["title"], target["refId"], target["expr"], bool(target.get("instant")))


def annotation_queries(doc: dict[str, Any]) -> Iterator[PanelQuery]:
    """The Prometheus annotation queries of ``doc`` (panel ``annotation: NAME``)."""
    for entry in doc.get("annotations", {}).get("list", []):
        if entry.get("expr"):
            yield PanelQuery(doc["title"], f"annotation: {entry['name']}", "-", entry["expr"], False)


def expand(expr: str, interval: str = "1m", value: str = ".*") -> str:
    """``expr`` with interval macros replaced by ``interval`` and every variable by ``value``."""
    for macro in INTERVAL_MACROS:
        expr = expr.replace(macro, interval)
    return _VARIABLE.sub(value, expr)


def metric_names(expr: str) -> set[str]:
    """The metric names (and recorded series names) an expression selects."""
    text = _STRINGS.sub('""', expr)
    text = _GROUPING.sub(" ", text)
    text = _BRACES.sub(" ", text)
    text = _RANGES.sub(" ", text)
    names = set()
    for match in _IDENT.finditer(text):
        name = match.group(1)
        if name.lower() in _KEYWORDS or re.fullmatch(r"\d.*", name):
            continue
        names.add(name)
    return names
