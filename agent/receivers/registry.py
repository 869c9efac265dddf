"""Every receiver, by name: its settings model (one key of ``receivers:``) and its factory.

A factory takes the receiver's settings and a ``ReceiverContext`` and returns the receiver, or None
when its settings leave it off. The servers (gRPC) are imported only when one is built.
"""

from __future__ import annotations

from aaco.agent.receivers.base import ReceiverContext
from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.contract.component import Component, Registry

RECEIVERS = Registry[Component | None]("receiver")


def _otlp(config: OtlpReceiverConfig, ctx: ReceiverContext) -> Component | None:
    if not config.enabled:  # off: gRPC and the OTLP protobufs are not imported
        return None
    from aaco.agent.receivers.otlp import OtlpReceiver

    return OtlpReceiver.from_config(config, ctx)


RECEIVERS.register("otlp", OtlpReceiverConfig, _otlp)
