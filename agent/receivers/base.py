"""What a receiver hands its data to, and the one object its factory is built from.

A receiver knows nothing of the exporters: the agent (the composition root) passes it sinks that
satisfy these protocols (the trace exporter for spans, the exporters' forwarding queues for metrics
and logs, the agent's bus for the rows it reads out of spans).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from aaco.contract.budget import ByteBudget
from aaco.contract.channel import BatchQueue
from aaco.contract.stats import Stats


@runtime_checkable
class SpanSink(Protocol):
    """Takes the spans applications sent (an ``ExportTraceServiceRequest``) on their way upstream."""

    def accept_spans(self, request: Any, spans: int, nbytes: int = 0) -> None:
        """``request`` holds ``spans`` spans and was ``nbytes`` long on the wire (0: unknown)."""


class Forwarder(Protocol):
    """A bounded queue of serialised export requests going upstream."""

    def enqueue(self, payload: bytes, n: int) -> None:
        """Queue one request of ``n`` items (dropping, counted, when full)."""


@dataclass(frozen=True)
class ReceiverContext:
    """Everything a receiver's factory takes besides its own settings."""

    stats: Stats
    budget: ByteBudget | None = None  # the agent's one budget for OTLP data (None: the receiver's own)
    node_attributes: Mapping[str, object] = field(default_factory=dict)
    traces: SpanSink | None = None
    forward: Callable[[str], Forwarder | None] = lambda _signal: None  # a signal's queue upstream, made when asked
    bus: BatchQueue | None = None  # where rows read from what is received go (LLM request spans: ``requests``)
    node: str = ""  # the node the rows are stamped with
