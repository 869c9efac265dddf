"""deploy/: the collector gateway configuration, the image's Containerfile and docs/deploy.md keep their promises.

No OpenTelemetry Collector runs here, so these check structure: every component a pipeline names
is defined and is a real component of the pinned Collector version, the Containerfile
(deploy/image/Containerfile; tests/image builds and runs it) is multi-stage and ends as a non-root
user, the docs cover what the issue asks.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
GATEWAY = ROOT / "deploy" / "collector" / "gateway.yaml"
COLLECTOR_README = ROOT / "deploy" / "collector" / "README.md"
DOCKERFILE = ROOT / "deploy" / "image" / "Containerfile"
DEPLOY_DOC = ROOT / "docs" / "deploy.md"
SECURITY_DOC = ROOT / "docs" / "security.md"
CHART_VALUES = ROOT / "deploy" / "helm" / "aaco" / "values.yaml"

# Component types of otel/opentelemetry-collector-contrib 0.156.0 that the gateway may use (their
# current lower_snake_case names; README.md lists the deprecated aliases).
KNOWN = {
    "receivers": {"otlp"},
    "processors": {"memory_limiter", "batch", "resource"},
    "exporters": {"otlp_grpc", "otlp_http", "prometheus_remote_write", "prometheus", "awss3"},
    "extensions": {"health_check", "file_storage"},
}


def gateway() -> dict:
    return yaml.safe_load(GATEWAY.read_text())


def kind_of(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def test_gateway_components_are_real_and_wired():
    cfg = gateway()
    for section, known in KNOWN.items():
        for cid in cfg[section]:
            assert kind_of(cid) in known, f"{section}.{cid}"
    pipelines = cfg["service"]["pipelines"]
    used: dict[str, set[str]] = {s: set() for s in ("receivers", "processors", "exporters")}
    for name, pipe in pipelines.items():
        for section, seen in used.items():
            for cid in pipe.get(section, []):
                assert cid in cfg[section], f"pipeline {name} names undefined {section[:-1]} {cid}"
                seen.add(cid)
        # memory_limiter first (refuse before memory runs out), batch last (after every transform).
        assert pipe["processors"][0] == "memory_limiter", name
        assert pipe["processors"][-1] == "batch", name
    for section, ids in used.items():
        assert set(cfg[section]) == ids, f"{section} defined but unused: {set(cfg[section]) - ids}"
    assert set(cfg["service"]["extensions"]) == set(cfg["extensions"])


def test_gateway_fans_out_to_traces_metrics_and_object_storage():
    cfg = gateway()
    pipelines = cfg["service"]["pipelines"]
    assert {"traces", "metrics", "logs"} <= set(pipelines)
    trace_kinds = {kind_of(e) for e in pipelines["traces"]["exporters"]}
    assert {"otlp_grpc", "awss3"} <= trace_kinds
    assert {kind_of(e) for e in pipelines["metrics"]["exporters"]} & {"prometheus_remote_write", "prometheus"}
    grpc = cfg["receivers"]["otlp"]["protocols"]["grpc"]
    http = cfg["receivers"]["otlp"]["protocols"]["http"]
    assert grpc["endpoint"].endswith(":4317") and http["endpoint"].endswith(":4318")
    assert grpc["tls"]["client_ca_file"], "agents authenticate with client certificates"
    # Persistent queues name a storage extension that exists.
    for cid, exporter in cfg["exporters"].items():
        storage = (exporter.get("sending_queue") or {}).get("storage")
        if storage:
            assert storage in cfg["extensions"], cid
    limiter = cfg["processors"]["memory_limiter"]
    assert 0 < limiter["spike_limit_percentage"] < limiter["limit_percentage"] <= 90


def test_gateway_environment_is_documented():
    code = "\n".join(ln for ln in GATEWAY.read_text().splitlines() if not ln.lstrip().startswith("#"))
    variables = set(re.findall(r"\$\{env:([A-Z0-9_]+)", code))
    readme = COLLECTOR_README.read_text()
    assert variables, "the gateway reads its endpoints from the environment"
    for var in variables:
        assert f"`{var}`" in readme, var
    assert "## Sizing" in readme and "0.156.0" in readme


def dockerfile_lines() -> list[str]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_dockerfile_is_multi_stage_and_non_root():
    lines = dockerfile_lines()
    stages = [ln for ln in lines if ln.startswith("FROM ")]
    assert len(stages) >= 2
    assert all(" AS " in s for s in stages)
    assert all(":latest" not in s for s in stages)
    last_stage = max(i for i, ln in enumerate(lines) if ln.startswith("FROM "))
    runtime = lines[last_stage:]
    assert any(ln.startswith("COPY --from=build") for ln in runtime)
    (user,) = [ln for ln in runtime if ln.startswith("USER ")]
    uid = user.split()[1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0
    assert any("python3-bpfcc" in ln for ln in runtime), "bcc for the eBPF scheduler source"
    assert any("aaco-system-bcc.pth" in ln for ln in runtime), "bcc reachable from the virtualenv alone"
    assert 'ENTRYPOINT ["aaco"]' in runtime
    assert not any("linux-headers" in ln for ln in lines), "headers come from the node, not the image"


def test_dockerfile_documents_its_strategy():
    comments = "\n".join(ln for ln in DOCKERFILE.read_text().splitlines() if ln.startswith("#"))
    for topic in ("bcc", "headers", "/lib/modules", "CONFIG_IKHEADERS", "non-root", "uid"):
        assert topic.lower() in comments.lower(), topic


def test_deploy_doc_covers_install_upgrade_values_troubleshooting():
    doc = DEPLOY_DOC.read_text()
    for heading in (
        "## Install",
        "## Upgrade",
        "## Values that matter",
        "## Troubleshooting",
        "### eBPF not loading",
        "### No GPUs seen",
    ):
        assert heading in doc, heading
    values = yaml.safe_load((ROOT / "deploy" / "helm" / "aaco" / "values.yaml").read_text())
    table = doc[doc.index("## Values that matter") : doc.index("### What the agent may do")]
    named = []
    for row in table.splitlines():
        if row.startswith("| `"):
            named += re.findall(r"`([^`]+)`", row.split("|")[1])
    assert len(named) >= 15
    for path in named:  # every value the table names exists in values.yaml
        node = values
        for part in path.split("."):
            assert isinstance(node, dict) and part in node, path
            node = node[part]


def test_security_doc_covers_every_door_and_the_chart_formula():
    doc = SECURITY_DOC.read_text()
    headings = re.findall(r"^## (.+)$", doc, re.MULTILINE)
    assert headings == [
        "Threat model",
        "OTLP receiver",
        "/metrics",
        "The HTTP ports",
        "Admin actions",
        "Files",
        "Memory",
        "Chart",
    ]
    sections = dict(zip(headings, re.split(r"^## .+$", doc, flags=re.MULTILINE)[1:], strict=True))
    assert all(text.strip() for text in sections.values()), "no section left empty"
    values = yaml.safe_load(CHART_VALUES.read_text())
    base, budget = values["memoryLimit"]["baseMiB"], values["config"]["exporters"]["otlp"]["memory_budget_mib"]
    memory = sections["Memory"]
    assert "memoryLimit.baseMiB + 2 x config.exporters.otlp.memory_budget_mib" in memory
    assert f"{base} Mi + 2 x {budget} Mi = {base + 2 * budget} Mi" in memory, "the worked example follows values.yaml"
    assert "memoryLimit.baseMiB + 2 x config.exporters.otlp.memory_budget_mib" in CHART_VALUES.read_text()
    for secret_value in ("admin.existingSecret", "metrics.tls.existingSecret", "receiver.tls.existingSecret"):
        assert secret_value in sections["Chart"], secret_value
