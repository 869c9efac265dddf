"""The throttle analyzer's settings (``analyzers.throttle`` in the YAML) and the vocabulary it shares."""

from __future__ import annotations

from typing import Final

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt

from aaco.contract import telemetry as m
from aaco.contract.config_base import StrictModel

POWER_LIMIT: Final = m.POWER_LIMIT  # W: the enforced cap, where the source knows it
TEMPERATURE_LIMIT: Final = "aaco.gpu.temperature.limit"  # Cel, attribute sensor; no source publishes it yet
REASONS: Final = m.THROTTLE_REASONS  # power, thermal, current, other
# Edge: the A100's slowdown threshold; junction: MI200 / MI300 hotspot throttling; memory: HBM.
DEFAULT_TEMPERATURE_LIMITS_C: Final[dict[str, float]] = {"edge": 89.0, "junction": 105.0, "memory": 95.0}


class ThrottleSettings(StrictModel):
    """Throttling episodes per GPU and their iteration latency impact (docs/throttle.md)."""

    load_threshold: float = Field(0.5, ge=0.0, le=1.0, description="Utilisation from which a GPU is under load.")
    clock_ratio: float = Field(
        0.9, gt=0.0, le=1.0, description="Power throttling: the clock is below this share of its maximum."
    )
    power_margin: float = Field(
        0.05, ge=0.0, lt=1.0, description="Power throttling: power is within this share of the cap."
    )
    power_cap_w: PositiveFloat | None = Field(
        None, description="The power cap where the GPU's source does not publish its enforced limit."
    )
    temperature_limits_c: dict[str, float] = Field(
        default_factory=lambda: dict(DEFAULT_TEMPERATURE_LIMITS_C),
        description="Temperature limit per sensor where the GPU does not publish one (Celsius).",
    )
    temperature_margin_c: NonNegativeFloat = Field(
        5.0, description="Thermal throttling: a sensor is within this of its limit (Celsius)."
    )
    stale_s: PositiveFloat = Field(
        60.0, description="Readings older than this are not used; a GPU silent this long ends its episodes."
    )
    max_devices: PositiveInt = Field(256, description="GPUs tracked at once.")
    max_episodes: PositiveInt = Field(256, description="Ended episodes kept per GPU.")
    max_pending: PositiveInt = Field(10_000, description="Iterations waiting for telemetry to cover their end.")
    reservoir: PositiveInt = Field(2048, description="Latencies sampled per model, inside and outside episodes.")
    bootstrap: PositiveInt = Field(1000, description="Bootstrap draws of the latency impact's 95 % interval.")
    min_samples: PositiveInt = Field(20, description="Iterations each side needs before an impact is significant.")
    seed: NonNegativeInt = Field(
        0, description="Seed of the reservoir sampling and the bootstrap (reproducible results)."
    )
