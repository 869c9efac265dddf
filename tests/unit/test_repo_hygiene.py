"""The repository keeps its promises: lint clean, CI = the README's test command, generated files current."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Set up and run.*?```bash\n(.*?)```", text, re.S)
    assert block, "README lacks the set-up block"
    return [ln.strip() for ln in block.group(1).splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_readme_has_exactly_two_commands():
    cmds = readme_commands()
    assert len(cmds) == 2
    assert "aaco agent" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_exactly_the_readme_test_command_with_require_real():
    ci = (ROOT / ".ci" / "run").read_text()
    lines = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    assert "export AACO_REQUIRE_REAL=1" in lines
    assert readme_commands()[1] in lines
    after = lines[lines.index(readme_commands()[1]) + 1 :]
    assert after == [], f".ci/run must run only the README's test command, found extra: {after}"


def test_ruff_clean():
    ruff = Path(sys.executable).parent / "ruff"
    check = subprocess.run([str(ruff), "check", "."], cwd=ROOT, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stdout[-4000:]
    fmt = subprocess.run([str(ruff), "format", "--check", "."], cwd=ROOT, capture_output=True, text=True, check=False)
    assert fmt.returncode == 0, fmt.stdout[-4000:]


def test_example_config_is_current():
    from aaco.agent.config_doc import example_config

    assert (ROOT / "examples" / "agent.yaml").read_text() == example_config(), (
        "examples/agent.yaml is stale: run `aaco config example > examples/agent.yaml`"
    )


def test_examples_validate():
    from aaco.agent.config import load_config

    for name in ("agent.yaml", "demo.yaml"):
        load_config(ROOT / "examples" / name, env={})


def test_every_package_folder_is_installed():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = conf["package-dir"]
    listed = set(conf["packages"])
    for pkg, folder in mapping.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            name = ".".join([pkg, *rel.parts]) if rel.parts else pkg
            assert name in listed, f"{name} ({init.parent}) is not listed in pyproject packages"


def test_package_imports_as_aaco():
    import aaco.agent
    import aaco.analyzers
    import aaco.exporters

    assert Path(aaco.agent.__file__).parent == ROOT / "agent"
    assert Path(aaco.exporters.__file__).parent == ROOT / "exporters"
    assert Path(aaco.analyzers.__file__).parent == ROOT / "analyzers"


def test_metrics_doc_is_current():
    from aaco.agent.metrics_doc import splice

    doc = (ROOT / "docs" / "metrics.md").read_text()
    assert doc == splice(doc), "docs/metrics.md is stale: regenerate its table with `aaco metrics --markdown`"


def test_no_tracked_file_reaches_outside_the_checkout():
    """A clone alone passes its suite: nothing names the shared folder beside the repository."""
    outside = "../" + "shared"  # spelled in two pieces so that this file does not match itself
    found = subprocess.run(
        ["git", "grep", "-n", "-F", "-e", outside],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert found.returncode == 1, f"tracked files refer outside the checkout:\n{found.stdout[:4000]}"


def test_every_sample_has_its_provenance():
    """Each real capture under examples/data is named in SAMPLES.md (tool, source, licence)."""
    data = ROOT / "examples" / "data"
    listed = (data / "SAMPLES.md").read_text()
    files = [p for p in data.rglob("*") if p.is_file() and p.name not in ("README.md", "SAMPLES.md")]
    assert files
    hta = "## `kineto-hta/`" in listed  # one paragraph covers that folder's files
    missing = [
        str(p.relative_to(data))
        for p in files
        if str(p.relative_to(data)) not in listed and not (hta and p.parent.name == "kineto-hta")
    ]
    assert missing == [], f"samples without provenance in examples/data/SAMPLES.md: {missing}"
