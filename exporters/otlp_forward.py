"""The queues that forward what applications sent the node's receiver (metrics, logs) upstream as received."""

from __future__ import annotations

from typing import Literal

from aaco.contract.budget import ByteBudget
from aaco.contract.stats import Stats
from aaco.exporters.otlp_sender import OtlpSender
from aaco.exporters.otlp_settings import OtlpConfig, resolve
from aaco.exporters.otlp_traces import rejected_spans


def forwarder(
    config: OtlpConfig, signal: Literal["metrics", "logs"], stats: Stats, budget: ByteBudget
) -> OtlpSender | None:
    """A bounded, retrying queue to ``signal``'s endpoint (component ``forward:<signal>``), not started; None: none."""
    target = resolve(config, signal)
    if target is None:
        return None
    return OtlpSender(
        target,
        stats,
        f"forward:{signal}",
        config.queue_max_spans,
        config.retry_max_elapsed_s,
        rejected_spans,
        budget=budget,
    )
