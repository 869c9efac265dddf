"""Configuration: embedded default, YAML files, all errors at once with paths, env overrides."""

from __future__ import annotations

from pathlib import Path

import pytest

from aaco.agent.config import AgentConfig, load_config, source_names
from aaco.agent.sources import SOURCES
from aaco.agent.sources.ort.source import OrtSourceConfig
from aaco.agent.sources.replay import ReplaySourceConfig
from aaco.contract.errors import ConfigError

NO_ENV: dict[str, str] = {}


def problems(path=None, overrides=None, env=None, check_paths=True) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_config(path, overrides=overrides, env=NO_ENV if env is None else env, check_paths=check_paths)
    assert exc.value.problems, "ConfigError without problems"
    return exc.value.problems


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "aaco.yaml"
    p.write_text(text)
    return p


def test_embedded_default():
    c = load_config(None, env=NO_ENV)
    assert isinstance(c, AgentConfig)
    assert len(c.sources) == 1
    assert isinstance(c.sources[0], OrtSourceConfig)
    assert c.sources[0].model is None
    assert c.exporters.prometheus.address == "127.0.0.1"
    assert c.exporters.prometheus.port == 9464
    assert c.exporters.lake.path == Path.cwd() / "aaco-data"  # made absolute at load
    assert c.exporters.otlp.endpoint is None
    assert c.pipeline.queue_max_events == 1_000_000
    assert c.log_level == "info"
    assert c.node  # some non-empty name


def test_yaml_file(tmp_path):
    trace = tmp_path / "t.json"
    trace.write_text("[]")
    p = write(
        tmp_path,
        f"""
node: gpu-7
sources:
  - type: replay
    paths: [{trace}]
    model: bert
  - type: ort
    name: resnet
    iterations: 5
exporters:
  prometheus: {{port: 0}}
  lake: {{path: {tmp_path / "lake"}, flush_rows: 10}}
pipeline:
  correlator_hold_s: 0.5
log_level: debug
""",
    )
    c = load_config(p, env=NO_ENV)
    assert c.node == "gpu-7"
    assert isinstance(c.sources[0], ReplaySourceConfig)
    assert c.sources[0].paths == [trace]
    assert c.sources[0].model == "bert"
    assert isinstance(c.sources[1], OrtSourceConfig)
    assert c.sources[1].iterations == 5
    assert c.exporters.prometheus.port == 0
    assert c.exporters.lake.flush_rows == 10
    assert c.pipeline.correlator_hold_s == 0.5
    assert c.log_level == "debug"
    assert source_names(c) == ["replay", "resnet"]


def test_empty_file_is_all_defaults(tmp_path):
    c = load_config(write(tmp_path, ""), env=NO_ENV)
    assert c.sources == []
    assert c.exporters.prometheus.port == 9464


def test_every_error_reported_at_once_with_paths(tmp_path):
    p = write(
        tmp_path,
        """
sources:
  - type: ort
    iterations: 0
  - type: replay
    paths: not-a-list
    bogus: 1
exporters:
  prometheus:
    port: 70000
pipeline:
  queue_max_events: -1
log_level: loud
""",
    )
    probs = problems(p)
    joined = "\n".join(probs)
    assert any(x.startswith("sources[0].iterations:") for x in probs), joined
    assert any(x.startswith("sources[1].paths:") for x in probs), joined
    assert any(x.startswith("sources[1].bogus: unknown key") for x in probs), joined
    assert any(x.startswith("exporters.prometheus.port:") for x in probs), joined
    assert any(x.startswith("pipeline.queue_max_events:") for x in probs), joined
    assert any(x.startswith("log_level:") for x in probs), joined
    assert len(probs) == 6


def test_unknown_keys_list_allowed_keys():
    probs = problems(overrides={"bogus": 1, "exporters": {"prometheus": {"prot": 1}}})
    top = next(p for p in probs if p.startswith("bogus:"))
    assert "unknown key" in top
    assert "allowed: admin, analyzers, exporters, log_level, node, pipeline, receivers, sources" in top
    nested = next(p for p in probs if p.startswith("exporters.prometheus.prot:"))
    allowed = "address, enabled, idle_timeout_s, max_connections, max_connections_per_peer, max_workers, port, "
    assert f"allowed: {allowed}request_timeout_s, web_config_file" in nested


