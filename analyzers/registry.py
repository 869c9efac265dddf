"""Every analyzer of the agent: its name, its settings model and its factory, in pipeline order.

Adding an analyzer is one module (the analyzer and its ``StrictModel`` settings) and one
``ANALYZERS.register`` line here; its settings appear in the YAML under ``analyzers.<name>`` and in
``aaco config example`` by themselves. Derived analyzers come last: they read the others' results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import Field, PositiveInt, create_model, model_validator

from aaco.analyzers.activity import ActivityAnalyzer, ActivitySettings
from aaco.analyzers.base import Analyzer
from aaco.analyzers.bottleneck import BottleneckAnalyzer, BottleneckSettings
from aaco.analyzers.drift_analyzer import DriftAnalyzer, DriftSettings
from aaco.analyzers.families import FamiliesAnalyzer, FamiliesSettings
from aaco.analyzers.kar import KarAnalyzer, KarSettings
from aaco.analyzers.latency import LatencyAnalyzer, LatencySettings
from aaco.analyzers.launch import LaunchAnalyzer, LaunchSettings
from aaco.analyzers.sched import SchedAnalyzer, SchedSettings
from aaco.analyzers.telemetry import TelemetryAnalyzer, TelemetrySettings
from aaco.analyzers.throttle import ThrottleAnalyzer, ThrottleSettings
from aaco.contract.component import Registry
from aaco.contract.config_base import StrictModel


@dataclass(frozen=True)
class AgentHints:
    """What the agent derives from its sources' settings for the analyzers.

    ``smi_compat``: compatibility names per ``smi`` source name (sources that ask for them);
    ``smi_interval_s``: the slowest ``smi`` interval (1 s without one); ``sched_max_workloads``: the
    largest ``max_workloads`` of the ``sched`` sources (64 without one).
    """

    smi_compat: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    smi_interval_s: float = 1.0
    sched_max_workloads: int = 64


ANALYZERS = Registry[Analyzer]("analyzer")


def _latency(s: LatencySettings, hints: AgentHints, max_models: int) -> Analyzer:
    return LatencyAnalyzer(window=s.window, max_models=max_models)


def _kar(s: KarSettings, hints: AgentHints, max_models: int) -> Analyzer:
    return KarAnalyzer(max_models=max_models)


def _launch(s: LaunchSettings, hints: AgentHints, max_models: int) -> Analyzer:
    return LaunchAnalyzer(
        microkernel_threshold_us=s.microkernel_threshold_us,
        max_groups=max_models,
        max_runs=s.max_runs,
        runtime_outlier_us=s.runtime_outlier_us,
        delay_outlier_us=s.delay_outlier_us,
    )


def _activity(s: ActivitySettings, hints: AgentHints, max_models: int) -> Analyzer:
    return ActivityAnalyzer(max_windows=s.max_windows)


def _families(s: FamiliesSettings, hints: AgentHints, max_models: int) -> Analyzer:
    return FamiliesAnalyzer(max_models=max_models, max_names=s.max_names, top=s.top)


def _telemetry(s: TelemetrySettings, hints: AgentHints, max_models: int) -> Analyzer:
    """Series outlive ten samples of the slowest ``smi`` source; compatibility names as each asks."""
    stale = max(s.stale_after_s, 10 * hints.smi_interval_s)
    return TelemetryAnalyzer(max_series=s.max_series, stale_after_s=stale, compat=hints.smi_compat)


def _sched(s: SchedSettings, hints: AgentHints, max_models: int) -> Analyzer:
    return SchedAnalyzer(
        max_workloads=hints.sched_max_workloads, retain_s=s.retain_s, stale_s=s.stale_s, max_folded=s.max_folded
    )


def _drift(s: DriftSettings, hints: AgentHints, max_models: int) -> Analyzer:
    return DriftAnalyzer(
        detector=s.detector,
        detector_options=dict(s.detector_options),
        max_models=max_models,
        hold_s=s.hold_s,
        max_open_iterations=s.max_open_iterations,
    )


def _throttle(s: ThrottleSettings, hints: AgentHints, max_models: int) -> Analyzer:
    return ThrottleAnalyzer(settings=s, max_models=max_models)


def _bottleneck(s: BottleneckSettings, hints: AgentHints, max_models: int) -> Analyzer:
    return BottleneckAnalyzer(
        max_models=max_models,
        max_windows=s.max_windows,
        max_devices=s.max_devices,
        max_pids=s.max_pids,
        min_finding_confidence=s.min_finding_confidence,
    )


ANALYZERS.register("latency", LatencySettings, _latency)
ANALYZERS.register("kar", KarSettings, _kar)
ANALYZERS.register("launch", LaunchSettings, _launch)
ANALYZERS.register("activity", ActivitySettings, _activity)
ANALYZERS.register("families", FamiliesSettings, _families)
ANALYZERS.register("telemetry", TelemetrySettings, _telemetry)
ANALYZERS.register("sched", SchedSettings, _sched)
ANALYZERS.register("drift", DriftSettings, _drift)
ANALYZERS.register("throttle", ThrottleSettings, _throttle)
ANALYZERS.register("bottleneck", BottleneckSettings, _bottleneck)


def _summary(model: type) -> str:
    return (model.__doc__ or "").strip().splitlines()[0]


_SECTIONS = create_model(  # type: ignore[call-overload]
    "_AnalyzerSections",
    __base__=StrictModel,
    **{r.kind: (r.config, Field(default_factory=r.config, description=_summary(r.config))) for r in ANALYZERS},
)


class AnalyzersConfig(_SECTIONS):  # type: ignore[misc, valid-type]
    """Analyzer settings: one section per registered analyzer (``analyzers.<name>``), and the model bound."""

    max_models: PositiveInt = Field(256, description="Models tracked at once (bounds label sets).")

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, data: Any) -> Any:
        """A section left empty in the YAML (``kar:``) takes its defaults."""
        if isinstance(data, Mapping):
            return {k: ({} if v is None and k in ANALYZERS else v) for k, v in data.items()}
        return data


def build(config: AnalyzersConfig, hints: AgentHints) -> list[Analyzer]:
    """Every registered analyzer, configured, in pipeline order."""
    return [r.factory(getattr(config, r.kind), hints, config.max_models) for r in ANALYZERS]
