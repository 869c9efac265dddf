"""Live check: the demo agent, a real Prometheus with the project's rules, a real Alertmanager.

``aaco agent --config examples/demo.yaml --metrics-port P --lake DIR`` runs every source that can
run here (ONNX Runtime workload, LLM requests, replays and a spool of the real samples, GPU telemetry
from the sample captures, the scheduler), exporting its traces over OTLP to a real gRPC receiver (the
stand-in for Tempo). The agent's own OTLP receiver is moved to free ports, and the LLM requests'
spans go there to feed the serving metrics.
Prometheus (Debian ``prometheus``, loopback, temporary config and data) scrapes it every second
with dashboards/rules/*.yaml loaded and evaluated every second; Alertmanager (Debian
``prometheus-alertmanager``) receives its alerts.

Then every query of every dashboard panel runs against Prometheus, as Grafana would run it
(variables set to ``.*``, intervals to ``1m``): at least 90 % return data, and every empty one has
a known reason (listed in the report this test prints). An alert is forced to fire for real: the
test rewrites the A100 capture the demo's telemetry source reads (the agent runs in a working
directory with a copy of examples/data and the demo's Slurm job mapping) so the GPU reports two
uncorrectable ECC errors, and AacoGpuUncorrectableErrors must reach Alertmanager's API with its
labels and runbook. Also checked: no rule fails to evaluate, the SLO breach alert turns pending for
an SLO the demo cannot meet, the latency exemplars in Prometheus carry trace IDs of traces the OTLP
receiver got.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, get_free_port, sample_bytes, skip_or_fail
from tests.integration.helpers import demo_on_free_ports, http_get, start_aaco, wait_for
from tests.support.prometheus_stack import (
    ScrapeJob,
    Server,
    http_json,
    instant_query,
    missing_binaries,
    range_query,
    start_alertmanager,
    start_prometheus,
)

pytestmark = pytest.mark.integration

RULES = sorted((ROOT / "dashboards" / "rules").glob("*.yaml"))
A100 = Path("examples/data/nvidia-smi/a100-sxm4-v12.xml.gz")
MIN_SHARE = 0.9
DEADLINE_S = 240.0

# Why a series can be absent from the demo: each empty panel query must be explained by one of these
# (the series it selects and why the demo has none), else the test fails.
_IMPACT = (
    "needs iterations outside a throttling episode too: the demo's amd-smi capture is throttled in every "
    "sample, so there are outside iterations only when the workload starts before the telemetry"
)
NO_SERIES_BECAUSE = {
    "aaco_events_dropped_total": "created with the first dropped event: the demo drops none",
    "node:aaco_events_dropped:rate5m": "recorded from aaco_events_dropped_total: the demo drops no event",
    "aaco_export_errors_total": "created with the first failed export: the demo's exports all succeed",
    "node:aaco_export_errors:rate5m": "recorded from aaco_export_errors_total: no export fails in the demo",
    "aaco_source_errors_total": "created with the first bad input: the demo's samples are all valid",
    "aaco_analyzer_errors_total": "created with the first analyzer failure: none in the demo",
    "aaco_captures_total": "no capture source in the demo: it runs a profiler (rocprofv3) on GPU processes, "
    "and this machine has neither",
    "aaco_spans_summarized_total": "created when an iteration's kernel spans exceed the span budget: the demo's "
    "iterations stay within it",
    "model:aaco_drift_active:nodes": "records only models in a drifted state: none drifts in a short run",
    "aaco_gpu_energy_joules_total": "no capture of the demo has an energy counter (the amd-smi sample's 0 J "
    "while drawing 34 W is no reading, so it is absent: docs/metrics.md, GPU telemetry)",
    # The GPU health dashboard: the demo's captures have no retired-page or row-remap counters (the A100 in MIG
    # mode reads N/A), NVLink errors and activity counters come from NVML's and amdsmi's libraries (no GPU
    # here), and the demo follows no kernel log. tests/integration/test_health_dashboard_live.py checks them.
    **dict.fromkeys(
        (
            "aaco_gpu_memory_retired_pages_total",
            "aaco_gpu_memory_retired_pages_pending",
            "aaco_gpu_memory_remapped_rows_total",
            "aaco_gpu_memory_row_remap_pending",
            "aaco_gpu_memory_row_remap_failure",
            "aaco_gpu_nvlink_errors_total",
            "aaco_gpu_xid_errors_total",
            "aaco_gpu_sm_active_ratio",
            "aaco_gpu_sm_occupancy_ratio",
            "aaco_gpu_tensor_active_ratio",
            "aaco_gpu_counters_paused",
        ),
        "no source of the demo gives it (no retired-page or remap counters in its captures, no GPU library, no "
        "kernel log); the GPU health dashboard is checked on real captures and a real kernel log by "
        "tests/integration/test_health_dashboard_live.py",
    ),
    # The impact needs iterations both inside and outside a throttling episode. The demo's amd-smi capture
    # reports throttling in every sample, so only iterations that finish before its first sample are
    # outside: on a loaded machine the telemetry can start first, and then there are none.
    "aaco_throttle_latency_impact_ratio": _IMPACT,
    "aaco_throttle_latency_impact_ci_low_ratio": _IMPACT,
    "aaco_throttle_latency_impact_ci_high_ratio": _IMPACT,
    "model:aaco_throttle_latency_impact:max": _IMPACT,
}


def _ids_from_receiver(receiver) -> set[str]:
    return {span.trace_id.hex() for _, span in receiver.got.spans()}


def _force_uncorrectable_errors(workdir: Path) -> None:
    """The A100 now reports 2 uncorrectable DRAM ECC errors (aggregate and volatile counters)."""
    path = workdir / A100
    text = sample_bytes(path).decode()
    changed = text.replace("<dram_uncorrectable>0</dram_uncorrectable>", "<dram_uncorrectable>2</dram_uncorrectable>")
    assert changed != text, "the A100 capture no longer has the ECC counters this test changes"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(changed.encode()))
    os.replace(tmp, path)  # atomically: the agent never reads half a file


def _empty(prom: Server, expr: str, instant: bool, since_s: float) -> bool:
    if instant:
        return not instant_query(prom, expr)
    return not any(r["values"] for r in range_query(prom, expr, since_s, step="2s"))


def _has_series(prom: Server, name: str) -> bool:
    return bool(instant_query(prom, f'count(last_over_time({{__name__="{name}"}}[10m]))'))


def _alertmanager_alerts(am: Server, name: str) -> list[dict]:
    query = urllib.parse.urlencode({"filter": f'alertname="{name}"'})
    return http_json(f"{am.url}/api/v2/alerts?{query}")


def test_dashboards_against_the_live_demo(tmp_path: Path, aaco_bin: str):
    from dashboards.queries import annotation_queries, expand, load, metric_names, panel_queries

    missing = missing_binaries()
    if missing:
        skip_or_fail(f"not installed: {', '.join(missing)} (Debian prometheus, prometheus-alertmanager)")
    from tests.support.otlp_receivers import GrpcReceiver

    workdir = tmp_path / "work"
    shutil.copytree(ROOT / "examples" / "data", workdir / "examples" / "data")
    shutil.copytree(ROOT / "examples" / "slurm-jobs", workdir / "examples" / "slurm-jobs")  # the demo's Slurm jobs
    # An SLO the demo cannot meet, provided from outside the project's rules as recording.yaml allows.
    slo = tmp_path / "provided-slo.yaml"
    slo.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "provided-slo",
                        "rules": [
                            {
                                "record": "aaco_iteration_latency_slo_seconds",
                                "expr": "vector(0.0001)",
                                "labels": {"model": "light_resnet50"},
                            }
                        ],
                    }
                ]
            }
        )
    )
    queries = [q for p in sorted((ROOT / "dashboards").glob("*.json")) for q in panel_queries(load(p))]
    annotations = [q for p in sorted((ROOT / "dashboards").glob("*.json")) for q in annotation_queries(load(p))]
    assert len(queries) > 80

    port = get_free_port()
    servers: list[Server] = []
    with GrpcReceiver() as receiver:
        agent = start_aaco(
            aaco_bin,
            "agent",
            "--config",
            str(demo_on_free_ports(tmp_path / "demo.yaml")),
            "--metrics-port",
            str(port),
            "--lake",
            str(tmp_path / "lake"),
            cwd=workdir,
            log=tmp_path / "agent.log",
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}"},
        )
        started = time.monotonic()
        try:
            am = start_alertmanager(tmp_path / "alertmanager")
            servers.append(am)
            prom = start_prometheus(
                tmp_path / "prometheus",
                [ScrapeJob("aaco", [f"127.0.0.1:{port}"], {"node": "demo-node"})],
                [*RULES, slo],
                am,
            )
            servers.append(prom)
            wait_for(lambda: http_get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 120, what="the agent's /readyz")

            # Force a real alert: once Prometheus has seen the A100's uncorrected counter at 0, the
            # capture reports 2; the agent reads it at its next sample.
            a100 = 'aaco_gpu_errors_total{error_type="uncorrected", model="NVIDIA A100-SXM4-80GB"}'
            wait_for(lambda: instant_query(prom, f"{a100} == 0"), 60, what="the A100's uncorrected error counter")
            _force_uncorrectable_errors(workdir)

            def explain(q) -> tuple[list[str], list[str]]:
                """The series of an empty query that Prometheus has none of, and why (when known)."""
                absent = sorted(n for n in metric_names(expand(q.expr)) if not _has_series(prom, n))
                return absent, [f"{n}: {NO_SERIES_BECAUSE[n]}" for n in absent if n in NO_SERIES_BECAUSE]

            def slo_pending() -> list[dict]:
                """The SLO breach alert for the model with the impossible SLO, pending or firing."""
                return [
                    a
                    for a in http_json(prom.url + "/api/v1/alerts")["data"]["alerts"]
                    if a["labels"]["alertname"] == "AacoIterationLatencySLOBreach"
                    and a["labels"].get("model") == "light_resnet50"
                ]

            def exemplar_ids(series: str) -> set[str]:
                doc = http_json(
                    prom.url + "/api/v1/query_exemplars", {"query": series, "start": f"{time.time() - 600:.0f}"}
                )
                return {e["labels"]["trace_id"] for s in doc["data"] for e in s["exemplars"]}

            exemplar_series = ("aaco_iteration_latency_seconds_bucket", "aaco_llm_time_to_first_token_seconds_bucket")

            # Poll until enough queries have data, every empty one is explained by series the demo
            # cannot have (others may still be warming up: rates need two scrapes, the analyzers'
            # results their first samples) and the forced alert is in Alertmanager. The SLO alert
            # and the exemplars checked below are waited for in the same loop (they warm up meanwhile).
            deadline = time.monotonic() + DEADLINE_S
            while True:
                assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
                since = time.monotonic() - started
                empty = [q for q in queries if _empty(prom, expand(q.expr), q.instant, since)]
                forced = _alertmanager_alerts(am, "AacoGpuUncorrectableErrors")
                enough = len(empty) <= (1 - MIN_SHARE) * len(queries)
                if (
                    enough
                    and forced
                    and all(len(why) == len(absent) > 0 for absent, why in map(explain, empty))
                    and slo_pending()
                    and all(exemplar_ids(s) & _ids_from_receiver(receiver) for s in exemplar_series)
                ):
                    break
                if time.monotonic() > deadline:
                    break
                time.sleep(2)
            elapsed = time.monotonic() - started

            # The report, as the loop left it: every empty query with its reason (asserted at the end).
            reasons = {}
            unexplained = []
            for q in empty:
                absent, why = explain(q)
                if not absent or len(why) < len(absent):
                    unexplained.append(f"{q.where}: {expand(q.expr)} (series absent: {absent or 'none'})")
                reasons[q.where] = "; ".join(why) or "?"
            share = 1 - len(empty) / len(queries)
            report = [
                f"live check after {elapsed:.0f} s: {len(queries) - len(empty)} of {len(queries)} panel queries "
                f"returned data ({share:.1%}); {len(empty)} empty:",
                *(f"  - {where}: {why}" for where, why in reasons.items()),
            ]
            print("\n".join(report))
            (tmp_path / "report.txt").write_text("\n".join(report) + "\n")

            # The forced alert reached Alertmanager, with its labels and annotations.
            assert forced, "AacoGpuUncorrectableErrors did not reach Alertmanager"
            (alert,) = [a for a in forced if a["labels"].get("model") == "NVIDIA A100-SXM4-80GB"]
            assert alert["labels"]["severity"] == "critical"
            assert alert["labels"]["node"] == "demo-node" and alert["labels"]["gpu"] == "0"
            assert alert["annotations"]["runbook_url"] == "docs/runbooks.md#aacogpuuncorrectableerrors"
            assert alert["annotations"]["summary"] == "Uncorrectable memory errors on GPU 0 of demo-node"
            assert alert["status"]["state"] == "active"

            # Every rule evaluates without error on real data.
            groups = http_json(prom.url + "/api/v1/rules")["data"]["groups"]
            assert {g["file"] for g in groups} == {str(p) for p in [*RULES, slo]}
            bad = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"]
            assert bad == [], bad

            # The SLO breach alert is on its way for the model with the impossible SLO.
            pending = wait_for(slo_pending, 60, what="AacoIterationLatencySLOBreach pending")
            assert pending[0]["state"] in ("pending", "firing") and pending[0]["labels"]["node"] == "demo-node"

            # Exemplars: the latency histogram's trace IDs are those of traces the OTLP receiver got.
            # The same for the LLM requests' time to first token: the request spans forwarded upstream.
            for series in exemplar_series:
                exemplars = wait_for(lambda s=series: exemplar_ids(s), 60, what=f"exemplars of {series} in Prometheus")
                assert all(re.fullmatch(r"[0-9a-f]{32}", t) for t in exemplars)
                wait_for(lambda e=exemplars: e & _ids_from_receiver(receiver), 60, what=f"{series}: a trace upstream")

            # Annotation queries run (they may be empty: no drift, no throttling).
            for q in annotations:
                instant_query(prom, expand(q.expr))

            # The template variables' queries find values (namespace: none outside Kubernetes).
            for label, match in [
                ("node", "aaco_agent_info"),
                ("gpu", "aaco_gpu_up"),
                ("model", "aaco_iteration_latency_seconds_count"),
                ("model", "aaco_llm_requests_total"),
                ("comm", "aaco_sched_oncpu_seconds_total"),
                ("job", "aaco_agent_info"),
            ]:
                values = http_json(f"{prom.url}/api/v1/label/{label}/values?match[]={urllib.parse.quote(match)}")
                assert values["data"], f"variable {label}: no values"

            assert unexplained == [], "empty without a known reason:\n" + "\n".join(unexplained)
            assert share >= MIN_SHARE, "\n".join(report)
            # The LLM serving dashboard on its own, fed by the demo's request spans only.
            serving = [q for q in queries if q.where.startswith("AACO / LLM serving /")]
            assert len(serving) > 20
            assert sum(q in empty for q in serving) <= (1 - MIN_SHARE) * len(serving), "\n".join(report)
        finally:
            if agent.poll() is None:
                agent.send_signal(signal.SIGTERM)
                try:
                    agent.wait(60)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait(10)
            for server in reversed(servers):
                server.stop()
    assert agent.returncode == 0, (tmp_path / "agent.log").read_text()[-3000:]
