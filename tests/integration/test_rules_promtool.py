"""The Prometheus rules of dashboards/rules/ with the real promtool (Debian ``prometheus``).

``promtool check rules`` on every rule file; the unit tests pass, every alert fires in them and a
near miss does not; an alert whose expression never fires makes its tests fail (so they test it);
every alert carries severity, summary, description and a runbook_url that names a section of
docs/runbooks.md; every dashboard query is valid PromQL by promtool's parser.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, skip_or_fail

pytestmark = pytest.mark.integration

RULES = ROOT / "dashboards" / "rules"
TESTS = RULES / "tests"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
SEVERITIES = {"critical", "warning", "info"}


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        skip_or_fail("promtool not installed (Debian package prometheus; bash .ci/setup --test as root)")
    return path


def rule_files() -> list[Path]:
    return sorted(RULES.glob("*.yaml"))


def unit_test_files() -> list[Path]:
    return sorted(TESTS.glob("*_test.yaml"))


def alerts() -> dict[str, tuple[Path, dict]]:
    out = {}
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    assert rule["alert"] not in out, f"alert {rule['alert']} defined twice"
                    out[rule["alert"]] = (path, rule)
    return out


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


def test_promtool_check_rules_on_every_file():
    files = rule_files()
    assert {p.name for p in files} >= {
        "recording.yaml",
        "alerts-workload.yaml",
        "alerts-gpu.yaml",
        "alerts-agent.yaml",
        "alerts-serving.yaml",
        "alerts-jobs.yaml",
    }
    for path in files:
        proc = run_promtool("check", "rules", str(path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "SUCCESS" in proc.stdout


def test_the_alerts_the_issue_asks_for():
    names = set(alerts())
    assert len(names) >= 8
    assert {
        "AacoIterationLatencySLOBreach",
        "AacoLatencyDriftDetected",
        "AacoThrottlingWithLatencyImpact",
        "AacoLaunchBoundRegression",
        "AacoGpuDown",
        "AacoGpuMissing",
        "AacoGpuUncorrectableErrors",
        "AacoAgentDown",
        "AacoAgentAbsent",
        "AacoAgentDroppingEvents",
        "AacoExporterFailing",
        "AacoLlmTtftBudgetBurnFast",
        "AacoLlmTtftBudgetBurnSlow",
        "AacoLlmTpotBudgetBurnFast",
        "AacoLlmTpotBudgetBurnSlow",
        "AacoJobRankStraggling",
        "AacoGpuUnhealthy",
        "AacoGpuHealthWarning",
        "AacoGpuPcieReplaysRising",
    } <= names
    # issue 29: the health verdict, PCIe replays past DCGM's 8 a minute (uncorrected ECC: AacoGpuUncorrectableErrors)
    rules = {n: r for n, (_, r) in alerts().items()}
    assert 'aaco_gpu_health{status="unhealthy"}' in rules["AacoGpuUnhealthy"]["expr"]
    assert rules["AacoGpuUnhealthy"]["for"] == "1m" and rules["AacoGpuHealthWarning"]["for"] == "15m"
    assert "aaco_gpu_health_reason" in rules["AacoGpuUnhealthy"]["annotations"]["summary"]
    assert "rate(aaco_gpu_pcie_replays_total[5m]) * 60 > 8" in rules["AacoGpuPcieReplaysRising"]["expr"]
    assert rules["AacoGpuPcieReplaysRising"]["for"] == "10m"
    # issue 28: a rank has straggled for 10 minutes
    straggling = alerts()["AacoJobRankStraggling"][1]
    assert "aaco_job_straggler" in straggling["expr"] and straggling["for"] == "10m"
    # "agent down (absent)": the absent() form exists
    assert "absent(" in alerts()["AacoAgentAbsent"][1]["expr"]
    # the SRE workbook's pairs: 14.4x over 1h and 5m, 6x over 6h and 30m
    for sli in ("ttft", "tpot"):
        fast = alerts()[f"AacoLlm{sli.title()}BudgetBurnFast"][1]["expr"]
        slow = alerts()[f"AacoLlm{sli.title()}BudgetBurnSlow"][1]["expr"]
        assert "14.4 *" in fast and "ratio_rate1h" in fast and "ratio_rate5m" in fast
        assert "6 *" in slow and "ratio_rate6h" in slow and "ratio_rate30m" in slow


def runbook_sections() -> dict[str, str]:
    """GitHub-style anchors of the second-level headings of docs/runbooks.md -> their text."""
    sections: dict[str, str] = {}
    current = None
    for line in RUNBOOKS.read_text().splitlines():
        if line.startswith("## "):
            current = re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
            sections[current] = ""
        elif current:
            sections[current] += line + "\n"
    return sections


def test_every_alert_is_labelled_annotated_and_has_a_runbook_section():
    sections = runbook_sections()
    for name, (_, rule) in alerts().items():
        assert rule["labels"]["severity"] in SEVERITIES, name
        ann = rule["annotations"]
        assert ann["summary"].strip() and len(ann["description"]) > 40, name
        url = ann["runbook_url"]
        assert url.startswith("docs/runbooks.md#"), name
        anchor = url.split("#", 1)[1]
        assert anchor == name.lower(), name
        assert anchor in sections, f"{name}: docs/runbooks.md has no section #{anchor}"
        text = sections[anchor]
        for part in ("**Meaning.**", "**Confirm.**", "**What to do.**"):
            assert part in text, f"runbook of {name} lacks {part}"
    # and no runbook section for an alert that does not exist
    assert set(sections) == {n.lower() for n in alerts()}


def test_promtool_unit_tests_pass():
    """Every unit test file passes; one promtool per file, run side by side (they are independent)."""
    files = unit_test_files()
    with ThreadPoolExecutor(max_workers=len(files)) as pool:
        procs = list(pool.map(lambda p: run_promtool("test", "rules", p.name, cwd=TESTS), files))
    for path, proc in zip(files, procs, strict=True):
        assert proc.returncode == 0, f"{path.name}: {proc.stdout + proc.stderr}"
        assert proc.stdout.count("SUCCESS") == 1, f"{path.name}: {proc.stdout}"


def _label_sets(group: dict) -> list[dict[str, str]]:
    out = []
    for s in group["input_series"]:
        m = re.fullmatch(r"\s*([\w:]*)\s*(\{.*\})?\s*", s["series"])
        assert m, s["series"]
        labels = dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', m.group(2) or ""))
        labels.pop("le", None)
        out.append(labels)
    return out


def test_every_alert_fires_in_the_unit_tests_beside_a_near_miss():
    """Each alert has a case where it fires; the same test group holds series that must not fire
    (promtool compares the whole list of alerts, so any near miss that fired would fail the test),
    and an evaluation where the alert is expected not to fire (before its `for`, or a near miss)."""
    fires: dict[str, int] = {}
    near_misses: dict[str, int] = {}
    quiet: dict[str, int] = {}
    for path in unit_test_files():
        doc = yaml.safe_load(path.read_text())
        for group in doc["tests"]:
            series = _label_sets(group)
            for case in group.get("alert_rule_test", []):
                name = case["alertname"]
                expected = case.get("exp_alerts") or []
                if not expected:
                    quiet[name] = quiet.get(name, 0) + 1
                    continue
                fires[name] = fires.get(name, 0) + 1
                exp_labels = [e["exp_labels"] for e in expected]
                misses = [s for s in series if not any(all(e.get(k) == v for k, v in s.items()) for e in exp_labels)]
                if misses:
                    near_misses[name] = near_misses.get(name, 0) + len(misses)
    for name in alerts():
        assert fires.get(name), f"{name} never fires in dashboards/rules/tests/"
        assert near_misses.get(name), f"{name}: no near-miss series beside its firing case"
        assert quiet.get(name), f"{name}: no evaluation where it must stay quiet"


@pytest.mark.parametrize("alert", sorted(alerts()))
def test_an_alert_that_never_fires_fails_its_tests(alert: str, tmp_path: Path):
    """Mutation check: replace the alert's expression with one that never fires; its tests must fail."""
    promtool()
    rules = tmp_path / "rules"
    shutil.copytree(RULES, rules)
    path, _ = alerts()[alert]
    doc = yaml.safe_load(path.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                rule["expr"] = "vector(0) > 1"  # never true
    (rules / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))
    # Only the test groups that check this alert run: promtool compares alerts by name, so the other
    # groups cannot fail for it (and the slow-burn groups evaluate every rule over 400 minutes).
    tests = []
    for test in sorted((rules / "tests").glob("*_test.yaml")):
        unit = yaml.safe_load(test.read_text())
        if f"../{path.name}" not in unit["rule_files"]:
            continue
        unit["tests"] = [g for g in unit["tests"] if any(c["alertname"] == alert for c in g.get("alert_rule_test", []))]
        if unit["tests"]:
            test.write_text(yaml.safe_dump(unit, sort_keys=False))
            tests.append(test.name)
    assert tests, f"no unit test of {path.name} checks {alert}"
    proc = run_promtool("test", "rules", *tests, cwd=rules / "tests")
    assert proc.returncode != 0, f"the tests of {alert} pass even though it can never fire"
    assert f"alertname: {alert}" in proc.stdout + proc.stderr


def test_every_dashboard_query_parses_with_promtool(tmp_path: Path):
    """Every panel and annotation query, variables filled with .* and intervals with 1m, as the
    expression of a recording rule that `promtool check rules` parses."""
    from dashboards.queries import annotation_queries, expand, panel_queries

    rules = []
    for path in sorted((ROOT / "dashboards").glob("*.json")):
        doc = json.loads(path.read_text())
        for i, q in enumerate([*panel_queries(doc), *annotation_queries(doc)]):
            rules.append({"record": f"check:{path.stem.replace('-', '_')}:q{i}", "expr": expand(q.expr)})
    assert len(rules) > 80
    file = tmp_path / "queries.yaml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "dashboard-queries", "rules": rules}]}))
    proc = run_promtool("check", "rules", str(file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules)} rules found" in proc.stdout
