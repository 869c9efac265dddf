"""OTLP export settings: the config section, and its resolution with the standard environment variables.

Precedence per setting: a value set in AACO's configuration file (or by a command-line flag), then
the signal-specific ``OTEL_EXPORTER_OTLP_TRACES_*`` / ``..._METRICS_*`` variable, then the generic
``OTEL_EXPORTER_OTLP_*`` one, then the default. As in the OpenTelemetry specification, a generic
endpoint for HTTP gets ``/v1/traces`` (or ``/v1/metrics``) appended, a signal-specific one is used
as given, and ``OTEL_EXPORTER_OTLP_TIMEOUT`` is in milliseconds.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveFloat, PositiveInt

from aaco.contract.config_base import StrictModel
from aaco.contract.errors import AacoError
from aaco.contract.version import version
from aaco.exporters.context import ExporterSettings

Protocol = Literal["grpc", "http/protobuf"]


class TlsConfig(StrictModel):
    """TLS for an OTLP connection."""

    insecure: bool = Field(False, description="Plaintext (no TLS); implied by an http:// endpoint.")
    ca_file: Path | None = Field(None, description="CA bundle to verify the server (default: system roots).")
    cert_file: Path | None = Field(None, description="Client certificate (mutual TLS).")
    key_file: Path | None = Field(None, description="Client private key (mutual TLS).")


class OtlpConfig(ExporterSettings):
    """OTLP export of traces and metrics to a collector or backend."""

    section = "otlp"
    summary = "OTLP traces and metrics."

    endpoint: str | None = Field(
        None,
        description="e.g. http://collector:4317 (gRPC) or http://collector:4318 (HTTP); null: off, unless "
        "OTEL_EXPORTER_OTLP_ENDPOINT is set.",
    )
    protocol: Protocol = Field("grpc", description="OTLP transport: grpc or http/protobuf.")
    headers: dict[str, str] = Field(default_factory=dict, description="Extra headers, e.g. authentication.")
    compression: Literal["gzip", "none"] = Field("gzip", description="Payload compression.")
    timeout_s: PositiveFloat = Field(10.0, description="Per-request timeout.")
    tls: TlsConfig = Field(default_factory=TlsConfig, description="TLS settings.")
    queue_max_spans: PositiveInt = Field(200_000, description="Bound of the export queue; oldest dropped first.")
    max_spans_per_request: PositiveInt = Field(8192, description="Spans per export request.")
    metrics_interval_s: PositiveFloat = Field(10.0, description="How often metrics are exported over OTLP.")
    retry_max_elapsed_s: PositiveFloat = Field(120.0, description="Give up on a request after retrying this long.")
    retry_max_interval_s: PositiveFloat = Field(
        16.0,
        description="Longest wait between two tries of a failed request (the backoff doubles from 0.5 s up to it); "
        "it also caps the gRPC channel's reconnect backoff, so an upstream that comes back is used within it.",
    )
    max_kernel_spans_per_trace: PositiveInt = Field(
        2000, description="Kernel spans per trace; beyond it kernels are summarised on the iteration span."
    )
    max_spans_per_second: PositiveFloat = Field(
        50_000.0, description="Node-wide kernel span budget; beyond it kernels are summarised on their root span."
    )
    rate_clock: Literal["wall", "trace"] = Field(
        "wall",
        description="The clock of max_spans_per_second: wall, the agent's (a live node); trace, the kernels' own start "
        "times, so that a replay sends the same spans however fast the machine reads it (aaco replay sets it).",
    )
    trace_window_s: PositiveFloat = Field(
        2.0, description="How long a trace's root span waits for more kernels before it is sent with its summary."
    )
    memory_budget_mib: PositiveInt = Field(
        256,
        description="MiB of OTLP data the agent may hold (requests being received, application spans waiting for "
        "their links, export queues and requests being retried); beyond it the receiver refuses requests "
        "(HTTP 503, gRPC RESOURCE_EXHAUSTED) and the queues drop their oldest. Read at start; the chart derives "
        "the pod's memory limit from it.",
    )


@dataclass(frozen=True)
class OtlpTarget:
    """Fully resolved connection settings for one signal."""

    signal: str
    protocol: Protocol
    url: str  # http(s)://host:port[/path] for HTTP; host:port for gRPC
    secure: bool
    headers: dict[str, str] = field(default_factory=dict)
    compression: str = "gzip"
    timeout_s: float = 10.0
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    retry_max_interval_s: float = 16.0


def _env(env: Mapping[str, str], signal: str, name: str) -> tuple[str | None, bool]:
    """(value, signal_specific) of OTEL_EXPORTER_OTLP_<SIGNAL>_<NAME> or OTEL_EXPORTER_OTLP_<NAME>."""
    specific = env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_{name}")
    if specific:
        return specific, True
    generic = env.get(f"OTEL_EXPORTER_OTLP_{name}")
    return (generic or None), False


def parse_headers(text: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` with URL-encoded values (the OTEL_EXPORTER_OTLP_HEADERS format)."""
    out = {}
    for item in text.split(","):
        if not item.strip():
            continue
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise AacoError(f"bad header entry {item!r}", subject="OTEL_EXPORTER_OTLP_HEADERS", hint="use k=v,k2=v2")
        out[urllib.parse.unquote(k.strip()).lower()] = urllib.parse.unquote(v.strip())
    return out


