"""The command line's behaviours from issue 15: --version, output not cut or wrapped at 80 columns, opsets as text.

Elsewhere: ``aaco diff`` across models (tests/integration/test_verdict_cli.py), no CUDA version from a
dangling link (test_environment.py), counters at 0 from the start (test_stats.py and
tests/integration/test_service_lifecycle.py).
"""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from aaco.agent import __version__
from aaco.agent.cli import common
from aaco.agent.cli.report import summary, summary_table


def aaco(*args: str) -> subprocess.CompletedProcess[str]:
    """``aaco ARGS`` with stdout a pipe and no COLUMNS or TERMINAL_WIDTH, as in CI and scripts."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    return subprocess.run(
        [sys.executable, "-m", "aaco.agent", *args], check=False, capture_output=True, text=True, env=env, timeout=120
    )


def test_version_option_and_command():
    for flag in ("--version", "-V"):
        proc = aaco(flag)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"aaco {__version__}"
    proc = aaco("version")
    assert proc.returncode == 0 and proc.stdout.startswith(f"aaco {__version__} (python ")


def test_help_shows_choices_and_keys_in_full_when_piped():
    run = aaco("run", "--help")
    assert "auto, cpu, cuda, rocm or migraphx" in run.stdout
    agent = aaco("agent", "--help")
    assert "exporters.prometheus.web_config_file" in agent.stdout
    telemetry = aaco("telemetry", "--help")
    assert "auto, amdsmi, amd-smi, rocm-smi, sysfs, nvml, nvidia-smi or file" in telemetry.stdout
    for proc in (run, agent, telemetry):
        assert proc.returncode == 0 and "…" not in proc.stdout


def test_metrics_table_keeps_long_names_when_piped():
    proc = aaco("metrics")
    assert proc.returncode == 0, proc.stderr
    assert "…" not in proc.stdout
    assert "aaco_events_dropped_total" in proc.stdout


def test_summary_keeps_a_long_model_name_and_every_number_whole_at_80_columns():
    name = "light_resnet50_with_a_rather_long_model_name"
    doc = {"latency": {"models": {name: {"iterations": 20, "p50_s": 0.1712851, "p95_s": 0.0134, "p99_s": 0.0140}}}}
    service = SimpleNamespace(final_snapshot=SimpleNamespace(to_dict=lambda: doc))
    console = Console(width=80, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(summary_table(summary(service)))  # type: ignore[arg-type]
    lines = console.export_text().splitlines()
    assert all(len(line) <= 80 for line in lines)
    assert any(name in line for line in lines)
    assert any("171.285" in line for line in lines) and any("13.400" in line for line in lines)


def test_a_missing_kubelet_socket_is_logged_once_per_process(tmp_path, caplog):
    from aaco.agent.sources.smi.pods import PodAttribution

    socket = tmp_path / "kubelet.sock"
    with caplog.at_level(logging.INFO, logger="aaco.sources.smi.pods"):
        for _ in range(3):  # three sources, each with its own attribution, each refreshing twice
            pods = PodAttribution(socket)
            pods.refresh()
            pods.refresh()
    said = [r for r in caplog.records if "no kubelet pod-resources socket" in r.getMessage()]
    assert len(said) == 1 and str(socket) in said[0].getMessage()


def test_graph_prints_opsets_as_text_not_a_python_dict():
    from aaco.agent.sources.ort.models import resolve_model

    proc = aaco("graph", str(resolve_model(None)))
    assert proc.returncode == 0, proc.stderr
    head = proc.stdout.splitlines()[0]
    assert head.endswith("opset ai.onnx:9") and "{" not in head


def test_an_error_to_a_pipe_is_one_line_with_the_whole_message(tmp_path):
    missing = tmp_path / ("a_directory_with_a_name_long_enough_to_pass_eighty_columns_" * 2) / "model.onnx"
    proc = aaco("graph", str(missing))
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(missing) in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_usage_error_to_a_pipe_is_not_wrapped_at_80_columns():
    proc = aaco("sched", "--duration", "soon")
    assert proc.returncode == 2
    said = "Invalid value for '--duration' / '-d': Input should be a valid number, unable to parse string as a number"
    assert said in proc.stderr  # 107 columns on one line of the error panel


def test_error_lines_are_never_hard_wrapped_and_are_not_markup(monkeypatch):
    buffer = io.StringIO()
    monkeypatch.setattr(common, "err_console", Console(file=buffer, width=40))
    message = "cannot read the admin token [bold]/var/lib/aaco/admin-token[/bold]: no such file, check --token-file"
    common.print_error(message)
    common.print_warning(message)
    assert buffer.getvalue().splitlines() == [f"error: {message}", f"warning: {message}"]


def test_a_pipe_gets_the_wide_width_unless_columns_say_otherwise(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("TERMINAL_WIDTH", raising=False)
    assert common.piped_width(io.StringIO()) == common.PIPED_WIDTH
    monkeypatch.setenv("COLUMNS", "100")
    assert common.piped_width(io.StringIO()) is None


HEAVY = (
    "aaco.agent.config",
    "aaco.agent.service",
    "aaco.agent.sources",
    "aaco.agent.admin",
    "aaco.analyzers",
    "aaco.exporters",
    "aaco.agent.fleet",
    "duckdb",
    "pydantic",
    "pyarrow",
    "onnxruntime",
)
LOADED_AFTER = """
import json, sys
from aaco.agent.cli import main
flag, heavy = sys.argv[1], tuple(json.loads(sys.argv[2]))
sys.argv = ["aaco", flag]
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(heavy))))
"""


def test_version_and_help_load_no_command_code():
    """The commands import the config, the service, the sources and pydantic only when they run."""
    for flag in ("--version", "--help"):
        proc = subprocess.run(
            [sys.executable, "-c", LOADED_AFTER, flag, json.dumps(HEAVY)],
            check=True,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert json.loads(proc.stdout.splitlines()[-1]) == [], flag


def test_capture_defaults_to_the_agents_token_file():
    from aaco.agent.admin import DEFAULT_TOKEN_FILE
    from aaco.agent.cli import capture

    assert capture.DEFAULT_TOKEN_FILE == DEFAULT_TOKEN_FILE


def test_replay_to_a_url_of_no_store_is_a_config_error(tmp_path):
    """``--out ftp://...`` is refused, naming the fix, and writes nothing (s3:// once wrote a directory ``s3:``)."""
    sample = Path(__file__).resolve().parents[2] / "examples" / "data" / "rocprofv3" / "kernel_trace.csv"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    proc = subprocess.run(
        [sys.executable, "-m", "aaco.agent", "replay", str(sample), "--out", "ftp://bucket/lake"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "exporters.lake" in proc.stderr and "ftp:// is not a lake location" in proc.stderr
    assert list(tmp_path.iterdir()) == []
