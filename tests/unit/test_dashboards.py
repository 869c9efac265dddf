"""The dashboards as code: current JSON, variables, units and descriptions, trace links, the panels
the issue asks for, and every query on a metric the agent (or a recording rule) provides."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from tests.conftest import ROOT, skip_or_fail

DASHBOARDS = ROOT / "dashboards"
RULES = DASHBOARDS / "rules"
STANDARD_VARIABLES = ["datasource", "traces", "node", "namespace", "gpu", "model"]
# Series Prometheus makes itself for every target.
PROMETHEUS_SERIES = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
# Provided from outside the rules (see recording.yaml): a model's SLO in seconds, and its LLM serving
# objectives (records a rule file of the user's may add).
PROVIDED_SERIES = {"aaco_iteration_latency_slo_seconds", "aaco:llm_ttft_slo", "aaco:llm_tpot_slo"}

# The panels the issue lists for each dashboard, by a word of their title.
REQUIRED = {
    "gpu-node.json": [
        "utilisation",
        "power draw",
        "temperatures",
        "clocks against their maximum",
        "vram in use",
        "throttle episodes",
        "gpu errors",
        "gpu up",
    ],
    "workload.json": [
        "p50 / p95 / p99",
        "throughput",
        "kar",
        "launch tax",
        "temporal breakdown",
        "bottleneck class over time",
        "bottleneck evidence",
        "kernel family",
        "drift",
        "on the roofline",
        "how near the roof",
    ],
    "scheduler.json": ["runqueue latency", "context switches", "off-cpu time per workload"],
    "fleet.json": ["worst nodes", "latency spread", "throttled share", "drifting models"],
    "agent-health.json": [
        "events in",
        "events out",
        "events dropped",
        "queue",
        "export errors",
        "source lag",
        "scrape",
    ],
    "serving.json": [
        "time to first token p50 / p95 / p99",
        "time per output token p50 / p95 / p99",
        "tokens per second",
        "queue time",
        "request duration",
        "finish reason",
        "slo error ratio",
        "burn rate",
        "kernel family",
        "device active ratio",
        "per pod",
    ],
    "jobs.json": [
        "step time by rank",
        "straggler",
        "overlap",
        "bus bandwidth",
        "link's peak",
        "temporal breakdown",
        "critical path",
    ],
    "gpu-health.json": [
        "verdict",
        "reasons",
        "uncorrected ecc",
        "retired pages",
        "pcie replays",
        "nvlink",
        "xid",
        "activity",
    ],
    "shared-gpus.json": [
        "workloads on each gpu and slice",
        "sm share by workload",
        "device memory by workload",
        "memory used of each slice",
        "power by workload",
        "energy by workload",
        "slurm jobs on gpus",
    ],
}


def generated() -> dict[str, dict]:
    """The checked-in dashboards."""
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(doc: dict) -> list[dict]:
    from dashboards.lib import iter_panels

    return list(iter_panels(doc))


def test_generated_json_is_current():
    try:
        import grafana_foundation_sdk  # noqa: F401
    except ImportError:
        skip_or_fail("grafana-foundation-sdk is not installed (pip install -e .[dev], Python >= 3.11)")
    from dashboards.generate import DASHBOARDS as SPECS
    from dashboards.generate import stale

    assert stale(DASHBOARDS) == [], "run python -m dashboards.generate"
    assert sorted(generated()) == sorted(f"{name}.json" for name in SPECS)


def test_the_dashboards_exist_with_unique_uids():
    docs = generated()
    assert sorted(docs) == sorted(REQUIRED)
    uids = [d["uid"] for d in docs.values()]
    assert len(set(uids)) == len(uids)
    assert {d["title"] for d in docs.values()} == {
        "AACO / GPU node overview",
        "AACO / Workload diagnosis",
        "AACO / CPU scheduler",
        "AACO / Fleet",
        "AACO / Agent health",
        "AACO / LLM serving",
        "AACO / Training jobs",
        "AACO / GPU health",
        "AACO / Shared GPUs",
    }


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_standard_variables(name: str):
    doc = generated()[name]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert list(variables)[: len(STANDARD_VARIABLES)] == STANDARD_VARIABLES
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["traces"]["type"] == "datasource" and variables["traces"]["query"] in ("tempo", "jaeger")
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"]["uid"] == "${datasource}"
            assert v["includeAll"] and v["allValue"] == ".*", v["name"]


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_every_panel_has_a_unit_a_description_and_prometheus_queries(name: str):
    doc = generated()[name]
    ids = [p["id"] for p in doc["panels"]]
    assert len(set(ids)) == len(ids)
    for panel in panels(doc):
        where = f"{name} / {panel['title']}"
        assert panel["fieldConfig"]["defaults"].get("unit"), where
        assert len(panel.get("description", "")) > 30, where
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert panel["targets"], where
        for t in panel["targets"]:
            assert t["expr"].strip() and t["refId"], where
        assert 0 < panel["gridPos"]["w"] <= 24 and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, where


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_required_panels(name: str):
    titles = [p["title"].lower() for p in panels(generated()[name])]
    for word in REQUIRED[name]:
        assert any(word in t for t in titles), f"{name}: no panel about {word!r} in {titles}"


def test_latency_panels_carry_exemplars_and_link_to_traces():
    latency_panels = [
        (name, p)
        for name, doc in generated().items()
        for p in panels(doc)
        if p["type"] == "timeseries" and any("aaco_iteration_latency_seconds_bucket" in t["expr"] for t in p["targets"])
    ]
    assert len(latency_panels) >= 3
    for name, p in latency_panels:
        assert all(t.get("exemplar") for t in p["targets"]), (name, p["title"])
        links = p["fieldConfig"]["defaults"]["links"]
        assert links and all("${traces}" in link["url"] for link in links), (name, p["title"])
        assert all("${__field.labels.model}" in link["url"] for link in links)


def test_serving_latency_panels_carry_exemplars_and_search_the_request_spans():
    from urllib.parse import parse_qs, unquote, urlparse

    doc = generated()["serving.json"]
    latency = [p for p in panels(doc) if p["title"].startswith(("Time to", "Time per", "Request duration", "Queue"))]
    assert len(latency) == 4
    for p in latency:
        assert p["fieldConfig"]["defaults"]["unit"] == "s"
        assert all(t.get("exemplar") and "_bucket{" in t["expr"] for t in p["targets"]), p["title"]
        (link,) = p["fieldConfig"]["defaults"]["links"]
        panes = json.loads(unquote(parse_qs(urlparse(link["url"]).query)["panes"][0]))
        (query,) = next(iter(panes.values()))["queries"]
        # the server's own spans (any service), by the model attribute vLLM sets
        assert query["query"] == '{span.gen_ai.response.model="${__field.labels.model}"}', p["title"]
    variables = {v["name"]: v for v in doc["templating"]["list"]}
    assert "aaco_llm_requests_total" in variables["model"]["query"]
    assert "aaco_llm_requests_total" in variables["namespace"]["query"]


def test_trace_link_opens_a_traceql_search_of_the_model():
    from urllib.parse import parse_qs, unquote, urlparse

    doc = generated()["workload.json"]
    panel = next(p for p in panels(doc) if p["title"] == "Iteration latency p50 / p95 / p99")
    url = panel["fieldConfig"]["defaults"]["links"][0]["url"]
    panes = json.loads(unquote(parse_qs(urlparse(url).query)["panes"][0]))
    (pane,) = panes.values()
    (query,) = pane["queries"]
    assert pane["datasource"] == "${traces}" and query["datasource"] == {"type": "tempo", "uid": "${traces}"}
    assert query["query"] == '{resource.service.name="aaco-agent" && span.aaco.model="${__field.labels.model}"}'
    assert pane["range"] == {"from": "${__from}", "to": "${__to}"}


def test_jaeger_variant():
    try:
        from dashboards.generate import models
    except ImportError:
        skip_or_fail("grafana-foundation-sdk is not installed (pip install -e .[dev], Python >= 3.11)")
    docs = models("jaeger")
    traces = next(v for v in docs["workload.json"]["templating"]["list"] if v["name"] == "traces")
    assert traces["query"] == "jaeger"
    assert "jaeger" in json.dumps(docs["workload.json"]) and "traceql" not in json.dumps(docs["workload.json"])


def _known_series() -> set[str]:
    from aaco.agent.metrics_doc import all_metrics, prom_exposed_name

    names = set(PROMETHEUS_SERIES | PROVIDED_SERIES)
    for m in all_metrics():
        exposed = prom_exposed_name(m)
        names.add(exposed)
        if m.kind == "histogram":
            names |= {f"{m.prom_name}_bucket", f"{m.prom_name}_count", f"{m.prom_name}_sum"}
    for path in RULES.glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r["record"] for r in group["rules"] if "record" in r}
    return names


def test_every_query_selects_series_the_agent_or_the_rules_provide():
    from dashboards.queries import annotation_queries, metric_names, panel_queries

    known = _known_series()
    unknown = {}
    for doc in generated().values():
        for q in [*panel_queries(doc), *annotation_queries(doc)]:
            for name in metric_names(q.expr) - known:
                unknown.setdefault(name, []).append(q.where)
    assert unknown == {}, f"queries on series nothing provides: {unknown}"


def test_every_rule_selects_series_the_agent_or_the_rules_provide():
    from dashboards.queries import metric_names

    known = _known_series()
    for path in RULES.glob("*.yaml"):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                unknown = metric_names(rule["expr"]) - known
                assert not unknown, (path.name, rule.get("alert") or rule.get("record"), unknown)


def test_default_llm_objectives_sit_on_histogram_bounds():
    """An SLO threshold counts the requests of the bucket at its ``le``: it must be a bound of the agent's
    histogram, or the SLI has no good requests to count (and no value)."""
    from aaco.agent.metrics_doc import all_metrics

    bounds = {m.prom_name: m.buckets for m in all_metrics() if m.kind == "histogram"}
    metric = {"ttft": "aaco_llm_time_to_first_token_seconds", "tpot": "aaco_llm_time_per_output_token_seconds"}
    rules = {
        r["record"]: r
        for g in yaml.safe_load((RULES / "recording.yaml").read_text())["groups"]
        for r in g["rules"]
        if "record" in r
    }
    for sli, name in metric.items():
        default = rules[f"aaco:llm_{sli}_slo:default"]
        assert float(default["labels"]["le"]) in bounds[name], (sli, default["labels"]["le"], bounds[name])
        assert default["expr"] == "vector(0.95)"
    assert rules["aaco:llm_ttft_slo:default"]["labels"]["le"] == "2"
    assert rules["aaco:llm_tpot_slo:default"]["labels"]["le"] == "0.1"


def test_expand_fills_variables_and_intervals():
    from dashboards.queries import expand

    expr = 'rate(x{node=~"$node", gpu=~"${gpu}", m=~"${model:regex}"}[$__rate_interval]) + y[$__interval] + z[$__range]'
    assert expand(expr) == 'rate(x{node=~".*", gpu=~".*", m=~".*"}[1m]) + y[1m] + z[1m]'


def test_metric_names_finds_series_not_functions_labels_or_keywords():
    from dashboards.queries import metric_names

    expr = (
        'histogram_quantile(0.99, sum by (node, le) (rate(a_bucket{node=~"x", job="up"}[5m]))) '
        "/ on (model) group_left () node:b:ratio > bool 1 or vector(0) unless c offset 1h"
    )
    assert metric_names(expr) == {"a_bucket", "node:b:ratio", "c"}


def test_dashboards_readme_names_every_dashboard():
    readme = (DASHBOARDS / "README.md").read_text()
    for name in REQUIRED:
        assert name in readme, name
    assert re.search(r"python -m dashboards\.generate", readme)