def resolve(
    cfg: OtlpConfig,
    signal: Literal["traces", "metrics", "logs"],
    env: Mapping[str, str] | None = None,
    subject: str = "exporters.otlp",
) -> OtlpTarget | None:
    """The target for ``signal``, or None when export is off (no endpoint anywhere)."""
    env = os.environ if env is None else env
    given = cfg.model_fields_set
    endpoint, specific = (cfg.endpoint, True) if cfg.endpoint else _env(env, signal, "ENDPOINT")
    if not endpoint:
        return None
    protocol = cfg.protocol if "protocol" in given else (_env(env, signal, "PROTOCOL")[0] or cfg.protocol)
    if protocol not in ("grpc", "http/protobuf"):
        raise AacoError(f"unsupported OTLP protocol {protocol!r}", subject=subject, hint="grpc or http/protobuf")
    headers = dict(cfg.headers)
    if "headers" not in given and (h := _env(env, signal, "HEADERS")[0]):
        headers = parse_headers(h)
    compression = (
        cfg.compression if "compression" in given else (_env(env, signal, "COMPRESSION")[0] or cfg.compression)
    )
    if compression not in ("gzip", "none"):
        raise AacoError(f"unsupported OTLP compression {compression!r}", subject=subject, hint="gzip or none")
    timeout = cfg.timeout_s
    if "timeout_s" not in given and (t := _env(env, signal, "TIMEOUT")[0]):
        try:
            timeout = float(t) / 1000.0
        except ValueError as exc:
            raise AacoError(f"bad timeout {t!r} (milliseconds expected)", subject="OTEL_EXPORTER_OTLP_TIMEOUT") from exc
    tls = cfg.tls
    ca = tls.ca_file or _path(_env(env, signal, "CERTIFICATE")[0])
    cert = tls.cert_file or _path(_env(env, signal, "CLIENT_CERTIFICATE")[0])
    key = tls.key_file or _path(_env(env, signal, "CLIENT_KEY")[0])
    insecure = tls.insecure or (_env(env, signal, "INSECURE")[0] or "").lower() == "true"

    parsed = urllib.parse.urlparse(endpoint if "://" in endpoint else f"//{endpoint}")
    scheme = parsed.scheme.lower()
    if scheme not in ("", "http", "https"):
        raise AacoError(
            f"bad OTLP endpoint {endpoint!r}: scheme {scheme!r}",
            subject=subject,
            hint="use http://host:port or https://host:port",
        )
    try:
        port = parsed.port
    except ValueError as exc:
        raise AacoError(f"bad OTLP endpoint {endpoint!r}: {exc}", subject=subject) from exc
    if not parsed.hostname:
        raise AacoError(f"bad OTLP endpoint {endpoint!r}: no host", subject=subject, hint="e.g. http://collector:4317")
    secure = scheme == "https" or (scheme == "" and not insecure)  # http:// is plaintext, https:// TLS
    default_port = 4317 if protocol == "grpc" else 4318
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    hostport = f"{host}:{port or default_port}"
    if protocol == "grpc":
        url = hostport
    else:
        path = parsed.path or ""
        if not specific or not path or path == "/":
            path = path.rstrip("/") + f"/v1/{signal}"
        url = f"{'https' if secure else 'http'}://{hostport}{path}"
    for p in (ca, cert, key):
        if p is not None and not p.is_file():
            raise AacoError("TLS file not found", subject=p, hint=f"check {subject}.tls")
    if (cert is None) != (key is None):
        raise AacoError("a client certificate needs its key and the key its certificate", subject=f"{subject}.tls")
    return OtlpTarget(
        signal, protocol, url, secure, headers, compression, timeout, ca, cert, key, cfg.retry_max_interval_s
    )


def _path(v: str | None) -> Path | None:
    return Path(v) if v else None


def resource_attributes(node: str, env: Mapping[str, str] | None = None) -> dict[str, object]:
    """The agent's resource, with OpenTelemetry semantic-convention names.

    ``host.name`` is the node; the chart sets ``NODE_NAME``, ``POD_NAME`` and ``POD_NAMESPACE`` from the
    downward API (``k8s.*``); ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k2=v2``) adds or overrides any.
    """
    env = os.environ if env is None else env
    attrs: dict[str, object] = {
        "service.name": "aaco-agent",
        "service.version": version(),
        "host.name": node,
    }
    for key, var in (
        ("k8s.node.name", "NODE_NAME"),
        ("k8s.pod.name", "POD_NAME"),
        ("k8s.namespace.name", "POD_NAMESPACE"),
    ):
        if env.get(var):
            attrs[key] = env[var]
    extra = env.get("OTEL_RESOURCE_ATTRIBUTES", "")
    for item in extra.split(","):
        k, sep, v = item.partition("=")
        if sep and k.strip():
            attrs[urllib.parse.unquote(k.strip())] = urllib.parse.unquote(v.strip())
    return attrs
