"""Every command of the README's tour at a real terminal (a pseudo-terminal of 80 and of 120 columns).

What a person sees: exit 0, no traceback, no line wider than the terminal, progress bars while the
long commands work (issue 26: they crashed whenever stdout was a terminal, which no piped test saw).
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.support.terminal import TerminalRun, run_in_terminal

pytestmark = pytest.mark.integration

BAR = "━"  # rich's progress bar


def check(run: TerminalRun) -> None:
    assert run.returncode == 0, run.describe()
    assert "Traceback" not in run.raw and "lost sys.stderr" not in run.raw, run.describe()
    assert run.wide_lines() == [], run.describe()


def tour_at(width: int, aaco: str, samples, cwd) -> dict[str, TerminalRun]:
    """The acceptance list of issue 26, in order (later commands read the lake the first one wrote)."""
    cwd.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    nvsmi = [str(p) for p in sorted((samples / "nvidia-smi").glob("*.xml*"))]
    commands = {
        "help": [aaco, "--help"],
        "run": [aaco, "run", "-n", "5"],
        "replay kineto": [aaco, "replay", str(samples / "kineto")],
        "replay rocprofv3": [aaco, "replay", str(samples / "rocprofv3" / "kernel_trace.csv")],
        "sched": [aaco, "sched", "--pid", str(sleeper.pid), "--duration", "2"],
        **{f"telemetry {os.path.basename(p)}": [aaco, "telemetry", "-f", p] for p in nvsmi},
        "metrics": [aaco, "metrics"],
        "fleet summary": [aaco, "fleet", "summary", "--lake", "aaco-data"],
        "fleet models": [aaco, "fleet", "models", "--lake", "aaco-data"],
        "baseline save": [aaco, "baseline", "save", "aaco-data"],
        "version": [aaco, "version"],
    }
    try:
        return {name: run_in_terminal(args, columns=width, cwd=cwd) for name, args in commands.items()}
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.fixture(scope="module")
def tours(tmp_path_factory, aaco_bin, samples) -> dict[int, dict[str, TerminalRun]]:
    root = tmp_path_factory.mktemp("terminal")
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {w: pool.submit(tour_at, w, aaco_bin, samples, root / str(w)) for w in (80, 120)}
        return {w: f.result() for w, f in futures.items()}


@pytest.mark.parametrize("width", [80, 120])
def test_every_command_of_the_tour_at_a_terminal(tours, width):
    for run in tours[width].values():
        check(run)


def test_long_commands_show_progress_bars_at_a_terminal(tours):
    for width in (80, 120):
        for name in ("run", "replay kineto"):
            assert BAR in tours[width][name].raw, tours[width][name].describe()


def test_tables_fold_into_blocks_at_80_columns_and_stay_tables_at_120(tours):
    narrow = tours[80]["run"].text
    assert "model: light_resnet50" in narrow and "device active  cpu:" in narrow
    wide = tours[120]["run"].text
    header = next(line for line in wide.splitlines() if line.startswith("model"))
    assert header.split()[:3] == ["model", "iterations", "p50"]


def test_metric_names_are_whole_at_80_columns(tours):
    from aaco.agent.metrics_doc import all_metrics, prom_exposed_name

    lines = tours[80]["metrics"].text.splitlines()
    heads = {line.split()[0] for line in lines if line and not line.startswith(" ")}
    assert {prom_exposed_name(m) for m in all_metrics()} <= heads


@pytest.mark.parametrize(
    "group",
    [[], ["run"], ["replay"], ["agent"], ["sched"], ["telemetry"], ["fleet"], ["fleet", "outliers"], ["config"]],
)
def test_help_fits_80_columns(aaco_bin, group):
    check(run_in_terminal([aaco_bin, *group, "--help"], columns=80))
