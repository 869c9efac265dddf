"""The chart's Node Problem Detector plugin (nodeProblemDetector.enabled): `aaco health` as NPD's custom plugin.

Off by default: nothing of it renders. On: a ConfigMap whose monitor config is NPD's custom plugin
monitor format (the JSON fields of ``pkg/custompluginmonitor/types`` of kubernetes/node-problem-detector,
and the checks of its ``Validate``: plugin "custom", every permanent rule's condition among the
default conditions, no rule timeout above the global one, the rule's script where the ConfigMap is
mounted, executable); the script, run here with the real ``aaco``, turns `aaco health`'s verdict
into NPD's exit statuses and prints its one-line message; the thresholds file is the agent's
config.analyzers.health and loads with the agent's loader; the DaemonSet runs NPD's binary in the
agent's image under its own ServiceAccount, bound to system:node-problem-detector, and validates
strictly against Kubernetes 1.29 and 1.33.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from aaco.agent.config import load_config
from tests.support.helm_chart import (
    CHART_DIR,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    helm,
    kubernetes_validate,
    render,
    scenario_values,
)
from tests.support.nvidia_health_captures import H100, with_field

pytestmark = pytest.mark.integration

ON = {"nodeProblemDetector": {"enabled": True}}
NAME = f"{RELEASE}-npd"
PLUGIN_DIR = "/etc/aaco/npd"

# The JSON fields NPD reads (Go's encoding/json ignores any other, so a typo would pass silently).
MONITOR_FIELDS = {"plugin", "pluginConfig", "source", "conditions", "rules", "metricsReporting"}
PLUGIN_CONFIG_FIELDS = {
    "invoke_interval",
    "timeout",
    "max_output_length",
    "concurrency",
    "enable_message_change_based_condition_update",
    "skip_initial_status",
}
CONDITION_FIELDS = {"type", "reason", "message"}
RULE_FIELDS = {"type", "condition", "reason", "path", "args", "timeout", "invoke_interval"}


def go_duration_s(text: str) -> float:
    """A Go duration ("60s", "1m30s") in seconds."""
    units = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    parts = re.findall(r"([0-9.]+)(ns|us|ms|s|m|h)", text)
    assert parts and "".join(a + b for a, b in parts) == text, text
    return sum(float(n) * units[u] for n, u in parts)


def npd_objects(rendered) -> list[dict[str, Any]]:
    return [doc for _, doc in rendered.docs if doc["metadata"]["name"] == NAME]


def test_nothing_of_it_by_default():
    rendered = render({})
    assert npd_objects(rendered) == []
    assert [d["metadata"]["name"] for d in rendered.all("DaemonSet")] == [RELEASE]
    assert "system:node-problem-detector" not in "".join(rendered.texts.values())


def test_the_configmap_holds_npds_custom_plugin_monitor():
    rendered = render(ON)
    data = rendered.one("ConfigMap", NAME)["data"]
    assert set(data) == {"aaco-gpu-health.json", "aaco-gpu-health.sh", "health.yaml"}
    monitor = json.loads(data["aaco-gpu-health.json"])
    assert set(monitor) <= MONITOR_FIELDS
    assert set(monitor["pluginConfig"]) <= PLUGIN_CONFIG_FIELDS
    assert monitor["plugin"] == "custom"
    assert monitor["source"] == "aaco-gpu-health"
    config = monitor["pluginConfig"]
    assert config["invoke_interval"] == "60s" and config["timeout"] == "30s"
    assert config["max_output_length"] == 80 and config["concurrency"] == 1
    # The condition with its healthy reason and message, and the two rules.
    (condition,) = monitor["conditions"]
    assert set(condition) == CONDITION_FIELDS
    assert condition["type"] == "GPUUnhealthy" and condition["reason"] and condition["message"]
    rules = {r["type"]: r for r in monitor["rules"]}
    assert set(rules) == {"temporary", "permanent"} and len(monitor["rules"]) == 2
    for rule in monitor["rules"]:
        assert set(rule) <= RULE_FIELDS and rule["reason"]
        assert rule["path"] == f"{PLUGIN_DIR}/aaco-gpu-health.sh"
        if "timeout" in rule:  # NPD refuses a rule timeout above the global one
            assert go_duration_s(rule["timeout"]) <= go_duration_s(config["timeout"])
    assert rules["permanent"]["condition"] == condition["type"]  # NPD: a permanent rule needs its default condition
    assert rules["permanent"]["args"] == ["condition"] and rules["temporary"]["args"] == ["event"]
    assert rules["permanent"]["reason"] != condition["reason"]
    assert data["aaco-gpu-health.sh"].startswith("#!/bin/sh\n") and data["aaco-gpu-health.sh"].endswith('exit "$rc"\n')


def test_the_daemonset_runs_npd_in_the_agents_image():
    rendered = render(ON)
    ds = rendered.one("DaemonSet", NAME)
    pod = ds["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    (npd,) = pod["containers"]
    assert init["image"] == "registry.k8s.io/node-problem-detector/node-problem-detector:v0.8.19"
    assert init["command"] == ["cp", "/node-problem-detector", "/npd/node-problem-detector"]
    assert npd["image"] == rendered.container["image"]  # the agent's: `aaco` is there
    assert npd["command"] == ["/npd/node-problem-detector"]
    monitor_flag = f"--config.custom-plugin-monitor={PLUGIN_DIR}/aaco-gpu-health.json"
    assert monitor_flag in npd["args"] and "--port=0" in npd["args"] and "--prometheus-port=0" in npd["args"]
    env = {e["name"]: e for e in npd["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    # The ConfigMap where the rules look for the script, executable; the binary's volume shared.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in npd["volumeMounts"]}
    plugin = volumes[mounts[PLUGIN_DIR]["name"]]["configMap"]
    assert plugin["name"] == NAME and plugin["defaultMode"] & 0o111 == 0o111
    assert mounts["/npd"]["name"] == init["volumeMounts"][0]["name"] and "emptyDir" in volumes["npd-bin"]
    assert volumes[mounts["/host/sys"]["name"]]["hostPath"]["path"] == "/sys"
    for m in npd["volumeMounts"]:
        if "hostPath" in volumes[m["name"]]:
            assert m["readOnly"] is True
    # Least privilege: nothing added, nothing listening, no host namespace.
    for c in (init, npd):
        sc = c["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert "ports" not in npd
    assert pod["hostPID"] is False and pod["hostNetwork"] is False
    # Its pods are not the agent's: the agent's Services and DaemonSet do not select them.
    labels = ds["spec"]["template"]["metadata"]["labels"]
    agent_selector = rendered.daemonset["spec"]["selector"]["matchLabels"]
    assert not agent_selector.items() <= labels.items()
    for service in rendered.all("Service"):
        assert not service["spec"]["selector"].items() <= labels.items()
    assert ds["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # Scheduled where the agent is.
    assert pod["affinity"] == rendered.pod["affinity"] and pod["tolerations"] == rendered.pod["tolerations"]


def test_its_own_service_account_bound_to_the_npd_role():
    rendered = render(ON)
    pod = rendered.one("DaemonSet", NAME)["spec"]["template"]["spec"]
    account = rendered.one("ServiceAccount", NAME)
    assert pod["serviceAccountName"] == NAME and pod["automountServiceAccountToken"] is True
    assert account["automountServiceAccountToken"] is True
    binding = rendered.one("ClusterRoleBinding", NAME)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "system:node-problem-detector",
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]
    # The agent keeps no token and no role.
    assert rendered.pod["automountServiceAccountToken"] is False
    assert rendered.pod["serviceAccountName"] != NAME
    assert rendered.all("ClusterRole") == []
    # rbac.create false: bind it yourself, as the notes say.
    notes = rendered.texts["aaco/templates/NOTES.txt"]
    assert f"{NAMESPACE}/{NAME}" in notes and "GPUUnhealthy" in notes and "bind the ServiceAccount" not in notes
    unbound = render({**ON, "rbac": {"create": False}})
    assert unbound.all("ClusterRoleBinding") == []
    assert "system:node-problem-detector yourself" in unbound.texts["aaco/templates/NOTES.txt"]
    assert "GPUUnhealthy" not in render({}).texts["aaco/templates/NOTES.txt"]


def test_gpu_access_and_kernel_log_follow_the_values():
    values = {
        **scenario_values(CHART_DIR / "ci" / "nvidia-values.yaml"),
        "nodeProblemDetector": {"enabled": True, "kernelLog": "/var/log/kern.log"},
    }
    rendered = render(values)
    pod = rendered.one("DaemonSet", NAME)["spec"]["template"]["spec"]
    (npd,) = pod["containers"]
    assert pod["runtimeClassName"] == rendered.pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in npd["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in npd["volumeMounts"]}
    assert volumes[mounts["/host/kernel-log"]["name"]]["hostPath"] == {"path": "/var/log", "type": "Directory"}
    script = rendered.one("ConfigMap", NAME)["data"]["aaco-gpu-health.sh"]
    assert "'--kernel-log' '/host/kernel-log/kern.log'" in script
    assert "kernel-log" not in str(render(ON).one("DaemonSet", NAME))


def test_the_config_change_rolls_the_npd_pods():
    def checksum(values):
        ds = render(values).one("DaemonSet", NAME)
        return ds["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    base = checksum(ON)
    assert checksum({"nodeProblemDetector": {"enabled": True, "invokeInterval": "2m"}}) != base
    assert checksum({**ON, "podAnnotations": {"a": "b"}}) == base


def test_the_thresholds_are_the_agents(tmp_path: Path):
    health = {"max_retired_pages": 40, "pcie_replays_per_minute": 12.0, "xid_max_age_s": 3600.0}
    rendered = render({**ON, "config": {"analyzers": {"health": health}}})
    text = rendered.one("ConfigMap", NAME)["data"]["health.yaml"]
    assert yaml.safe_load(text) == {"analyzers": {"health": health}}
    (tmp_path / "health.yaml").write_text(text)
    loaded = load_config(tmp_path / "health.yaml", env={}).analyzers.health
    assert (loaded.max_retired_pages, loaded.pcie_replays_per_minute, loaded.xid_max_age_s) == (40, 12.0, 3600.0)
    default = render(ON).one("ConfigMap", NAME)["data"]["health.yaml"]
    assert yaml.safe_load(default) == {"analyzers": {"health": {}}}


def plugin(tmp_path: Path, aaco_bin: str, rule: str, *args: str) -> tuple[int, str]:
    """The rendered script run as NPD runs it, with the real `aaco` on PATH and the plugin dir here."""
    data = render(ON).one("ConfigMap", NAME)["data"]
    folder = tmp_path / "npd"
    folder.mkdir(exist_ok=True)
    for key, text in data.items():
        (folder / key).write_text(text.replace(PLUGIN_DIR, str(folder)))
    script = folder / "aaco-gpu-health.sh"
    script.chmod(0o555)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AACO_")}
    env["PATH"] = f"{Path(aaco_bin).parent}{os.pathsep}{env.get('PATH', '')}"
    proc = subprocess.run([str(script), rule, *args], capture_output=True, text=True, env=env, timeout=120, check=False)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, proc.stdout


def test_the_script_gives_npd_the_verdict(tmp_path: Path, aaco_bin: str):
    unhealthy = with_field(H100, tmp_path / "unhealthy.xml", "ecc_errors/volatile/dram_uncorrectable", "2")
    warning = with_field(H100, tmp_path / "warning.xml", "remapped_rows/remapped_row_pending", "Yes")
    # NPD: exit 0 OK, 1 NonOK (condition True, or an Event), anything else Unknown; the message is stdout.
    cases = [
        ("condition", H100, 0, "healthy: 1 GPU(s), no problem found"),
        ("event", H100, 0, "healthy: 1 GPU(s), no problem found"),
        ("condition", unhealthy, 1, "unhealthy: GPU 0 unhealthy (ecc_uncorrected)"),
        ("event", unhealthy, 1, "unhealthy: GPU 0 unhealthy (ecc_uncorrected)"),
        ("condition", warning, 0, "warning: GPU 0 warning (row_remap_pending)"),
        ("event", warning, 1, "warning: GPU 0 warning (row_remap_pending)"),
    ]
    for rule, capture, status, message in cases:
        rc, out = plugin(tmp_path, aaco_bin, rule, "-f", str(capture))
        assert (rc, out) == (status, message + "\n"), (rule, capture.name)
    # No GPU to read: Unknown for the condition (exit 3), no Event.
    rc, out = plugin(tmp_path, aaco_bin, "condition", "--backend", "sysfs")
    assert rc == 3 and out.startswith("unknown: ") and out.count("\n") == 1
    rc, out = plugin(tmp_path, aaco_bin, "event", "--backend", "sysfs")
    assert rc == 0 and out.startswith("unknown: ")


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_renders_lints_and_validates_strictly(kube_version: str):
    values = {**ON, "nodeProblemDetector": {"enabled": True, "kernelLog": "/var/log/syslog"}}
    report = helm().lint(CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == []
    kv = kubernetes_validate()
    objects = npd_objects(render(values))
    assert sorted(d["kind"] for d in objects) == ["ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]
    for doc in objects:
        try:
            kv.validate(doc, kube_version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid on {kube_version}: {exc.message}")


def test_names_stay_dns_labels():
    rendered = render(ON, release="r" * 60)
    npd = [d for _, d in rendered.docs if d["metadata"]["name"].endswith("-npd")]
    assert sorted(d["kind"] for d in npd) == ["ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]
    assert all(len(d["metadata"]["name"]) <= 63 for d in npd)
    (ds,) = [d for d in npd if d["kind"] == "DaemonSet"]
    assert all(len(v) <= 63 for v in ds["spec"]["template"]["metadata"]["labels"].values())


@pytest.mark.parametrize(
    "values",
    [
        {"nodeProblemDetector": {"enabled": True, "invokeInterval": "1 minute"}},
        {"nodeProblemDetector": {"enabled": True, "kernelLog": "kern.log"}},
        {"nodeProblemDetector": {"enabled": True, "enabeld": True}},
    ],
)
def test_the_schema_refuses_what_npd_could_not_use(values: dict[str, Any]):
    h = helm()
    with h.Chart.load(CHART_DIR) as chart, pytest.raises(h.HelmValuesError):
        chart.validate_schema(values)
