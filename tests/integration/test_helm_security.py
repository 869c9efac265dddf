"""The chart's guards (issue 14): the admin token, /metrics TLS and basic auth, receiver TLS, the memory limit.

Rendered by the real Helm (helm-python-sdk). ci/secure-values.yaml turns every guard on; it is one of the
scenarios test_helm_chart.py lints, validates strictly for Kubernetes 1.29 and 1.33 and checks with the
agent's config loader, and test_helm_agent.py runs the real agent with it. Here: each guard renders as
documented, the variants validate strictly too, the Secrets are mounted read-only and 0400 into the agent
container only, no guard adds a privilege, values that cannot work are refused, and the memory limit
follows the byte budget.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from aaco.agent.admin import AdminConfig
from aaco.exporters.otlp_settings import OtlpConfig
from tests.support.helm_chart import (
    CHART_DIR,
    KUBE_VERSIONS,
    RECEIVER_ON,
    RELEASE,
    SCENARIOS,
    SECURE,
    Rendered,
    helm,
    helm_merge,
    kubernetes_validate,
    render,
    scenario_values,
    secret_data,
    secret_mounts,
)

pytestmark = pytest.mark.integration

BCRYPT = "$2y$10$" + "a" * 53
# Fields of a monitoring.coreos.com/v1 ServiceMonitor endpoint the chart may set, and of its TLS and secret refs.
ENDPOINT_FIELDS = {
    "port", "path", "scheme", "tlsConfig", "basicAuth", "interval", "scrapeTimeout", "honorLabels",
    "relabelings", "metricRelabelings",
}  # fmt: skip
TLS_CONFIG_FIELDS = {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify"}
SECRET_REF_FIELDS = {"name", "key"}


def secure() -> dict[str, Any]:
    """The values of ci/secure-values.yaml (a fresh copy)."""
    return copy.deepcopy(scenario_values(SECURE))


def without_guards(values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with every guard of issue 14 off (the same features otherwise)."""
    out = copy.deepcopy(values)
    for key in ("metrics", "admin"):
        out.pop(key, None)
    out.get("receiver", {}).pop("tls", None)
    out.get("serviceMonitor", {}).pop("basicAuthSecret", None)
    return out


def config_of(rendered: Rendered) -> dict[str, Any]:
    """The agent config the ConfigMap holds."""
    return yaml.safe_load(rendered.config_text())


# -- The scenario ---------------------------------------------------------------------------------------------------


def test_the_secure_scenario_turns_every_guard_on():
    assert SECURE in SCENARIOS, "test_helm_chart.py lints and validates every ci/ scenario, this one included"
    values = secure()
    assert values["capture"]["enabled"] is True  # the admin action, hence the token
    assert values["metrics"]["tls"]["enabled"] is True and values["metrics"]["tls"]["existingSecret"]
    assert values["metrics"]["basicAuth"]["username"]
    assert values["receiver"]["tls"]["existingSecret"] and values["receiver"]["tls"]["verifyClients"] is True
    assert values["serviceMonitor"]["enabled"] is True and values["serviceMonitor"]["basicAuthSecret"]["name"]
    rendered = render(values)
    config = config_of(rendered)
    assert config["admin"]["token_file"] == "/etc/aaco/admin/token"
    assert config["exporters"]["prometheus"]["web_config_file"] == "/etc/aaco/web/web-config.yml"
    assert config["receivers"]["otlp"]["tls"] == {
        "cert_file": "/etc/aaco/receiver-tls/tls.crt",
        "key_file": "/etc/aaco/receiver-tls/tls.key",
        "client_ca_file": "/etc/aaco/receiver-tls/ca.crt",
    }
    assert config["exporters"]["otlp"]["memory_budget_mib"] == 384
    assert rendered.container["resources"]["limits"]["memory"] == "2304Mi"  # 1536 + 2 x 384
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert rendered.container[probe]["httpGet"]["scheme"] == "HTTPS", probe
    assert rendered.one("Service", f"{RELEASE}-metrics")["spec"]["ports"][0]["appProtocol"] == "https"
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "https" and "basicAuth" in endpoint and "tlsConfig" in endpoint


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize(
    "variant",
    [
        {"admin": {"existingSecret": "my-admin", "existingSecretKey": "t"}},
        {"metrics": {"tls": {"enabled": False}}},
        {"metrics": {"basicAuth": {"username": ""}}, "serviceMonitor": {"basicAuthSecret": {"name": ""}}},
        {"metrics": {"basicAuth": {"username": ""}, "webConfig": {"existingSecret": "my-web-config"}}},
        {"receiver": {"tls": {"verifyClients": False}}},
        {"runAsUser": 10001, "runAsGroup": 10001, "ebpf": {"enabled": False}, "processDiscovery": {"enabled": False}},
    ],
    ids=["admin-existing", "basic-auth-only", "tls-only", "own-web-config", "receiver-tls-only", "non-root"],
)
def test_variants_validate_strictly(variant: dict[str, Any], kube_version: str):
    values = secure()
    if variant.get("runAsUser"):  # capture windows need SYS_PTRACE, which a non-root user cannot be given
        values.update(
            capture={"enabled": False}, config={**values["config"], "sources": values["config"]["sources"][:3]}
        )
    rendered = render(helm_merge(values, variant))
    kv = kubernetes_validate()
    for template, doc in rendered.docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked field by field below
        try:
            kv.validate(doc, kube_version, strict=True)
        except kv.ValidationError as exc:
            pytest.fail(f"{template} {doc['kind']}/{doc['metadata']['name']} invalid on {kube_version}: {exc.message}")


