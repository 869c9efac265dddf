"""Render the real Helm chart with helm-python-sdk (Helm v4 as a library) and pick manifests apart."""

from __future__ import annotations

import base64
import copy
import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from tests.conftest import skip_or_fail

ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = ROOT / "deploy" / "helm" / "aaco"
SYNC_SCRIPT = ROOT / "deploy" / "helm" / "sync_chart_files.py"
DASHBOARDS_DIR = ROOT / "dashboards"
RELEASE = "aaco"
NAMESPACE = "aaco-system"
KUBE_VERSIONS = ("1.29.0", "1.33.0")
SCENARIOS = sorted(CHART_DIR.glob("ci/*-values.yaml"))
ALL_SCENARIOS = [None, *SCENARIOS]  # None: the chart's defaults
SECURE = CHART_DIR / "ci" / "secure-values.yaml"  # every guard of issue 14 on
# The node's OTLP receiver with the upstream it forwards to (the agent refuses one without).
RECEIVER_ON = {
    "receivers": {"otlp": {"enabled": True}},
    "exporters": {"otlp": {"endpoint": "http://gateway.observability:4317"}},
}


def helm() -> ModuleType:
    """The helm_python module (skips, or fails under AACO_REQUIRE_REAL=1, when it is missing)."""
    try:
        import helm_python
    except ImportError as exc:  # pragma: no cover - depends on the environment
        skip_or_fail(f"helm-python-sdk is not installed ({exc}); pip install -e .[dev]")
        raise
    return helm_python


def sync_module() -> ModuleType:
    """deploy/helm/sync_chart_files.py, imported from its path (deploy/ is not a package)."""
    name = "aaco_sync_chart_files"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SYNC_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# Keys of the agent's config the chart sets itself when it mounts their files from Secrets.
CHART_OWNED = (("admin", "token_file"), ("exporters", "prometheus", "web_config_file"), ("receivers", "otlp", "tls"))


