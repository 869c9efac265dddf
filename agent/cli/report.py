"""What a finished run tells its user: the summary table, the input it could not read, the data it could not deliver.

``aaco replay`` (and ``aaco run``) send what they read over OTLP when asked to; when an OTLP exporter
or forwarder dropped some of it (counted in ``aaco_events_dropped_total`` for ``exporter:otlp``,
``exporter:otlp_metrics`` or ``forward:*``), the run says how many and why, and ``aaco replay`` exits 3.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from aaco.agent.cli.common import print_error, print_note, print_warning, table
from aaco.contract.stats import EVENTS_DROPPED, Stats

if TYPE_CHECKING:
    from aaco.agent.cli.tables import FitTable
    from aaco.agent.service import AgentService

OTLP_COMPONENTS = ("exporter:otlp", "forward:")  # exporter:otlp_metrics included
UNITS = {"exporter:otlp": "span(s)", "exporter:otlp_metrics": "metric point(s)", "forward:logs": "log record(s)"}
WHY = {
    "queue_full": "the export queue was full (exporters.otlp.queue_max_spans)",
    "memory_budget": "over the byte budget (exporters.otlp.memory_budget_mib)",
    "memory_limit": "the agent was over its memory limit (pipeline.memory_limit_mib)",
    "retries_exhausted": "the upstream failed for exporters.otlp.retry_max_elapsed_s",
    "rejected": "refused by the upstream",
    "export_failed": "the export failed",
    "shutdown": "not sent within pipeline.shutdown_timeout_s",
}
ALREADY = "already_ingested"  # the reason of a file skipped because the lake holds it
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


def kernel_spans(stats: Stats) -> dict[str, int]:
    """Kernel spans sent over OTLP, and those summarised on their root spans by budget."""
    from aaco.exporters.otlp_assembly import SPANS_EXPORTED, SPANS_SUMMARIZED

    return {
        "sent": int(stats.get(SPANS_EXPORTED, kind="kernel")),
        "summarised_trace_budget": int(stats.get(SPANS_SUMMARIZED, reason="trace_budget")),
        "summarised_rate_budget": int(stats.get(SPANS_SUMMARIZED, reason="rate_budget")),
    }


def report_summarised(stats: Stats, rate_clock: str) -> None:
    """Say how many kernel spans went out over OTLP and how many were summarised on their root spans, and why."""
    spans = kernel_spans(stats)
    by_trace, by_rate = spans["summarised_trace_budget"], spans["summarised_rate_budget"]
    if not (by_trace or by_rate):
        return
    clock = "of the kernels' own time" if rate_clock == "trace" else "of the agent's clock"
    why = [f"{by_trace} beyond exporters.otlp.max_kernel_spans_per_trace"] if by_trace else []
    why += [f"{by_rate} beyond exporters.otlp.max_spans_per_second ({clock})"] if by_rate else []
    print_note(
        f"kernel spans: {spans['sent']} sent, {by_trace + by_rate} summarised on their root spans (counted, not sent): "
        + "; ".join(why)
    )


def unshipped(service: AgentService) -> tuple[int, int, str | None]:
    """The lake's parts and bytes left unshipped to its object store at shutdown, and why (0, 0 when none)."""
    from aaco.exporters.lake import LakeExporter

    for exporter in service.exporters:
        if isinstance(exporter, LakeExporter) and (left := exporter.unshipped()) is not None:
            return left
    return 0, 0, None


def report_unshipped(service: AgentService) -> bool:
    """Say which lake parts did not reach the object store, why, and how they will; True if any."""
    parts, size, why = unshipped(service)
    if not parts:
        return False
    lake = service.config.exporters.lake
    print_error(
        f"{parts} lake part(s) ({size} bytes) not shipped to {lake.remote}"
        + (f": {why}" if why else "")
        + f"; they stay in {lake.path.resolve()} and ship the next time AACO runs with this lake and store "
        "(the same command again, or aaco agent with the same exporters.lake.path and --lake URL)"
    )
    return True


def lake_doc(service: AgentService) -> dict[str, Any]:
    """Where the lake went, as data: the directory, the store it ships to, what did not reach it."""
    lake = service.config.exporters.lake
    parts, size, why = unshipped(service)
    return {
        "path": str(lake.path.resolve()),
        "remote": lake.remote,
        "unshipped_parts": parts,
        "unshipped_bytes": size,
        "unshipped_reason": why,
    }