# -- The admin token ------------------------------------------------------------------------------------------------


def test_the_admin_token_is_generated_into_a_secret_and_mounted_read_only():
    rendered = render(secure())
    name = f"{RELEASE}-admin"
    token = secret_data(rendered, name)["token"].decode()
    assert re.fullmatch(r"[A-Za-z0-9]{48}", token), "randAlphaNum 48"
    mount = secret_mounts(rendered)["/etc/aaco/admin"]
    assert mount["mount"]["readOnly"] is True
    assert mount["volume"]["secret"] == {
        "secretName": name,
        "defaultMode": 0o400,
        "items": [{"key": "token", "path": "token"}],
    }
    # `helm template` cannot look the Secret of an earlier install up: each render generates a new token
    # (documented in values.yaml; an install or upgrade keeps the one in the cluster).
    assert secret_data(render(secure()), name)["token"].decode() != token


def test_an_existing_admin_secret_is_mounted_instead():
    rendered = render(helm_merge(secure(), {"admin": {"existingSecret": "vault-admin", "existingSecretKey": "t"}}))
    assert f"{RELEASE}-admin" not in [s["metadata"]["name"] for s in rendered.all("Secret")]
    volume = secret_mounts(rendered)["/etc/aaco/admin"]["volume"]["secret"]
    assert volume["secretName"] == "vault-admin"
    assert volume["items"] == [{"key": "t", "path": "token"}]
    assert config_of(rendered)["admin"]["token_file"] == "/etc/aaco/admin/token"


def test_no_token_without_an_admin_action():
    """Capture windows are the only admin action: without them no token is made or mounted."""
    rendered = render({})
    assert rendered.all("Secret") == []
    assert secret_mounts(rendered) == {}
    assert "admin" not in config_of(rendered)
    assert AdminConfig().token_file == Path("/var/lib/aaco/admin-token")  # the agent's own default stays


# -- /metrics: the web-config file ----------------------------------------------------------------------------------


def test_the_web_config_file_is_rendered_into_a_secret():
    values = secure()
    rendered = render(values)
    doc = yaml.safe_load(secret_data(rendered, f"{RELEASE}-web-config")["web-config.yml"])
    assert doc == {
        "tls_server_config": {
            "cert_file": "/etc/aaco/metrics-tls/tls.crt",
            "key_file": "/etc/aaco/metrics-tls/tls.key",
            "client_auth_type": "VerifyClientCertIfGiven",
            "client_ca_file": "/etc/aaco/metrics-tls/ca.crt",
        },
        "basic_auth_users": {"prometheus": values["metrics"]["basicAuth"]["passwordHash"]},
    }
    mounts = secret_mounts(rendered)
    assert mounts["/etc/aaco/web"]["volume"]["secret"]["items"] == [{"key": "web-config.yml", "path": "web-config.yml"}]
    assert mounts["/etc/aaco/metrics-tls"]["volume"]["secret"] == {
        "secretName": "aaco-metrics-tls",
        "defaultMode": 0o400,
    }
    # The agent reloads the file when the Secret changes: no checksum rolls the pods for it.
    assert set(rendered.daemonset["spec"]["template"]["metadata"]["annotations"]) == {"checksum/config"}


