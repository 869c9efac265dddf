"""The analyzer registry: every analyzer built from its YAML settings, in pipeline order, defaults as before."""

from __future__ import annotations

import pytest

from aaco.agent.config import load_config
from aaco.analyzers.base import DerivedAnalyzer
from aaco.analyzers.registry import ANALYZERS, AgentHints, AnalyzersConfig, build
from aaco.contract.errors import ConfigError

ORDER = [
    "latency",
    "serving",
    "kar",
    "launch",
    "activity",
    "jobs",
    "families",
    "serving_phases",
    "telemetry",
    "sched",
    "drift",
    "throttle",
    "health",
    "workloads",
    "roofline",
    "bottleneck",
]


def by_name(config: AnalyzersConfig, hints: AgentHints | None = None) -> dict:
    return {a.name: a for a in build(config, hints or AgentHints())}


def test_every_registered_analyzer_is_built_in_pipeline_order_derived_last():
    built = build(AnalyzersConfig(), AgentHints())
    assert [a.name for a in built] == ORDER == ANALYZERS.kinds()
    assert [a.name for a in built if isinstance(a, DerivedAnalyzer)] == ["bottleneck"]


def test_every_section_and_setting_is_documented():
    for name, field in AnalyzersConfig.model_fields.items():
        assert field.description, name
        sub = field.annotation
        for setting, f in getattr(sub, "model_fields", {}).items():
            assert f.description, f"analyzers.{name}.{setting}"


def test_yaml_values_reach_the_analyzers():
    config = load_config(
        None,
        {
            "analyzers": {
                "max_models": 9,
                "latency": {"window": 50},
                "launch": {"microkernel_threshold_us": 4.0, "max_runs": 3},
                "activity": {"max_windows": 5},
                "families": {"max_names": 11, "top": 2},
                "telemetry": {"max_series": 12, "stale_after_s": 400},
                "sched": {"retain_s": 2, "stale_s": 3, "max_folded": 4},
                "drift": {"detector": "ewma", "detector_options": {"lam": 0.2, "window": 400}, "hold_s": 10},
                "throttle": {"power_cap_w": 250, "temperature_limits_c": {"edge": 80}, "reservoir": 64},
                "bottleneck": {"max_pids": 6, "min_finding_confidence": 0.6},
            }
        },
        env={},
    )
    a = by_name(config.analyzers)
    assert (a["latency"]._window, a["latency"]._max_models) == (50, 9)
    assert (a["launch"]._threshold_us, a["launch"]._max_runs, a["launch"]._max_groups) == (4.0, 3, 9)
    assert a["activity"]._max == 5
    assert (a["families"]._max_names, a["families"]._top, a["families"]._max_models) == (11, 2, 9)
    assert (a["telemetry"].max_series, a["telemetry"].stale_after_ns) == (12, 400 * 10**9)
    assert (a["sched"].retain_ns, a["sched"].stale_ns, a["sched"].max_folded) == (2 * 10**9, 3 * 10**9, 4)
    assert (a["drift"].detector, a["drift"].options, a["drift"].hold_ns) == (
        "ewma",
        {"lam": 0.2, "window": 400},
        10**10,
    )
    t = a["throttle"].settings
    assert (t.power_cap_w, t.temperature_limits_c, t.reservoir) == (250.0, {"edge": 80.0}, 64)
    assert (a["bottleneck"].max_pids, a["bottleneck"].min_finding_confidence, a["bottleneck"].max_models) == (6, 0.6, 9)


def test_environment_overrides_reach_a_setting():
    config = load_config(None, {}, env={"AACO_ANALYZERS_THROTTLE_STALE_S": "30"})
    assert by_name(config.analyzers)["throttle"].settings.stale_s == 30.0


def test_defaults_are_the_analyzers_own():
    a = by_name(AnalyzersConfig())
    assert a["latency"]._window == 10_000 and a["telemetry"].stale_after_ns == 300 * 10**9
    assert a["throttle"].settings.temperature_limits_c == {"edge": 89.0, "junction": 105.0, "memory": 95.0}
    assert a["drift"].detector == "cusum" and a["sched"].max_workloads == 64


def test_hints_size_telemetry_and_sched():
    a = by_name(AnalyzersConfig(), AgentHints({"smi": "amd"}, smi_interval_s=60.0, sched_max_workloads=7))
    assert a["telemetry"].compat == {"smi": "amd"} and a["telemetry"].stale_after_ns == 600 * 10**9
    assert a["sched"].max_workloads == 7


@pytest.mark.parametrize(
    ("analyzers", "needle"),
    [
        ({"latency": {"windo": 5}}, "windo"),
        ({"throttle": {"clock_ratio": 1.5}}, "clock_ratio"),
        ({"drift": {"detector_options": {"bogus": 1.0}}}, "bogus"),
        ({"drift": {"detector_options": {"warmup": 3}}}, "warmup"),
        ({"nosuch": {}}, "nosuch"),
    ],
)
def test_bad_settings_are_config_errors(analyzers: dict, needle: str):
    with pytest.raises(ConfigError) as e:
        load_config(None, {"analyzers": analyzers}, env={})
    assert needle in str(e.value)


def test_an_empty_section_takes_the_defaults():
    config = load_config(None, {"analyzers": {"kar": None, "throttle": None}}, env={})
    assert by_name(config.analyzers)["throttle"].settings.stale_s == 60.0