def lake_where(service: AgentService) -> str:
    """Where the lake went, for the closing line: the directory, and the store it ships to (or what did not)."""
    lake = service.config.exporters.lake
    where = str(lake.path.resolve())
    if not lake.remote:
        return where
    parts = unshipped(service)[0]
    return f"{where} ({parts} part(s) NOT shipped to {lake.remote})" if parts else f"{where} (shipped to {lake.remote})"


def undelivered(service: AgentService) -> bool:
    """True when spans, metrics or lake parts the run was asked to send did not get there (exit 3)."""
    return bool(lost_exports(service.stats)) or unshipped(service)[0] > 0


def report_problems(service: AgentService) -> bool:
    """Print the input problems of a run; True (exit 2) if a file could not be read completely.

    The events read from a damaged file are kept; bad rows inside a readable file are warnings.
    """
    from aaco.agent.sources.ingest import DAMAGED

    problems = [p for p in service.problems if p.reason != ALREADY]  # said once, by the command, with their count
    errors = [p for p in problems if p.fatal or p.reason in DAMAGED]
    for p in errors:
        print_error(f"{p.subject}: {p.message}")
    warnings = [p for p in problems if p not in errors]
    for p in warnings[:MAX_WARNINGS]:
        print_warning(f"{p.subject}: {p.message}")
    if len(warnings) > MAX_WARNINGS:
        print_warning(f"... and {len(warnings) - MAX_WARNINGS} more (see the log)")
    return bool(errors)


def files_read(service: AgentService, source: str) -> tuple[int, int, int]:
    """(files read, rows they gave, files skipped as already in the lake) by ``source``."""
    records = [r for r in service.journal.records if r.source == source]
    already = sum(1 for p in service.problems if p.source == source and p.reason == ALREADY)
    return len(records), sum(sum(r.events.values()) for r in records), already


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


def summary(service: AgentService) -> dict[str, dict[str, Any]]:
    """Per model: iterations, latency percentiles (s), throughput, kernels per iteration, KAR, launch tax, activity."""
    snap = service.final_snapshot
    if snap is None:
        return {}
    doc = snap.to_dict()
    lat = doc.get("latency", {}).get("models", {})
    kar = doc.get("kar", {}).get("models", {})
    launch = doc.get("launch", {}).get("models", {})
    active: dict[str, dict[str, float]] = {}
    for w in doc.get("activity", {}).get("devices", []):
        active.setdefault(w["run_id"].split(":")[0], {})[str(w["device"])] = w["active_ratio"]
    out = {}
    for model in sorted(set(lat) | set(kar) | set(launch)):
        lm, km, la = lat.get(model, {}), kar.get(model, {}), launch.get(model, {})
        out[model] = {
            "iterations": lm.get("iterations"),
            "p50_s": lm.get("p50_s"),
            "p95_s": lm.get("p95_s"),
            "p99_s": lm.get("p99_s"),
            "throughput_per_s": lm.get("throughput_per_s"),
            "kernels_per_iteration": km.get("kernels_per_iteration"),
            "kar": km.get("kar"),
            "launch_tax": la.get("launch_tax"),
            "launch_band": la.get("band"),
            "device_active_ratio": active.get(model, {}),
        }
    return out


def summary_table(models: dict[str, dict[str, Any]]) -> FitTable:
    """The end-of-run summary (``summary``) as a table."""
    out = table(*SUMMARY_COLUMNS, right=SUMMARY_COLUMNS[1:], title="AACO summary")
    for model, m in models.items():
        tax = m["launch_tax"]
        out.add_row(
            model,
            "-" if m["iterations"] is None else str(m["iterations"]),
            _fmt(m["p50_s"], 1e3),
            _fmt(m["p95_s"], 1e3),
            _fmt(m["p99_s"], 1e3),
            _fmt(m["throughput_per_s"], digits=1),
            _fmt(m["kernels_per_iteration"], digits=1),
            _fmt(m["kar"]),
            "-" if tax is None else f"{tax:.3f} ({m['launch_band']})",
            ", ".join(f"{d}: {r:.2f}" for d, r in m["device_active_ratio"].items()) or "-",
        )
    return out