def test_basic_auth_alone_keeps_http():
    rendered = render(helm_merge(secure(), {"metrics": {"tls": {"enabled": False}}}))
    doc = yaml.safe_load(secret_data(rendered, f"{RELEASE}-web-config")["web-config.yml"])
    assert list(doc) == ["basic_auth_users"]
    assert rendered.container["livenessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert "/etc/aaco/metrics-tls" not in rendered.mounts()
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint and "basicAuth" in endpoint


def test_an_own_web_config_secret_replaces_the_chart_file():
    values = helm_merge(secure(), {"metrics": {"basicAuth": {"username": ""}, "webConfig": {"existingSecret": "own"}}})
    rendered = render(values)
    assert f"{RELEASE}-web-config" not in [s["metadata"]["name"] for s in rendered.all("Secret")]
    assert secret_mounts(rendered)["/etc/aaco/web"]["volume"]["secret"]["secretName"] == "own"
    assert config_of(rendered)["exporters"]["prometheus"]["web_config_file"] == "/etc/aaco/web/web-config.yml"


def test_no_web_config_by_default():
    rendered = render({})
    assert "web_config_file" not in config_of(rendered)["exporters"]["prometheus"]
    assert rendered.container["readinessProbe"]["httpGet"]["scheme"] == "HTTP"


def test_the_service_monitor_scrapes_with_tls_and_basic_auth():
    rendered = render(secure())
    (endpoint,) = rendered.one("ServiceMonitor")["spec"]["endpoints"]
    assert set(endpoint) <= ENDPOINT_FIELDS
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "aaco-metrics-tls", "key": "ca.crt"}},
        "serverName": f"{RELEASE}-metrics.{rendered.daemonset['metadata']['namespace']}.svc",
    }
    assert set(endpoint["tlsConfig"]) <= TLS_CONFIG_FIELDS
    assert endpoint["basicAuth"] == {
        "username": {"name": "aaco-metrics-scrape", "key": "username"},
        "password": {"name": "aaco-metrics-scrape", "key": "password"},
    }
    for ref in endpoint["basicAuth"].values():
        assert set(ref) == SECRET_REF_FIELDS
    own = {"ca": {"configMap": {"name": "cluster-ca", "key": "ca.crt"}}, "serverName": "agents.example"}
    custom = render(helm_merge(secure(), {"serviceMonitor": {"tlsConfig": own}}))
    assert custom.one("ServiceMonitor")["spec"]["endpoints"][0]["tlsConfig"] == own


# -- The receiver ---------------------------------------------------------------------------------------------------


def test_receiver_tls_with_and_without_client_certificates():
    values = {"config": RECEIVER_ON, "receiver": {"tls": {"existingSecret": "rx-tls"}}}
    rendered = render(values)
    tls = config_of(rendered)["receivers"]["otlp"]["tls"]
    assert tls["client_ca_file"] is None
    assert tls["cert_file"] == "/etc/aaco/receiver-tls/tls.crt"
    mount = secret_mounts(rendered)["/etc/aaco/receiver-tls"]
    assert mount["mount"]["readOnly"] is True
    assert mount["volume"]["secret"] == {"secretName": "rx-tls", "defaultMode": 0o400}
    assert "https://" in rendered.texts["aaco/templates/NOTES.txt"]
    mutual = render(helm_merge(values, {"receiver": {"tls": {"verifyClients": True}}}))
    assert config_of(mutual)["receivers"]["otlp"]["tls"]["client_ca_file"] == "/etc/aaco/receiver-tls/ca.crt"
    assert "tls" not in (config_of(render({"config": RECEIVER_ON}))["receivers"]["otlp"])


# -- Memory ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "limit"),
    [
        ({}, "2048Mi"),
        ({"config": {"exporters": {"otlp": {"memory_budget_mib": 1024}}}}, "3584Mi"),
        ({"memoryLimit": {"baseMiB": 1024}}, "1536Mi"),
        ({"resources": {"limits": {"memory": "4Gi"}}}, "4Gi"),
        (
            {
                "config": {"exporters": {"otlp": {"memory_budget_mib": 1024}}},
                "resources": {"limits": {"memory": "3Gi"}},
            },
            "3Gi",
        ),
    ],
)
def test_the_memory_limit_derives_from_the_budget(values: dict[str, Any], limit: str):
    rendered = render(values)
    resources = rendered.container["resources"]
    assert resources["limits"]["memory"] == limit
    assert resources["limits"]["cpu"] == "2" and resources["requests"] == {"cpu": "200m", "memory": "512Mi"}
    budget = (values.get("config") or {}).get("exporters", {}).get("otlp", {}).get("memory_budget_mib", 256)
    assert config_of(rendered)["exporters"]["otlp"]["memory_budget_mib"] == budget, "the budget flows to the agent"


