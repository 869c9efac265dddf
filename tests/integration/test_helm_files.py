"""One source of truth: the chart's PrometheusRules and dashboard ConfigMaps are the files of dashboards/.

The chart carries byte-for-byte copies under files/ (Helm reads nothing outside the chart), made by
deploy/helm/sync_chart_files.py. These tests fail when the copies differ from dashboards/, check that
the rendered PrometheusRules and ConfigMaps equal the source files, and exercise the mechanism on a
copy of the chart: nothing while dashboards/ is empty, everything once files appear.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.helm_chart import (
    CHART_DIR,
    DASHBOARDS_DIR,
    NAMESPACE,
    RELEASE,
    SYNC_SCRIPT,
    render,
    sync_module,
)

pytestmark = pytest.mark.integration

MONITORING = {"prometheusRule": {"enabled": True}, "dashboards": {"enabled": True}}

DASHBOARD = {
    "title": "GPU node overview",
    "uid": "aaco-gpu-node",
    "schemaVersion": 39,
    "panels": [{"type": "timeseries", "title": "Power", "targets": [{"expr": "aaco_gpu_power_watts"}]}],
}
RULES = """# Alerts of the agent itself.
groups:
  - name: aaco.agent
    rules:
      - alert: AacoAgentDown
        expr: absent(up{job="aaco"} == 1)
        for: 5m
        labels:
          severity: critical
        annotations:
          summary: "AACO agent down on {{ $labels.node }}"
          runbook_url: docs/runbooks.md#aacoagentdown
      - record: node:aaco_gpu_power_watts:sum
        expr: sum by (node) (aaco_gpu_power_watts)
