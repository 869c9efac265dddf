"""Every analyzer of the agent: its name, its settings model and its factory, in pipeline order.

Adding an analyzer is one module (the analyzer and its ``StrictModel`` settings) and one
``ANALYZERS.register`` line here; its settings appear in the YAML under ``analyzers.<name>`` and in
``aaco config example`` by themselves. Derived analyzers come last: they read the others' results.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, PositiveInt, create_model, model_validator

from aaco.analyzers import (
    activity,
    bottleneck,
    drift_analyzer,
    families,
    health,
    jobs,
    kar,
    latency,
    launch,
    roofline,
    sched,
    serving,
    serving_phases,
    telemetry,
    throttle,
    workloads,
)
from aaco.analyzers.base import AgentHints, Analyzer
from aaco.contract.component import Registry
from aaco.contract.config_base import StrictModel

ANALYZERS = Registry[Analyzer]("analyzer")


ANALYZERS.register("latency", latency.LatencySettings, latency.create)
ANALYZERS.register("serving", serving.ServingSettings, serving.create)
ANALYZERS.register("kar", kar.KarSettings, kar.create)
ANALYZERS.register("launch", launch.LaunchSettings, launch.create)
ANALYZERS.register("activity", activity.ActivitySettings, activity.create)
ANALYZERS.register("jobs", jobs.JobsSettings, jobs.create)
ANALYZERS.register("families", families.FamiliesSettings, families.create)
ANALYZERS.register("serving_phases", serving_phases.ServingPhasesSettings, serving_phases.create)
ANALYZERS.register("telemetry", telemetry.TelemetrySettings, telemetry.create)
ANALYZERS.register("sched", sched.SchedSettings, sched.create)
ANALYZERS.register("drift", drift_analyzer.DriftSettings, drift_analyzer.create)
ANALYZERS.register("throttle", throttle.ThrottleSettings, throttle.create)
ANALYZERS.register("health", health.HealthSettings, health.create)
ANALYZERS.register("workloads", workloads.WorkloadsSettings, workloads.create)
ANALYZERS.register("roofline", roofline.RooflineSettings, roofline.create)
ANALYZERS.register("bottleneck", bottleneck.BottleneckSettings, bottleneck.create)


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
