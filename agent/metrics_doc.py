"""The table of every metric AACO exports, generated from the registered definitions (``aaco metrics``)."""

from __future__ import annotations

import importlib
from pathlib import Path

from aaco.contract.signals import METRICS, MetricDef

BEGIN = "<!-- BEGIN GENERATED: aaco metrics --markdown -->"
END = "<!-- END GENERATED -->"


def _load_all() -> None:
    """Import every module that defines metrics, so the registry is complete.

    Found by reading the sources (a module that calls ``define(``), so the table does not depend on
    what happened to be imported before: some modules (the OTLP receiver, exporters) load lazily.
    """
    for package in ("aaco.contract", "aaco.agent", "aaco.exporters", "aaco.analyzers"):
        root = Path(importlib.import_module(package).__file__ or "").parent
        for path in sorted(root.rglob("*.py")):
            if "define(" in path.read_text(encoding="utf-8") and path.name != "signals.py":
                rel = path.relative_to(root).with_suffix("")
                importlib.import_module(".".join((package, *rel.parts)))


def all_metrics() -> list[MetricDef]:
    """Every defined metric, sorted by Prometheus name."""
    _load_all()
    return sorted(METRICS.values(), key=lambda m: m.prom_name)


def prom_exposed_name(m: MetricDef) -> str:
    """The name as scraped (counters get ``_total``)."""
    return m.prom_name + ("_total" if m.kind == "counter" else "")


def markdown_table() -> str:
    """The generated table, between its markers."""
    lines = [
        BEGIN,
        "",
        "| Prometheus | OpenTelemetry | type | unit | labels | description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in all_metrics():
        labels = ", ".join(f"`{lbl}`" for lbl in m.labels) or "-"
        lines.append(
            f"| `{prom_exposed_name(m)}` | `{m.otel_name}` | {m.kind} | `{m.unit}` | {labels} | {m.description} |"
        )
    lines += ["", END]
    return "\n".join(lines)


def splice(document: str) -> str:
    """``document`` with its generated region replaced by the current table."""
    head, _, rest = document.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + markdown_table() + tail
