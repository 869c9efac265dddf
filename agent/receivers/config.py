"""Configuration of the node's OTLP receiver (kept apart from the servers, which import gRPC)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt, conint

from aaco.agent.config_base import StrictModel

Port = conint(ge=0, le=65535)


class OtlpReceiverConfig(StrictModel):
    """The node's OTLP receiver, for applications' own spans, metrics and logs."""

    enabled: bool = Field(False, description="Accept OTLP from applications on this node (needs exporters.otlp).")
    address: str = Field("127.0.0.1", description="Bind address (the chart uses the node IP).")
    grpc_port: Port = Field(4317, description="OTLP/gRPC port (0 picks one).")  # type: ignore[valid-type]
    http_port: Port = Field(4318, description="OTLP/HTTP port (0 picks one).")  # type: ignore[valid-type]
    max_message_bytes: PositiveInt = Field(4 * 1024 * 1024, description="Largest request accepted (decompressed).")
    rate_limit_rps: PositiveFloat = Field(200.0, description="Requests per second allowed per client connection.")
    link_window_s: PositiveFloat = Field(5.0, description="How long spans wait for the other side of a link.")
    link_mode: Literal["links", "children"] = Field(
        "links", description="Link application spans and GPU iterations both ways, or make iterations children."
    )
