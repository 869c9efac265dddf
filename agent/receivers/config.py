"""Configuration of the node's OTLP receiver (kept apart from the servers, which import gRPC)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field, PositiveFloat, PositiveInt, conint

from aaco.contract.config_base import StrictModel

Port = conint(ge=0, le=65535)


class ReceiverTlsConfig(StrictModel):
    """TLS for both OTLP ports (gRPC and HTTP); TLS 1.2 or later."""

    cert_file: Path = Field(description="PEM certificate chain the receiver presents (server certificate first).")
    key_file: Path = Field(description="PEM private key of cert_file.")
    client_ca_file: Path | None = Field(
        None, description="PEM CA bundle: when set, clients must present a certificate signed by it (mutual TLS)."
    )


class ItemLimitsConfig(StrictModel):
    """How much one span or log record may carry (the OpenTelemetry SDKs' count limits, 128 by default).

    Beyond a limit the rest is dropped, the item's dropped_*_count raised, and counted.
    """

    attributes_per_span: PositiveInt = Field(128, description="Attributes of a span (OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT).")
    events_per_span: PositiveInt = Field(128, description="Events of a span (OTEL_SPAN_EVENT_COUNT_LIMIT).")
    links_per_span: PositiveInt = Field(128, description="Links of a span (OTEL_SPAN_LINK_COUNT_LIMIT).")
    attributes_per_event: PositiveInt = Field(128, description="Attributes of a span event.")
    attributes_per_link: PositiveInt = Field(128, description="Attributes of a span link.")
    attributes_per_log_record: PositiveInt = Field(128, description="Attributes of a log record.")


class OtlpReceiverConfig(StrictModel):
    """The node's OTLP receiver, for applications' own spans, metrics and logs."""

    section: ClassVar[str] = "otlp"  # its key under receivers:
    summary: ClassVar[str] = "OTLP receiver."

    enabled: bool = Field(
        False,
        description="Accept OTLP from applications on this node (forwarded to exporters.otlp when set).",
    )
    address: str = Field("127.0.0.1", description="Bind address (the chart uses the node IP).")
    grpc_port: Port = Field(4317, description="OTLP/gRPC port (0 picks one).")  # type: ignore[valid-type]
    http_port: Port = Field(4318, description="OTLP/HTTP port (0 picks one).")  # type: ignore[valid-type]
    max_message_bytes: PositiveInt = Field(4 * 1024 * 1024, description="Largest request accepted (decompressed).")
    rate_limit_rps: PositiveFloat = Field(200.0, description="Requests per second allowed per client connection.")
    link_window_s: PositiveFloat = Field(5.0, description="How long spans wait for the other side of a link.")
    link_mode: Literal["links", "children"] = Field(
        "links", description="Link application spans and GPU iterations both ways, or make iterations children."
    )
    tls: ReceiverTlsConfig | None = Field(None, description="TLS for both ports (null: plaintext).")
    max_connections: PositiveInt = Field(
        1024,
        description="Open connections allowed per port (HTTP: the oldest idle one is closed to make room, or, when "
        "every one is at work, the new one refused; gRPC: the core refuses them).",
    )
    max_connections_per_peer: PositiveInt = Field(
        256,
        description="Open HTTP connections from one address at most. At this bound or max_connections, the oldest "
        "connection holding no request in work is closed to make room (counted evicted).",
    )
    max_workers: PositiveInt = Field(
        4, description="Threads that parse and forward requests, per port (connections wait without a thread)."
    )
    read_timeout_s: PositiveFloat = Field(
        30.0, description="Time allowed to receive one whole request (TLS handshake, headers and body) once begun."
    )
    idle_timeout_s: PositiveFloat = Field(
        60.0, description="How long a kept-alive connection may wait idle for its next request before it is closed."
    )
    backlog: PositiveInt = Field(1024, description="Listen backlog of the HTTP port (connections not yet accepted).")
    limits: ItemLimitsConfig = Field(default_factory=ItemLimitsConfig, description="What one item may carry.")
