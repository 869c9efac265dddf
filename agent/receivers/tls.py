"""TLS for the OTLP receiver: the server credentials of both ports from ``receivers.otlp.tls``.

Every file is read once at start; one that is missing, unreadable or not what it should be is an
``AacoError`` naming the file and its setting. The HTTP port gets an ``ssl.SSLContext`` (TLS 1.2 or
later), the gRPC port ``grpc.ssl_server_credentials``; with ``client_ca_file`` both require a client
certificate signed by it.
"""

from __future__ import annotations

import ssl
from pathlib import Path

import grpc

from aaco.agent.receivers.config import ReceiverTlsConfig
from aaco.contract.errors import AacoError
from aaco.contract.tls import server_context

SETTING = "receivers.otlp.tls"


def _read(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise AacoError(
            f"cannot read {SETTING}.{key} {path}: {exc.strerror or exc}",
            subject=path,
            hint=f"point {SETTING}.{key} at a readable PEM file (mounted from a Secret in Kubernetes)",
        ) from exc


def http_context(tls: ReceiverTlsConfig) -> ssl.SSLContext:
    """The server context of the HTTP port (client certificates required when a client CA is set)."""
    return server_context(
        tls.cert_file,
        tls.key_file,
        tls.client_ca_file,
        setting=SETTING,
        hint=f"point {SETTING} at readable PEM files (mounted from a Secret in Kubernetes)",
    )


def grpc_credentials(tls: ReceiverTlsConfig) -> grpc.ServerCredentials:
    """The server credentials of the gRPC port (client certificates required when a client CA is set)."""
    cert = _read(tls.cert_file, "cert_file")
    key = _read(tls.key_file, "key_file")
    ca = _read(tls.client_ca_file, "client_ca_file") if tls.client_ca_file is not None else None
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)
