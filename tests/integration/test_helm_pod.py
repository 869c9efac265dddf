"""The chart's pod and services: scheduling on GPU nodes, probes and resources, ports, Services, the ServiceMonitor.

Rendered by the real Helm (helm-python-sdk); split from test_helm_chart.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.support.helm_chart import (
    ALL_SCENARIOS,
    CHART_DIR,
    NAMESPACE,
    RECEIVER_ON,
    RELEASE,
    render,
    scenario_id,
    scenario_values,
)

pytestmark = pytest.mark.integration


def test_scheduling_on_gpu_nodes():
    rendered = render({})
    pod, ds = rendered.pod, rendered.daemonset
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert {"nvidia.com/gpu.present", "feature.node.kubernetes.io/amd-gpu"} <= keys
    assert {"feature.node.kubernetes.io/pci-10de.present", "feature.node.kubernetes.io/pci-1002.present"} <= keys
    tolerated = {(t["key"], t["effect"]) for t in pod["tolerations"]}
    assert {("nvidia.com/gpu", "NoSchedule"), ("amd.com/gpu", "NoSchedule")} <= tolerated
    assert pod["priorityClassName"] == "system-node-critical"
    assert ds["spec"]["updateStrategy"]["type"] == "RollingUpdate"
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == "10%"


def test_scheduling_is_overridable():
    custom = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["gpu"]}]}
    ]}}}  # fmt: skip
    rendered = render({"affinity": custom, "nodeSelector": {"gpu": "mi300"}, "tolerations": []})
    assert rendered.pod["affinity"] == custom
    assert rendered.pod["nodeSelector"] == {"gpu": "mi300"}
    assert "tolerations" not in rendered.pod
    assert "affinity" not in render({"gpuNodeAffinity": {"enabled": False}}).pod
    nvidia = render(scenario_values(CHART_DIR / "ci" / "nvidia-values.yaml"))
    assert nvidia.pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert "affinity" not in nvidia.pod


@pytest.mark.parametrize("scenario", ALL_SCENARIOS, ids=scenario_id)
def test_probes_and_resources(scenario: Path | None):
    rendered = render(scenario_values(scenario))
    c = rendered.container
    port = yaml.safe_load(rendered.config_text())["exporters"]["prometheus"]["port"]
    (metrics,) = [p for p in c["ports"] if p["name"] == "metrics"]
    assert metrics["containerPort"] == port
    scheme = "HTTPS" if rendered.values["metrics"]["tls"]["enabled"] else "HTTP"
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": scheme}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": scheme}
    assert c["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": scheme}
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(c["resources"][kind]), kind
    assert c["args"] == ["agent", "--config", "/etc/aaco/config/config.yaml"]


def test_ports_follow_the_config():
    config = {
        "exporters": {"prometheus": {"port": 9500}, "otlp": {"endpoint": "http://gw:4317"}},
        "receivers": {"otlp": {"enabled": True, "grpc_port": 14317}},
    }
    rendered = render({"config": config, "receiver": {"hostPort": {"enabled": True}}})
    ports = {p["name"]: p for p in rendered.container["ports"]}
    assert ports["metrics"]["containerPort"] == 9500
    assert ports["otlp-grpc"]["containerPort"] == ports["otlp-grpc"]["hostPort"] == 14317
    assert ports["otlp-http"]["hostPort"] == 4318
    metrics = rendered.one("Service", f"{RELEASE}-metrics")
    assert metrics["spec"]["ports"][0]["port"] == 9500
    assert metrics["spec"]["clusterIP"] == "None"


def test_otlp_receiver_service_is_node_local():
    rendered = render({"config": RECEIVER_ON})
    otlp = rendered.one("Service", f"{RELEASE}-otlp")
    assert otlp["spec"]["internalTrafficPolicy"] == "Local"
    assert {(p["name"], p["port"]) for p in otlp["spec"]["ports"]} == {("otlp-grpc", 4317), ("otlp-http", 4318)}
    assert all("hostPort" not in p for p in rendered.container["ports"])
    off = render({})  # the default: no upstream, so no receiver
    assert [s["metadata"]["name"] for s in off.all("Service")] == [f"{RELEASE}-metrics"]
    assert {p["name"] for p in off.container["ports"]} == {"metrics"}


def test_service_monitor_selects_the_metrics_service():
    rendered = render({"config": RECEIVER_ON, "serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}})
    sm = rendered.one("ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kps"
    selector = sm["spec"]["selector"]["matchLabels"]
    metrics = rendered.one("Service", f"{RELEASE}-metrics")
    otlp = rendered.one("Service", f"{RELEASE}-otlp")
    assert selector.items() <= metrics["metadata"]["labels"].items()
    assert not selector.items() <= otlp["metadata"]["labels"].items()
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in metrics["spec"]["ports"]}
    assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    assert render({}).all("ServiceMonitor") == []


def test_rbac_only_when_asked():
    rules = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
    rendered = render({"rbac": {"extraRules": rules}})
    assert rendered.one("ClusterRole")["rules"] == rules
    binding = rendered.one("ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
    assert rendered.pod["automountServiceAccountToken"] is True


def test_notes_render():
    rendered = render({"config": RECEIVER_ON, "receiver": {"hostPort": {"enabled": True}}})
    notes = rendered.texts["aaco/templates/NOTES.txt"]
    assert f"{RELEASE}-otlp.{NAMESPACE}.svc:4317" in notes
    assert "HOST_IP" in notes
    assert "docs/deploy.md" in notes
