"""The Helm chart, rendered by the real Helm (helm-python-sdk) and checked by kubernetes-validate.

Lint clean; renders with its defaults and every ci/*-values.yaml scenario; every manifest validates
strictly against Kubernetes 1.29 and 1.33 (the Prometheus Operator CRDs aside); the security
properties of issue 9 hold; the ConfigMap holds the given config, and that config validates with the
agent's own loader and `aaco config check`. The pod's scheduling, probes and Services:
test_helm_pod.py; the guards of issue 14: test_helm_security.py; the real agent: test_helm_agent.py.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from aaco.agent.config import AgentConfig, check_files, load_config
from aaco.agent.sources import SOURCES
from tests.support.helm_chart import (
    ALL_SCENARIOS,
    CHART_DIR,
    KUBE_VERSIONS,
    NAMESPACE,
    RECEIVER_ON,
    RELEASE,
    SCENARIOS,
    agent_env,
    helm,
    kubernetes_validate,
    render,
    scenario_id,
    scenario_values,
    without_chart_owned,
)

pytestmark = pytest.mark.integration

ALLOWED_CAPABILITIES = {"BPF", "PERFMON", "SYS_RESOURCE", "SYS_PTRACE", "DAC_READ_SEARCH"}
CRD_GROUPS = ("monitoring.coreos.com/",)
# Host paths the agent may write to; every other hostPath is mounted read-only.
WRITABLE_HOST_MOUNTS = {"state", "trace-spool", "captures", "dev-kfd", "dev-dri"}


@pytest.fixture(params=ALL_SCENARIOS, ids=scenario_id)
def scenario(request: pytest.FixtureRequest) -> Path | None:
    return request.param


def capabilities(rendered) -> set[str]:
    return set(rendered.container["securityContext"]["capabilities"].get("add", []))


# -- Helm itself ---------------------------------------------------------------------------------


def test_the_scenarios_the_issue_asks_for_exist():
    names = {p.name for p in SCENARIOS}
    asked = {"nvidia-values.yaml", "amd-capture-values.yaml", "otlp-gateway-tls-values.yaml", "secure-values.yaml"}
    assert asked <= names
    amd = scenario_values(CHART_DIR / "ci" / "amd-capture-values.yaml")
    assert amd["capture"]["enabled"] is True
    tls = scenario_values(CHART_DIR / "ci" / "otlp-gateway-tls-values.yaml")
    assert tls["config"]["exporters"]["otlp"]["endpoint"].startswith("https://")
    assert tls["otlpTls"]["secretName"]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_lint_clean(scenario: Path | None, kube_version: str):
    report = helm().lint(
        CHART_DIR, scenario_values(scenario), strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}"
    )
    assert report["errors"] == []
    assert report["total_charts_linted"] == 1
    # Severity: 1 info, 2 warning, 3 error. The one info left: Chart.yaml has no icon (the project
    # publishes none; an icon URL that does not exist would be worse).
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert [m["error"] for m in report["messages"]] in ([], ["icon is recommended"])


def test_schema_rejects_typos_and_unknown_config_sections():
    h = helm()
    with h.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(chart.values)
        for bad in ({"ebpf": {"enbled": True}}, {"config": {"exporter": {}}}, {"privilegd": True}):
            with pytest.raises(h.HelmValuesError):
                chart.validate_schema(bad)
        schema = chart.schema
    # The schema's config sections are exactly the agent's (a new top-level section needs a line here).
    assert set(schema["properties"]["config"]["properties"]) == set(AgentConfig.model_fields)


def test_every_values_key_is_commented():
    """values.yaml: every mapping key has a comment on the line above it or on its own line."""
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()
    missing = []
    in_list_item = None
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        if stripped.startswith("- "):
            in_list_item = indent
            continue
        if in_list_item is not None and indent > in_list_item:
            continue  # keys inside list items (tolerations, terms) are documented by the list's comment
        in_list_item = None
        if not re.match(r"^[A-Za-z_][\w.-]*:", stripped):
            continue
        above = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        if not above.startswith("#") and "#" not in stripped:
            missing.append(f"line {i + 1}: {stripped}")
    assert missing == []


# -- Rendering and validation --------------------------------------------------------------------


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_renders_and_validates_strictly(scenario: Path | None, kube_version: str):
    kv = kubernetes_validate()
    rendered = render(scenario_values(scenario))
    assert {"DaemonSet", "ConfigMap", "Service", "ServiceAccount"} <= set(rendered.kinds())
    crds = []
    for template, doc in rendered.docs:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            with pytest.raises(kv.SchemaNotFoundError):  # really a CRD, not a core kind with a typo
                kv.validate(doc, kube_version, strict=True)
            crds.append(doc)
            continue
        try:
            kv.validate(doc, kube_version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{template} {doc['kind']}/{doc['metadata']['name']} invalid on {kube_version}: {exc.message}")
    for doc in crds:
        assert doc["kind"] in ("ServiceMonitor", "PrometheusRule")
        assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        assert doc["metadata"]["namespace"] == NAMESPACE
        assert len(doc["metadata"]["name"]) <= 63


def test_names_and_labels():
    long_release = "r" * 50
    rendered = render({}, release=long_release)
    for _, doc in rendered.docs:
        assert len(doc["metadata"]["name"]) <= 63, doc["metadata"]["name"]
    assert rendered.daemonset["metadata"]["name"] == f"{long_release}-aaco"
    rendered = render({"fullnameOverride": "x" * 70})
    assert rendered.daemonset["metadata"]["name"] == "x" * 63
    rendered = render({})
    ds = rendered.daemonset
    pod_labels = ds["spec"]["template"]["metadata"]["labels"]
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "aaco", "app.kubernetes.io/instance": RELEASE}
    assert selector.items() <= pod_labels.items()
    assert "helm.sh/chart" not in pod_labels and "app.kubernetes.io/version" not in pod_labels
    assert ds["metadata"]["labels"]["helm.sh/chart"] == "aaco-0.1.0"
    for _, doc in rendered.docs:
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


# -- The config ----------------------------------------------------------------------------------


def test_configmap_holds_the_given_config(scenario: Path | None):
    values = scenario_values(scenario)
    rendered = render(values)
    held = yaml.safe_load(rendered.config_text())
    # The config as given, but for the file paths the chart sets when it mounts Secrets (test_helm_security.py).
    assert without_chart_owned(held) == without_chart_owned(rendered.values["config"])
    for key, value in (values.get("config") or {}).items():
        if not isinstance(value, dict):
            assert held[key] == value


def test_configmap_holds_a_custom_config_verbatim():
    config = {
        "node": "gpu-node-7",
        "sources": [{"type": "replay", "name": "spool", "paths": ["/var/spool/aaco/in"], "model": "bert"}],
        "exporters": {"otlp": {"endpoint": "http://gw:4317", "headers": {"x-tenant": "a b"}}},
        "pipeline": {"queue_max_events": 123456, "correlator_hold_s": 2.5},
        "log_level": "debug",
    }
    rendered = render({"config": config})
    held = yaml.safe_load(rendered.config_text())
    for key, value in config.items():
        if key == "exporters":
            assert held["exporters"]["otlp"] == {**value["otlp"], "memory_budget_mib": 256}
        else:
            assert held[key] == value
    # Defaults the user did not touch are kept (Helm merges maps), and the config still validates.
    assert held["exporters"]["prometheus"]["address"] == "0.0.0.0"
    assert load_config(_write(rendered.config_text()), env={}, check_paths=False).node == "gpu-node-7"


def _write(text: str, tmp: Path | None = None) -> Path:
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="aaco-helm-")) if tmp is None else tmp
    path = folder / "config.yaml"
    path.write_text(text)
    return path


def test_rendered_config_validates_with_the_agent(scenario: Path | None, tmp_path: Path, aaco_bin: str):
    rendered = render(scenario_values(scenario))
    path = _write(rendered.config_text(), tmp_path)
    config = load_config(path, env={}, check_paths=False)  # the shape: every key, type and source
    for src in config.sources:
        assert src.type in SOURCES
    # Files the config names exist only inside the container (host mounts, the spool): those are
    # the only path problems allowed; with none, the real `aaco config check` must pass as is.
    container_roots = [
        m["mountPath"] for m in rendered.container["volumeMounts"] if m["mountPath"] not in ("/tmp", "/etc/aaco/config")
    ]
    problems = check_files(config)
    for problem in problems:
        assert any(root in problem for root in container_roots), problem
    if not problems:
        env = {**agent_env(), "NODE_NAME": "ci-node"}
        proc = subprocess.run(
            [aaco_bin, "config", "check", str(path)], capture_output=True, text=True, env=env, check=False
        )
        assert proc.returncode == 0, proc.stderr
        assert "ok (node ci-node" in proc.stdout


def test_tls_files_lie_in_the_mounted_secret():
    values = scenario_values(CHART_DIR / "ci" / "otlp-gateway-tls-values.yaml")
    rendered = render(values)
    mounts = rendered.mounts()
    tls_root = values["otlpTls"]["mountPath"]
    assert mounts[tls_root]["volume"]["secret"]["secretName"] == values["otlpTls"]["secretName"]
    assert mounts[tls_root]["mount"]["readOnly"] is True
    tls = yaml.safe_load(rendered.config_text())["exporters"]["otlp"]["tls"]
    for key in ("ca_file", "cert_file", "key_file"):
        assert tls[key].startswith(tls_root + "/"), key
    env = {e["name"]: e for e in rendered.container["env"]}
    assert env["OTEL_EXPORTER_OTLP_HEADERS"]["valueFrom"]["secretKeyRef"]["name"] == "aaco-gateway-token"


def test_checksum_annotation_follows_the_config():
    rendered = render({})
    annotation = rendered.daemonset["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
    assert annotation == hashlib.sha256(rendered.text("configmap.yaml").encode()).hexdigest()
    changed = render({"config": {"log_level": "debug"}})
    assert changed.daemonset["spec"]["template"]["metadata"]["annotations"]["checksum/config"] != annotation
    other = render({"podAnnotations": {"a": "b"}})
    assert other.daemonset["spec"]["template"]["metadata"]["annotations"]["checksum/config"] == annotation


# -- Security ------------------------------------------------------------------------------------


def test_least_privilege_by_default():
    rendered = render({})
    pod, c = rendered.pod, rendered.container
    sc = c["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert capabilities(rendered) == {"BPF", "PERFMON", "SYS_RESOURCE", "SYS_PTRACE"}
    assert pod["hostPID"] is True
    assert pod["hostNetwork"] is False and pod["hostIPC"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["automountServiceAccountToken"] is False
    assert rendered.one("ServiceAccount")["automountServiceAccountToken"] is False
    assert rendered.all("ClusterRole") == [] and rendered.all("Role") == []
    assert "runtimeClassName" not in pod


def test_every_capability_is_explained_in_the_manifest(scenario: Path | None):
    rendered = render(scenario_values(scenario))
    caps = capabilities(rendered)
    assert caps <= ALLOWED_CAPABILITIES
    lines = rendered.text("daemonset.yaml").splitlines()
    for cap in caps:
        (i,) = [n for n, line in enumerate(lines) if line.strip() == f"- {cap}"]
        comment = lines[i - 1].strip()
        assert comment.startswith(f"# {cap}:") and len(comment) > len(cap) + 20, comment


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, {"BPF", "PERFMON", "SYS_RESOURCE", "SYS_PTRACE"}),
        ({"ebpf": {"enabled": False}}, {"SYS_PTRACE"}),
        ({"ebpf": {"enabled": False}, "processDiscovery": {"enabled": False}}, set()),
        (
            {"ebpf": {"enabled": False}, "processDiscovery": {"enabled": False}, "capture": {"enabled": True}},
            {"SYS_PTRACE"},
        ),
        ({"traceSpool": {"readAnyFile": True}}, {"BPF", "PERFMON", "SYS_RESOURCE", "SYS_PTRACE", "DAC_READ_SEARCH"}),
        (
            {"traceSpool": {"enabled": False, "readAnyFile": True}, "config": {"sources": [{"type": "smi"}]}},
            {"BPF", "PERFMON", "SYS_RESOURCE", "SYS_PTRACE"},
        ),
    ],
)
def test_capabilities_follow_the_features(values: dict[str, Any], expected: set[str]):
    rendered = render(values)
    assert capabilities(rendered) == expected
    if not expected:
        assert "add" not in rendered.container["securityContext"]["capabilities"]


def test_minimal_scenario_adds_no_capability_and_no_host_pid():
    rendered = render(scenario_values(CHART_DIR / "ci" / "minimal-values.yaml"))
    assert capabilities(rendered) == set()
    assert rendered.pod["hostPID"] is False
    assert "/sys/kernel/tracing" not in rendered.mounts()


def test_host_mounts_are_read_only_except_state_and_spool(scenario: Path | None):
    rendered = render(scenario_values(scenario))
    for path, m in rendered.mounts().items():
        if "hostPath" not in m["volume"]:
            continue
        if m["mount"]["name"] in WRITABLE_HOST_MOUNTS:
            continue
        assert m["mount"].get("readOnly") is True, f"{path} is a host mount and not read-only"


def test_default_host_mounts():
    mounts = render({}).mounts()
    expected = {
        "/host/sys": "/sys",
        "/host/proc": "/proc",
        "/sys/kernel/tracing": "/sys/kernel/tracing",
        "/lib/modules": "/lib/modules",
        "/usr/src": "/usr/src",
        "/var/lib/kubelet/pod-resources": "/var/lib/kubelet/pod-resources",
        "/host/var/log/containers": "/var/log/containers",
        "/host/var/log/pods": "/var/log/pods",
        "/var/spool/aaco": "/var/spool/aaco",
        "/var/lib/aaco": "/var/lib/aaco",
    }
    for mount_path, host_path in expected.items():
        assert mounts[mount_path]["volume"]["hostPath"]["path"] == host_path, mount_path
    assert mounts["/var/spool/aaco"]["mount"].get("readOnly") is not True
    assert mounts["/var/lib/aaco"]["mount"].get("readOnly") is not True
    assert mounts["/tmp"]["volume"]["emptyDir"]["sizeLimit"]
    assert mounts["/etc/aaco/config"]["mount"]["readOnly"] is True
    assert "/dev/kfd" not in mounts and "/dev/dri" not in mounts


def test_default_sources_read_the_chart_mounts():
    rendered = render({})
    config = yaml.safe_load(rendered.config_text())
    mounts = rendered.mounts()
    types = [s["type"] for s in config["sources"]]
    assert types == ["smi", "gpu_processes", "sched", "trace_dir"]
    (spool,) = [s for s in config["sources"] if s["type"] == "trace_dir"]
    assert spool["path"] == rendered.values["traceSpool"]["mountPath"]
    assert mounts[spool["path"]]["volume"]["hostPath"]["path"] == rendered.values["traceSpool"]["hostPath"]
    assert mounts[spool["path"]]["mount"].get("readOnly") is not True
    (smi,) = [s for s in config["sources"] if s["type"] == "smi"]
    assert smi["sysfs_root"] == rendered.values["host"]["sys"]["mountPath"]
    assert mounts[smi["sysfs_root"]]["volume"]["hostPath"]["path"] == "/sys"
    socket_dir = str(Path(smi["kubelet_socket"]).parent)
    assert mounts[socket_dir]["volume"]["hostPath"]["path"] == rendered.values["host"]["podResources"]["hostPath"]
    (procs,) = [s for s in config["sources"] if s["type"] == "gpu_processes"]
    for sub in ("containers", "pods"):
        where = f"{procs['kubelet_logs']}/{sub}"
        assert (
            mounts[where]["volume"]["hostPath"]["path"] == f"{rendered.values['host']['kubeletLogs']['hostPath']}/{sub}"
        )
    assert procs["kubelet_socket"] == smi["kubelet_socket"]
    lake = config["exporters"]["lake"]["path"]
    assert lake.startswith(rendered.values["state"]["mountPath"] + "/")


def test_amd_devices_with_the_privileged_opt_in():
    values = scenario_values(CHART_DIR / "ci" / "amd-privileged-values.yaml")
    rendered = render(values)
    sc = rendered.container["securityContext"]
    assert sc["privileged"] is True
    assert "allowPrivilegeEscalation" not in sc  # Kubernetes rejects privileged with it false
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"]["drop"] == ["ALL"]
    mounts = rendered.mounts()
    assert mounts["/dev/kfd"]["volume"]["hostPath"] == {"path": "/dev/kfd", "type": "CharDevice"}
    assert mounts["/dev/dri"]["volume"]["hostPath"] == {"path": "/dev/dri", "type": "Directory"}
    text = rendered.text("daemonset.yaml")
    assert re.search(r"#[^\n]*Opt-in[^\n]*\n(\s*#[^\n]*\n)*\s*privileged: true", text)


def test_nvidia_scenario_uses_the_container_toolkit():
    rendered = render(scenario_values(CHART_DIR / "ci" / "nvidia-values.yaml"))
    assert rendered.pod["runtimeClassName"] == "nvidia"
    env = {e["name"]: e.get("value") for e in rendered.container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert rendered.container["securityContext"]["privileged"] is False
    assert "resources" in rendered.container and "nvidia.com/gpu" not in str(rendered.container["resources"])


def test_downward_api_environment():
    env = {e["name"]: e for e in render({}).container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"exporters": {"prometheus": {"address": "127.0.0.1"}}}}, "config.exporters.prometheus.address"),
        ({"config": {"exporters": {"prometheus": {"enabled": False}}}}, "probes"),
        ({"config": {"exporters": {"lake": {"path": "aaco-data"}}}}, "state.mountPath"),
        (
            {"config": {**RECEIVER_ON, "receivers": {"otlp": {"enabled": True, "address": "localhost"}}}},
            "config.receivers.otlp.address",
        ),
        ({"gpu": {"amd": {"devices": True}}}, "privileged: true"),
        (
            {"ebpf": {"enabled": False}, "config": {"sources": [{"type": "sched", "backend": "ebpf"}]}},
            "sched source with backend ebpf",
        ),
        ({"traceSpool": {"enabled": False}}, "the trace_dir source reads /var/spool/aaco, which no volume provides"),
        (
            {"config": {"sources": [{"type": "capture", "command": "rocprofv3 --attach {pid} -d {out}"}]}},
            "capture.enabled is false",
        ),
        (
            {
                "capture": {"enabled": True},
                "config": {"sources": [{"type": "capture", "command": "x {out}", "out_dir": "/captures"}]},
            },
            "the capture source writes to /captures",
        ),
        (
            {"config": {"sources": [{"type": "trace_dir", "path": "/data/traces"}]}},
            "the trace_dir source reads /data/traces",
        ),
        ({"runAsUser": 10001}, "Kubernetes grants added capabilities to root only"),
    ],
)
def test_values_that_cannot_work_are_refused_with_the_reason(values: dict[str, Any], message: str):
    h = helm()
    with pytest.raises(h.HelmError) as err:
        render(values)
    assert message in str(err.value)


def test_receiver_upstream_may_come_from_the_environment():
    env = [{"name": "OTEL_EXPORTER_OTLP_ENDPOINT", "value": "http://gw:4317"}]
    rendered = render({"config": {"receivers": {"otlp": {"enabled": True}}}, "extraEnv": env})
    assert rendered.one("Service", f"{RELEASE}-otlp")


def test_capture_windows_share_their_output_directory_with_the_workloads():
    values = scenario_values(CHART_DIR / "ci" / "amd-capture-values.yaml")
    rendered = render(values)
    config = yaml.safe_load(rendered.config_text())
    (capture,) = [s for s in config["sources"] if s["type"] == "capture"]
    assert "{pid}" in capture["command"] and "{out}" in capture["command"]
    mounts = rendered.mounts()
    shared = mounts[values["capture"]["mountPath"]]
    assert shared["volume"]["hostPath"] == {"path": values["capture"]["hostPath"], "type": "DirectoryOrCreate"}
    assert shared["mount"].get("readOnly") is not True
    assert capture["out_dir"].startswith(values["capture"]["mountPath"])
    assert "SYS_PTRACE" in capabilities(rendered)
    assert mounts["/opt/rocm"]["mount"]["readOnly"] is True
    assert "/var/spool/aaco-captures" not in render({}).mounts()


def test_trace_dir_may_read_an_extra_volume():
    values = {
        "config": {"sources": [{"type": "trace_dir", "path": "/data/traces"}]},
        "extraVolumes": [{"name": "traces", "hostPath": {"path": "/data/traces", "type": "Directory"}}],
        "extraVolumeMounts": [{"name": "traces", "mountPath": "/data/traces"}],
    }
    assert "/data/traces" in render(values).mounts()


def test_non_root_without_capabilities_is_allowed():
    values = scenario_values(CHART_DIR / "ci" / "minimal-values.yaml")
    rendered = render({**values, "runAsUser": 10001, "runAsGroup": 10001})
    sc = rendered.container["securityContext"]
    assert sc["runAsUser"] == 10001 and sc["runAsNonRoot"] is True