def test_unknown_key_in_a_source_lists_that_source_type_keys():
    probs = problems(overrides={"sources": [{"type": "replay", "paths": ["x"], "colour": 1}]}, check_paths=False)
    from aaco.agent.sources.replay import ReplaySourceConfig

    allowed = ", ".join(sorted(ReplaySourceConfig.model_fields))
    assert probs == [f"sources[0].colour: unknown key (allowed: {allowed})"]


def test_unknown_source_type():
    probs = problems(overrides={"sources": [{"type": "ort"}, {"type": "rocprofv9"}]})
    assert probs == [f"sources[1].type: unknown source type 'rocprofv9' (known: {', '.join(SOURCES.kinds())})"]


def test_missing_source_type():
    probs = problems(overrides={"sources": [{"paths": ["x"]}]})
    assert probs == [f"sources[0]: missing 'type' (one of: {', '.join(SOURCES.kinds())})"]


def test_source_not_a_mapping():
    probs = problems(overrides={"sources": ["ort"]})
    assert len(probs) == 1
    assert probs[0].startswith("sources[0]:")


def test_missing_required_source_field():
    probs = problems(overrides={"sources": [{"type": "replay"}]})
    assert probs == ["sources[0].paths: Field required"]


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    p = write(tmp_path, "node: a\nsources:\n  - type: ort\n    iterations: [1, 2\n")
    probs = problems(p)
    assert len(probs) == 1
    assert probs[0].startswith("line ")
    assert "column" in probs[0]
    line = int(probs[0].split()[1].rstrip(","))
    assert line in (4, 5)


def test_top_level_not_a_mapping(tmp_path):
    probs = problems(write(tmp_path, "- a\n- b\n"))
    assert probs == ["<top level>: expected a mapping of sections, got list"]


def test_missing_file_and_directory(tmp_path):
    assert problems(tmp_path / "nope.yaml") == ["file not found"]
    assert problems(tmp_path) == ["is a directory, expected a YAML file"]


