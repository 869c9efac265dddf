"""The chart and the image agree: user, state volume, /tmp, ports, bind addresses, image name and tag.

The image's side is read from deploy/image/Containerfile (its runtime stage) and deploy/image/build.sh
(the name and tags it builds), the chart's side rendered by the real Helm (helm-python-sdk). No
container runtime is needed; tests/image builds and runs the image itself.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pytest
import yaml

from tests.support.helm_chart import ALL_SCENARIOS, CHART_DIR, RECEIVER_ON, render, scenario_id, scenario_values

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "deploy" / "image" / "Containerfile"
BUILD_SH = ROOT / "deploy" / "image" / "build.sh"
MINIMAL = CHART_DIR / "ci" / "minimal-values.yaml"


@dataclass
class Image:
    """What the Containerfile's last stage declares."""

    uid: int
    gid: int
    volumes: list[str]
    workdir: str
    ports: set[int]
    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined, comments dropped."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = "\n".join(lines).replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def image() -> Image:
    steps = instructions(CONTAINERFILE.read_text())
    last = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    runtime = steps[last:]

    def only(word: str) -> str:
        (value,) = [rest for w, rest in runtime if w == word]
        return value

    env: dict[str, str] = {}
    for word, rest in runtime:
        if word == "ENV":
            env.update(pair.split("=", 1) for pair in shlex.split(rest))
    uid, gid = (int(x) for x in only("USER").split(":"))
    return Image(
        uid=uid,
        gid=gid,
        volumes=json.loads(only("VOLUME")),
        workdir=only("WORKDIR"),
        ports={int(p) for p in only("EXPOSE").split()},
        env=env,
        entrypoint=json.loads(only("ENTRYPOINT")),
        cmd=json.loads(only("CMD")),
    )


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def build_sh_value(name: str) -> str:
    (value,) = re.findall(rf"^{name}=(\S+)$", BUILD_SH.read_text(), re.MULTILINE)
    return value


def under(path: str, parent: str) -> bool:
    return PurePosixPath(path).is_relative_to(PurePosixPath(parent))


def test_containerfile_declares_one_state_volume_and_tmp_home():
    img = image()
    assert img.uid != 0 and img.gid != 0
    assert img.volumes == ["/var/lib/aaco"], "the state lives under one volume"
    assert img.workdir == img.volumes[0], "relative paths (the embedded default's ./aaco-data) land on the volume"
    assert img.env["HOME"] == "/tmp" and img.env["TMPDIR"] == "/tmp"
    assert img.entrypoint == ["aaco"] and img.cmd == ["agent"]
    assert img.env["AACO_EXPORTERS_PROMETHEUS_ADDRESS"] == "0.0.0.0", "a bare `agent` is reachable from outside"
    assert build_sh_value("UID_GID") == f"{img.uid}:{img.gid}", "build.sh checks the image as its own user"


def test_chart_runs_the_image_as_its_user_where_it_runs_non_root():
    img = image()
    values = {**scenario_values(MINIMAL), "runAsUser": img.uid, "runAsGroup": img.gid}
    rendered = render(values)
    sc = rendered.container["securityContext"]
    assert sc["runAsUser"] == img.uid and sc["runAsGroup"] == img.gid
    assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True
    assert rendered.pod["securityContext"]["fsGroup"] == img.gid
    assert rendered.container["args"][0] == img.cmd[0], "the chart's args go to the image's ENTRYPOINT, aaco"


@pytest.mark.parametrize("scenario", ALL_SCENARIOS, ids=scenario_id)
def test_chart_mounts_the_image_state_volume_and_tmp(scenario: Path | None):
    img = image()
    rendered = render(scenario_values(scenario))
    mounts = rendered.mounts()
    (state,) = img.volumes
    assert rendered.values["state"]["mountPath"] == state
    assert state in mounts and not mounts[state]["mount"].get("readOnly", False)
    assert "/tmp" in mounts and "emptyDir" in mounts["/tmp"]["volume"], "HOME and TMPDIR of the image"
    assert rendered.container["securityContext"]["readOnlyRootFilesystem"] is True
    config = yaml.safe_load(rendered.config_text())
    assert under(config["exporters"]["lake"]["path"], state), "the lake lies on the image's state volume"
    for path in mounts:  # no mount hides the image's own files
        assert not under("/opt/aaco", path), path


def test_chart_ports_and_probes_match_the_image():
    img = image()
    rendered = render({"config": RECEIVER_ON})
    c = rendered.container
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["metrics"] in img.ports
    assert {ports["otlp-grpc"], ports["otlp-http"]} <= img.ports
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        port = c[probe]["httpGet"]["port"]
        assert (ports[port] if isinstance(port, str) else port) in img.ports, probe


@pytest.mark.parametrize("scenario", ALL_SCENARIOS, ids=scenario_id)
def test_chart_passes_the_config_addresses_over_the_image_defaults(scenario: Path | None):
    img = image()
    rendered = render(scenario_values(scenario))
    env = {e["name"]: e.get("value") for e in rendered.container["env"]}
    config = yaml.safe_load(rendered.config_text())
    overrides = {k for k in img.env if k.startswith("AACO_")}
    assert overrides == {"AACO_EXPORTERS_PROMETHEUS_ADDRESS", "AACO_RECEIVERS_OTLP_ADDRESS"}
    assert overrides <= set(env), "every AACO_* default of the image is set by the chart"
    assert env["AACO_EXPORTERS_PROMETHEUS_ADDRESS"] == str(config["exporters"]["prometheus"]["address"])
    receiver = (config.get("receivers") or {}).get("otlp") or {}
    assert env["AACO_RECEIVERS_OTLP_ADDRESS"] == str(receiver.get("address", "0.0.0.0"))


def test_chart_default_image_is_what_build_sh_builds():
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    version = project_version()
    assert chart["appVersion"] == version, "build.sh tags the image with pyproject's version"
    rendered = render({})
    assert rendered.container["image"] == f"{build_sh_value('IMAGE')}:{version}"