"""
PROMTOOL_TEST = """rule_files: [agent.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series: []
    alert_rule_test: []
"""


def check_real_copies() -> list[str]:
    sync = sync_module()
    plan = sync.make_plan(DASHBOARDS_DIR)
    return sync.differences(plan.expected(DASHBOARDS_DIR), sync.current(CHART_DIR / "files"))


def test_chart_copies_equal_dashboards_folder():
    """Fails when dashboards/ changed without `python deploy/helm/sync_chart_files.py`."""
    stale = check_real_copies()
    assert stale == [], f"run python {SYNC_SCRIPT.relative_to(SYNC_SCRIPT.parents[2])}: {stale}"


def test_sync_check_command_agrees():
    proc = subprocess.run([sys.executable, str(SYNC_SCRIPT), "--check"], capture_output=True, text=True, check=False)
    assert proc.returncode == (1 if check_real_copies() else 0), proc.stderr


def _rendered_rules(rendered) -> dict[str, dict]:
    return {doc["metadata"]["annotations"]["aaco.io/source"]: doc for doc in rendered.all("PrometheusRule")}


def _rendered_dashboards(rendered) -> dict[str, dict]:
    return {
        doc["metadata"]["annotations"]["aaco.io/source"]: doc
        for doc in rendered.all("ConfigMap")
        if "aaco.io/source" in doc["metadata"].get("annotations", {})
    }


def assert_chart_matches(source_root: Path, rendered, repo_name: str = "dashboards") -> tuple[int, int]:
    """Every rule file and dashboard of ``source_root`` rendered exactly once, equal to its file."""
    sync = sync_module()
    plan = sync.make_plan(source_root)
    rules = {k: v for k, v in plan.copies.items() if k.startswith("rules/")}
    dashboards = {k: v for k, v in plan.copies.items() if k.startswith("dashboards/")}
    got_rules = _rendered_rules(rendered)
    got_dashboards = _rendered_dashboards(rendered)
    want_rules = {f"{repo_name}/{p.relative_to(source_root).as_posix()}": p for p in rules.values()}
    want_dashboards = {f"{repo_name}/{p.relative_to(source_root).as_posix()}": p for p in dashboards.values()}
    assert set(got_rules) == set(want_rules)
    assert set(got_dashboards) == set(want_dashboards)
    for source, path in want_rules.items():
        assert got_rules[source]["spec"]["groups"] == yaml.safe_load(path.read_text())["groups"], source
    for source, path in want_dashboards.items():
        (data,) = got_dashboards[source]["data"].values()
        assert data == path.read_text(), source  # byte for byte, not just the same JSON
        assert json.loads(data) == json.loads(path.read_text())
    return len(want_rules), len(want_dashboards)


def test_rendered_rules_and_dashboards_equal_the_files_in_dashboards():
    rendered = render(MONITORING)
    n_rules, n_dashboards = assert_chart_matches(DASHBOARDS_DIR, rendered)
    assert len(rendered.all("PrometheusRule")) == n_rules
    assert len(_rendered_dashboards(rendered)) == n_dashboards
    # Off by default (the CRDs and the Grafana sidecar may not exist in the cluster).
    off = render({})
    assert off.all("PrometheusRule") == [] and len(off.all("ConfigMap")) == 1


@pytest.fixture
def chart_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the chart and an empty dashboards/ folder beside it."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART_DIR, chart)
    for kind in ("dashboards", "rules"):
        for f in (chart / "files" / kind).iterdir():
            if f.name != ".gitkeep":
                f.unlink()
    source = tmp_path / "repo" / "dashboards"
    source.mkdir(parents=True)
    return chart, source


def run_sync(source: Path, chart: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SYNC_SCRIPT), "--source", str(source), "--chart", str(chart), *extra],
        capture_output=True,
        text=True,
        check=False,
    )


def test_empty_dashboards_folder_renders_nothing(chart_copy: tuple[Path, Path]):
    chart, source = chart_copy
    (source / "README.md").write_text("# dashboards\n")
    assert run_sync(source, chart).returncode == 0
    assert run_sync(source, chart, "--check").returncode == 0
    rendered = render(MONITORING, chart_dir=chart)
    assert rendered.all("PrometheusRule") == []
    assert _rendered_dashboards(rendered) == {}
    notes = rendered.texts["aaco/templates/NOTES.txt"]
    assert "files/rules/ is empty" in notes and "files/dashboards/ is empty" in notes


def test_files_are_picked_up_when_they_appear(chart_copy: tuple[Path, Path]):
    chart, source = chart_copy
    assert run_sync(source, chart).returncode == 0
    # Files appear (as issue 8 will add them): generated JSON in a subfolder, rules, a promtool test,
    # and JSON that is not a dashboard.
    (source / "generated").mkdir()
    (source / "generated" / "gpu node.json").write_text(json.dumps(DASHBOARD, indent=2) + "\n")
    (source / "rules").mkdir()
    (source / "rules" / "agent.yaml").write_text(RULES)
    (source / "rules" / "agent_test.yml").write_text(PROMTOOL_TEST)
    (source / "panels.json").write_text('{"not": "a dashboard"}')
    check = run_sync(source, chart, "--check")
    assert check.returncode == 1
    assert "files/rules/agent.yaml: missing" in check.stderr
    assert "files/dashboards/gpu-node.json: missing" in check.stderr
    sync = run_sync(source, chart)
    assert sync.returncode == 0, sync.stderr
    assert "skipped dashboards/rules/agent_test.yml" in sync.stderr
    assert "skipped dashboards/panels.json" in sync.stderr
    assert run_sync(source, chart, "--check").returncode == 0
    rendered = render(MONITORING, chart_dir=chart)
    assert assert_chart_matches(source, rendered) == (1, 1)
    (rule,) = rendered.all("PrometheusRule")
    assert rule["metadata"]["name"] == f"{RELEASE}-agent"
    assert rule["metadata"]["namespace"] == NAMESPACE
    (cm,) = _rendered_dashboards(rendered).values()
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "AACO"
    assert list(cm["data"]) == ["gpu-node.json"]
    # A changed source makes the copy stale; a removed source removes its copy.
    (source / "rules" / "agent.yaml").write_text(RULES.replace("for: 5m", "for: 10m"))
    assert "files/rules/agent.yaml: differs from its source" in run_sync(source, chart, "--check").stderr
    (source / "generated" / "gpu node.json").unlink()
    run_sync(source, chart)
    assert not (chart / "files" / "dashboards" / "gpu-node.json").exists()
    rendered = render(MONITORING, chart_dir=chart)
    assert assert_chart_matches(source, rendered) == (1, 0)
    assert rendered.one("PrometheusRule")["spec"]["groups"][0]["rules"][0]["for"] == "10m"


def test_dashboard_namespace_and_sidecar_label_are_configurable(chart_copy: tuple[Path, Path]):
    chart, source = chart_copy
    (source / "overview.json").write_text(json.dumps(DASHBOARD))
    run_sync(source, chart)
    values = {"dashboards": {"enabled": True, "namespace": "grafana", "label": "dash", "labelValue": "yes"}}
    (cm,) = _rendered_dashboards(render(values, chart_dir=chart)).values()
    assert cm["metadata"]["namespace"] == "grafana"
    assert cm["metadata"]["labels"]["dash"] == "yes"


def test_name_clashes_and_broken_sources_are_errors(chart_copy: tuple[Path, Path]):
    chart, source = chart_copy
    (source / "a").mkdir()
    (source / "b").mkdir()
    (source / "a" / "x.json").write_text(json.dumps(DASHBOARD))
    (source / "b" / "x.json").write_text(json.dumps(DASHBOARD))
    clash = run_sync(source, chart)
    assert clash.returncode == 2 and "would both be copied as files/dashboards/x.json" in clash.stderr
    shutil.rmtree(source / "b")
    (source / "broken.json").write_text('{"panels": [')
    broken = run_sync(source, chart)
    assert broken.returncode == 2 and "dashboards/broken.json: not readable JSON" in broken.stderr


def test_a_rule_file_without_groups_in_the_chart_fails_the_render(chart_copy: tuple[Path, Path]):
    from tests.support.helm_chart import helm

    chart, _ = chart_copy
    (chart / "files" / "rules" / "bad.yaml").write_text("rule_files: []\n")
    with pytest.raises(helm().HelmError) as err:
        render(MONITORING, chart_dir=chart)
    assert "needs top-level groups" in str(err.value)


def test_the_packaged_chart_carries_the_copies_and_renders_the_same(chart_copy: tuple[Path, Path], tmp_path: Path):
    """`helm package` (what a chart repository serves) keeps files/ and drops only the placeholders."""
    import tarfile

    from tests.support.helm_chart import helm

    chart, source = chart_copy
    (source / "rules").mkdir()
    (source / "rules" / "agent.yaml").write_text(RULES)
    (source / "overview.json").write_text(json.dumps(DASHBOARD))
    assert run_sync(source, chart).returncode == 0
    h = helm()
    archive = Path(h.package(chart, destination=tmp_path / "dist"))
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"aaco/files/rules/agent.yaml", "aaco/files/dashboards/overview.json", "aaco/files/sources.yaml"} <= names
    assert not any(n.endswith(".gitkeep") for n in names)
    with h.Chart.load(archive) as packaged:
        from_archive = packaged.render(MONITORING, name=RELEASE, namespace=NAMESPACE)
    from_dir = render(MONITORING, chart_dir=chart).texts
    assert from_archive == from_dir
