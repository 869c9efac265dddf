"""The table of every metric AACO exports, generated from the registered definitions (``aaco metrics``)."""

from __future__ import annotations

import importlib

from aaco.agent.pipeline.signals import METRICS, MetricDef

BEGIN = "<!-- BEGIN GENERATED: aaco metrics --markdown -->"
END = "<!-- END GENERATED -->"


def _load_all() -> None:
    """Import every module that defines metrics, so the registry is complete."""
    for module in ("aaco.agent.service", "aaco.exporters.otlp_traces"):
        importlib.import_module(module)


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
