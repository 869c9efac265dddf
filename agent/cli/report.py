"""What a finished run tells its user: the summary table, the input it could not read, the data it could not deliver.

``aaco replay`` (and ``aaco run``) send what they read over OTLP when asked to; when an OTLP exporter
or forwarder dropped some of it (counted in ``aaco_events_dropped_total`` for ``exporter:otlp``,
``exporter:otlp_metrics`` or ``forward:*``), the run says how many and why, and ``aaco replay`` exits 3.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from aaco.agent.cli.common import print_error, print_warning, table
from aaco.contract.stats import EVENTS_DROPPED, Stats

if TYPE_CHECKING:
    from aaco.agent.cli.tables import FitTable
    from aaco.agent.service import AgentService

OTLP_COMPONENTS = ("exporter:otlp", "forward:")  # exporter:otlp_metrics included
UNITS = {"exporter:otlp": "span(s)", "exporter:otlp_metrics": "metric point(s)", "forward:logs": "log record(s)"}
WHY = {
    "queue_full": "the export queue was full (exporters.otlp.queue_max_spans)",
    "memory_budget": "over the byte budget (exporters.otlp.memory_budget_mib)",
    "retries_exhausted": "the upstream failed for exporters.otlp.retry_max_elapsed_s",
    "rejected": "refused by the upstream",
    "export_failed": "the export failed",
    "shutdown": "not sent within pipeline.shutdown_timeout_s",
}
MAX_WARNINGS = 20  # input warnings printed after a run; the rest are counted (all are in the log)


def lost_exports(stats: Stats) -> Counter[tuple[str, str]]:
    """Items the OTLP exporters and forwarders dropped, by (component, reason)."""
    drops = stats.counts(EVENTS_DROPPED, ("component", "reason"))
    return Counter({(c, r): n for (c, r), n in drops.items() if c.startswith(OTLP_COMPONENTS)})


def report_lost(stats: Stats) -> bool:
    """Say what was not delivered over OTLP, with how many and why; True if anything was lost."""
    lost = lost_exports(stats)
    for (component, reason), n in sorted(lost.items()):
        unit = UNITS.get(component, "metric point(s)")
        print_error(f"{n} {unit} not delivered over OTLP ({component}): {WHY.get(reason, reason)}")
    return bool(lost)


def report_problems(service: AgentService) -> bool:
    """Print the input problems of a run; True (exit 2) if a file could not be read completely.

    The events read from a damaged file are kept; bad rows inside a readable file are warnings.
    """
    from aaco.agent.sources.ingest import DAMAGED

    problems = service.problems
    errors = [p for p in problems if p.fatal or p.reason in DAMAGED]
    for p in errors:
        print_error(f"{p.subject}: {p.message}")
    warnings = [p for p in problems if p not in errors]
    for p in warnings[:MAX_WARNINGS]:
        print_warning(f"{p.subject}: {p.message}")
    if len(warnings) > MAX_WARNINGS:
        print_warning(f"... and {len(warnings) - MAX_WARNINGS} more (see the log)")
    return bool(errors)


def _fmt(v: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


SUMMARY_COLUMNS = (
    "model",
    "iterations",
    "p50 ms",
    "p95 ms",
    "p99 ms",
    "it/s",
    "kernels/it",
    "KAR",
    "launch tax",
    "device active",
)


def summary_table(service: AgentService) -> FitTable:
    """The end-of-run summary: latency, throughput, kernels, KAR, launch tax, active ratio per model."""
    snap = service.final_snapshot
    out = table(*SUMMARY_COLUMNS, right=SUMMARY_COLUMNS[1:], title="AACO summary")
    if snap is None:
        return out
    doc = snap.to_dict()
    lat = doc.get("latency", {}).get("models", {})
    kar = doc.get("kar", {}).get("models", {})
    launch = doc.get("launch", {}).get("models", {})
    active: dict[str, list[str]] = {}
    for w in doc.get("activity", {}).get("devices", []):
        active.setdefault(w["run_id"].split(":")[0], []).append(f"{w['device']}: {w['active_ratio']:.2f}")
    for model in sorted(set(lat) | set(kar) | set(launch)):
        lm, km, la = lat.get(model, {}), kar.get(model, {}), launch.get(model, {})
        tax = la.get("launch_tax")
        out.add_row(
            model,
            str(lm.get("iterations", "-")),
            _fmt(lm.get("p50_s"), 1e3),
            _fmt(lm.get("p95_s"), 1e3),
            _fmt(lm.get("p99_s"), 1e3),
            _fmt(lm.get("throughput_per_s"), digits=1),
            _fmt(km.get("kernels_per_iteration"), digits=1),
            _fmt(km.get("kar")),
            "-" if tax is None else f"{tax:.3f} ({la.get('band')})",
            ", ".join(active.get(model, [])) or "-",
        )
    return out