def test_the_chart_budget_is_the_agent_default():
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["config"]["exporters"]["otlp"]["memory_budget_mib"] == OtlpConfig().memory_budget_mib
    assert "resources.limits.memory" in (CHART_DIR / "values.yaml").read_text()


# -- Refusals -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"metrics": {"tls": {"enabled": True}}}, "metrics.tls.enabled needs metrics.tls.existingSecret"),
        (
            {
                "metrics": {
                    "tls": {"enabled": True, "existingSecret": "t", "clientAuthType": "RequireAndVerifyClientCert"}
                }
            },
            "the kubelet's probes present no client certificate",
        ),
        ({"metrics": {"basicAuth": {"username": "p", "passwordHash": "plain"}}}, "must be a bcrypt hash"),
        (
            {"metrics": {"basicAuth": {"username": "p", "passwordHash": BCRYPT}, "webConfig": {"existingSecret": "w"}}},
            "are both set",
        ),
        (
            {"metrics": {"basicAuth": {"username": "p", "passwordHash": BCRYPT}}, "serviceMonitor": {"enabled": True}},
            "serviceMonitor.basicAuthSecret.name is empty",
        ),
        ({"receiver": {"tls": {"existingSecret": "rx"}}}, "there is no receiver to serve TLS"),
    ],
)
def test_guards_that_cannot_work_are_refused_with_the_reason(values: dict[str, Any], message: str):
    with pytest.raises(helm().HelmError) as err:
        render(values)
    assert message in str(err.value)


def test_a_valid_bcrypt_hash_is_accepted():
    rendered = render({"metrics": {"basicAuth": {"username": "p", "passwordHash": BCRYPT}}})
    assert rendered.one("Secret", f"{RELEASE}-web-config")


# -- Least privilege ------------------------------------------------------------------------------------------------


def test_the_guards_add_no_privilege():
    on, off = render(secure()), render(without_guards(secure()))
    assert on.container["securityContext"] == off.container["securityContext"]
    assert on.pod["securityContext"] == off.pod["securityContext"]
    for key in ("hostPID", "hostNetwork", "hostIPC", "automountServiceAccountToken", "serviceAccountName"):
        assert on.pod[key] == off.pod[key], key
    assert on.pod["automountServiceAccountToken"] is False
    host = {v["name"]: v["hostPath"] for v in on.pod["volumes"] if "hostPath" in v}
    assert host == {v["name"]: v["hostPath"] for v in off.pod["volumes"] if "hostPath" in v}
    assert on.all("ClusterRole") == on.all("Role") == [], "lookup runs as the Helm user, the agent needs no role"
    assert {p["name"] for p in on.container["ports"]} == {p["name"] for p in off.container["ports"]}


def test_secrets_are_mounted_read_only_0400_into_the_agent_only():
    rendered = render(secure())
    assert [c["name"] for c in rendered.pod["containers"]] == ["agent"]
    assert "initContainers" not in rendered.pod and "ephemeralContainers" not in rendered.pod
    secret_volumes = [v for v in rendered.pod["volumes"] if "secret" in v]
    assert {v["secret"]["secretName"] for v in secret_volumes} == {
        f"{RELEASE}-admin",
        f"{RELEASE}-web-config",
        "aaco-metrics-tls",
        "aaco-receiver-tls",
    }
    mounts = secret_mounts(rendered)
    assert len(mounts) == len(secret_volumes), "each Secret mounted once"
    for path, m in mounts.items():
        assert m["mount"]["readOnly"] is True, path
        assert m["volume"]["secret"]["defaultMode"] == 0o400, path
        assert "subPath" not in m["mount"], f"{path}: a subPath mount would never see a rotated Secret"
        assert path.startswith("/etc/aaco/"), path
    assert "fsGroup" not in rendered.pod["securityContext"], "root reads 0400 files; no group needs them"
    # Env never carries them: only files, which the agent reads at start or on change.
    env = str(rendered.container.get("env", [])) + str(rendered.container.get("envFrom", []))
    assert "secretKeyRef" not in env and "secretRef" not in env


def test_a_non_root_agent_reads_the_secrets_through_its_group():
    values = {
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "ebpf": {"enabled": False},
        "processDiscovery": {"enabled": False},
        "metrics": {"basicAuth": {"username": "p", "passwordHash": BCRYPT}},
    }
    rendered = render(values)
    assert rendered.pod["securityContext"]["fsGroup"] == 10001
    assert "add" not in rendered.container["securityContext"]["capabilities"]