def test_config_error_str_names_file_and_every_problem(tmp_path):
    p = write(tmp_path, "bogus: 1\nlog_level: loud\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p, env=NO_ENV)
    text = str(exc.value)
    assert text.splitlines()[0] == f"{p}: 2 error(s) in configuration"
    assert len(text.splitlines()) == 3
    assert all(str(p) in line for line in text.splitlines())


def test_env_overrides():
    env = {
        "AACO_EXPORTERS_PROMETHEUS_PORT": "9500",
        "AACO_NODE": "x",
        "AACO_PIPELINE_QUEUE_MAX_EVENTS": "5",
        "AACO_PIPELINE_CORRELATOR_HOLD_S": "0.25",
        "AACO_LOG_LEVEL": "warning",
        "AACO_EXPORTERS_LAKE_ENABLED": "false",
    }
    c = load_config(None, env=env)
    assert c.exporters.prometheus.port == 9500
    assert c.node == "x"
    assert c.pipeline.queue_max_events == 5
    assert c.pipeline.queue_max_batches == 1024  # a sibling is untouched
    assert c.pipeline.correlator_hold_s == 0.25
    assert c.log_level == "warning"
    assert c.exporters.lake.enabled is False


def test_env_sources_replaces_the_list():
    c = load_config(None, env={"AACO_SOURCES": "[{type: ort, name: a}, {type: ort, name: b}]"})
    assert [s.name for s in c.sources] == ["a", "b"]


def test_env_overrides_a_file(tmp_path):
    p = write(tmp_path, "node: from-file\nexporters: {prometheus: {port: 1234, address: 0.0.0.0}}\n")
    c = load_config(p, env={"AACO_EXPORTERS_PROMETHEUS_PORT": "9500"})
    assert c.node == "from-file"
    assert c.exporters.prometheus.port == 9500
    assert c.exporters.prometheus.address == "0.0.0.0"


def test_unrelated_env_ignored():
    c = load_config(None, env={"AACO_REQUIRE_REAL": "1", "PATH": "/bin", "AACOX_NODE": "y", "AACO_": "z"})
    assert c.node != "y"


def test_env_unknown_key_is_an_error():
    probs = problems(env={"AACO_EXPORTERS_NOPE": "1", "AACO_PIPELINE_QUEUE_MAX": "2"})
    assert sorted(probs) == [
        "AACO_EXPORTERS_NOPE: no such configuration key",
        "AACO_PIPELINE_QUEUE_MAX: no such configuration key",
    ]


def test_env_invalid_value_is_reported_with_its_path():
    probs = problems(env={"AACO_EXPORTERS_PROMETHEUS_PORT": "many"})
    assert len(probs) == 1
    assert probs[0].startswith("exporters.prometheus.port:")
    probs = problems(env={"AACO_EXPORTERS_PROMETHEUS_PORT": "[1, 2"})
    assert probs[0].startswith("AACO_EXPORTERS_PROMETHEUS_PORT: not a valid YAML value")


def test_env_error_and_file_error_reported_together(tmp_path):
    probs = problems(write(tmp_path, "log_level: loud\n"), env={"AACO_EXPORTERS_NOPE": "1"})
    assert len(probs) == 2


def test_env_numeric_looking_node_name():
    assert load_config(None, env={"AACO_NODE": "7"}).node == "7"


def test_overrides_win_over_env():
    c = load_config(
        None,
        overrides={"exporters": {"prometheus": {"port": 9600}}, "node": "cli"},
        env={"AACO_EXPORTERS_PROMETHEUS_PORT": "9500", "AACO_NODE": "env", "AACO_PIPELINE_QUEUE_MAX_EVENTS": "5"},
    )
    assert c.exporters.prometheus.port == 9600
    assert c.node == "cli"
    assert c.pipeline.queue_max_events == 5  # env still applies where no override


def test_check_files_reports_missing_model_and_paths(tmp_path):
    present = tmp_path / "present.json"
    present.write_text("[]")
    overrides = {
        "sources": [
            {"type": "ort", "model": str(tmp_path / "missing.onnx")},
            {"type": "replay", "paths": [str(present), str(tmp_path / "gone.json")]},
        ]
    }
    probs = problems(overrides=overrides)
    assert probs == [
        f"sources[0].model: no such file: {tmp_path / 'missing.onnx'}",
        f"sources[1].paths[1]: no such file or directory: {tmp_path / 'gone.json'}",
    ]
    # without the check the same configuration loads
    c = load_config(None, overrides=overrides, env=NO_ENV, check_paths=False)
    assert len(c.sources) == 2


def test_existing_model_passes(resnet50):
    c = load_config(None, overrides={"sources": [{"type": "ort", "model": str(resnet50)}]}, env=NO_ENV)
    assert c.sources[0].model == resnet50


def test_source_names_dedupe():
    c = load_config(
        None,
        overrides={
            "sources": [
                {"type": "ort"},
                {"type": "ort"},
                {"type": "ort", "name": "ort"},
                {"type": "ort", "name": "x"},
                {"type": "ort", "name": "x"},
            ]
        },
        env=NO_ENV,
    )
    assert source_names(c) == ["ort", "ort-2", "ort-3", "x", "x-2"]


def test_config_is_frozen():
    c = load_config(None, env=NO_ENV)
    with pytest.raises(Exception):  # noqa: B017 - pydantic raises its ValidationError subclass
        c.node = "other"  # type: ignore[misc]


def test_relative_paths_are_made_absolute_when_loading(tmp_path, monkeypatch):
    """The working directory may change later (bcc compiling eBPF): paths are fixed at load time."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "traces").mkdir()
    cfg = load_config(
        None, {"sources": [{"type": "replay", "paths": ["traces"]}], "exporters": {"lake": {"path": "lake"}}}, env={}
    )
    assert cfg.exporters.lake.path == tmp_path / "lake"
    assert cfg.sources[0].paths == [tmp_path / "traces"]
    monkeypatch.chdir("/")
    assert cfg.exporters.lake.path == tmp_path / "lake"  # unchanged by a later chdir