def without_chart_owned(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of an agent config without the keys the chart sets (CHART_OWNED), and sections left empty."""
    doc = copy.deepcopy(config)
    for *parents, key in CHART_OWNED:
        chain = [doc]
        for name in parents:
            node = chain[-1].get(name)
            if not isinstance(node, dict):
                break
            chain.append(node)
        else:
            chain[-1].pop(key, None)
            for name, parent in zip(reversed(parents), reversed(chain[:-1]), strict=True):
                if parent[name] == {}:
                    del parent[name]
    return doc


def scenario_values(path: Path | None) -> dict[str, Any]:
    """The values of one ci/*-values.yaml scenario (None: the chart's defaults)."""
    if path is None:
        return {}
    doc = yaml.safe_load(path.read_text())
    return doc or {}


def scenario_id(path: Path | None) -> str:
    """A readable pytest id."""
    return "defaults" if path is None else path.name.removesuffix("-values.yaml")


@dataclass
class Rendered:
    """A rendered release: template texts and the parsed manifests."""

    texts: dict[str, str]
    docs: list[tuple[str, dict[str, Any]]]
    values: dict[str, Any]

    def kinds(self) -> list[str]:
        """Kinds of every manifest, in order."""
        return [doc["kind"] for _, doc in self.docs]

    def all(self, kind: str) -> list[dict[str, Any]]:
        """Every manifest of ``kind``."""
        return [doc for _, doc in self.docs if doc["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        """The single manifest of ``kind`` (and ``name``)."""
        found = [d for d in self.all(kind) if name is None or d["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
        return found[0]

    def text(self, template: str) -> str:
        """The rendered text of ``templates/<template>``."""
        return self.texts[f"aaco/templates/{template}"]

    @property
    def daemonset(self) -> dict[str, Any]:
        """The agent DaemonSet (its pods' component is agent; nodeProblemDetector adds another)."""
        found = [
            d
            for d in self.all("DaemonSet")
            if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "agent"
        ]
        assert len(found) == 1, f"expected one agent DaemonSet, found {[d['metadata']['name'] for d in found]}"
        return found[0]

    @property
    def pod(self) -> dict[str, Any]:
        """The DaemonSet's pod spec."""
        return self.daemonset["spec"]["template"]["spec"]

    @property
    def container(self) -> dict[str, Any]:
        """The agent container."""
        (container,) = [c for c in self.pod["containers"] if c["name"] == "agent"]
        return container

    def config_text(self) -> str:
        """The agent config file the ConfigMap holds."""
        return self.one("ConfigMap", self.daemonset["metadata"]["name"])["data"]["config.yaml"]

    def mounts(self) -> dict[str, dict[str, Any]]:
        """Container mount path -> {mount, volume}."""
        volumes = {v["name"]: v for v in self.pod["volumes"]}
        return {m["mountPath"]: {"mount": m, "volume": volumes[m["name"]]} for m in self.container["volumeMounts"]}


def render(
    values: dict[str, Any] | None = None,
    *,
    chart_dir: Path = CHART_DIR,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> Rendered:
    """Render the chart offline, as `helm template` would, and parse every manifest."""
    h = helm()
    with h.Chart.load(chart_dir) as chart:
        texts = chart.render(values or {}, name=release, namespace=namespace)
        merged = chart.merge_values(values or {})
    docs = []
    for template, text in sorted(texts.items()):
        if template.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs.append((template, doc))
    return Rendered(texts=texts, docs=docs, values=merged)


def host_paths_here(config: dict[str, Any], tmp_path: Path, samples: Path) -> dict[str, Any]:
    """The rendered config with the container's host mounts pointed at stand-ins on this machine.

    /host/sys becomes the real amdgpu sysfs sample tree; the kubelet socket a path with no kubelet
    (the agent then runs without per-pod labels, as on a node without the pod-resources API); the
    trace spool and the capture directory temporary directories.
    """
    from aaco.agent.sources.smi import ttar

    sysfs = tmp_path / "sysfs"
    ttar.unpack(ttar.read((samples / "sysfs" / "amdgpu_card0.ttar").read_text()), sysfs)
    (drm,) = [p for p in sysfs.rglob("drm") if p.parent.name == "class"]
    for src in config["sources"]:
        if src["type"] == "smi":
            assert src["sysfs_root"] == "/host/sys"
            src["sysfs_root"] = str(drm.parent.parent)
            src["kubelet_socket"] = str(tmp_path / "no-kubelet" / "kubelet.sock")
        if src["type"] == "trace_dir":
            assert src["path"] == "/var/spool/aaco"
            src["path"] = str(tmp_path / "spool")
        if src["type"] == "capture":
            src["out_dir"] = str(tmp_path / "captures")
    return config


def kubernetes_validate() -> ModuleType:
    """The kubernetes-validate package (a test of the chart fails without it under AACO_REQUIRE_REAL)."""
    try:
        import kubernetes_validate
    except ImportError as exc:
        skip_or_fail(f"kubernetes-validate is not installed ({exc}); pip install -e .[dev]")
        raise
    return kubernetes_validate


def agent_env() -> dict[str, str]:
    """The environment without AACO_* and OTLP overrides (they would change what the config check sees)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("AACO_", "OTEL_EXPORTER_OTLP_"))}


def helm_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Maps merged key by key, as Helm merges values files (lists and scalars replaced)."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merge(out[key], value)
        else:
            out[key] = value
    return out


def secret_data(rendered: Rendered, name: str) -> dict[str, bytes]:
    """The decoded data of the Secret ``name`` the chart rendered."""
    return {k: base64.b64decode(v) for k, v in rendered.one("Secret", name)["data"].items()}


def secret_mounts(rendered: Rendered) -> dict[str, dict[str, Any]]:
    """Mount path -> {mount, volume} of the agent container's Secret volumes."""
    return {path: m for path, m in rendered.mounts().items() if "secret" in m["volume"]}


def materialise(rendered: Rendered, root: Path, existing: dict[str, dict[str, bytes]]) -> dict[str, str]:
    """Write every Secret volume of the pod under ``root`` as the kubelet would (items, defaultMode).

    The chart's own Secrets come from the render, ``existing`` holds the ones the values name. Returns
    container path -> path here, for the files whose paths the config and the web-config file name.
    """
    moved = {}
    for path, m in secret_mounts(rendered).items():
        spec = m["volume"]["secret"]
        name = spec["secretName"]
        data = existing[name] if name in existing else secret_data(rendered, name)
        items = spec.get("items") or [{"key": k, "path": k} for k in data]
        here = root / path.lstrip("/")
        here.mkdir(parents=True)
        for item in items:
            target = here / item["path"]
            target.write_bytes(data[item["key"]])
            target.chmod(spec["defaultMode"])
        moved[path] = str(here)
    return moved


def moved_text(text: str, moved: dict[str, str]) -> str:
    """``text`` with each container path replaced by where it lies here."""
    for container_path, here in moved.items():
        text = text.replace(container_path + "/", here + "/")
    return text
