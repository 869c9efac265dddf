"""A server ``ssl.SSLContext`` from PEM files, with the file at fault named in every error.

Shared by two layers: ``/metrics`` (the exporters' web-config file, ``tls_server_config``) and the
node's OTLP receiver (``receivers.otlp.tls``).
"""

from __future__ import annotations

import ssl
from pathlib import Path

from aaco.contract.errors import AacoError


def server_context(
    cert_file: Path,
    key_file: Path,
    ca_file: Path | None,
    *,
    setting: str,
    hint: str,
    verify_mode: ssl.VerifyMode = ssl.CERT_REQUIRED,
    minimum: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2,
    maximum: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED,
) -> ssl.SSLContext:
    """A server SSLContext from PEM files; with ``ca_file``, client certificates are checked (``verify_mode``).

    Shared by ``/metrics`` (``setting`` ``tls_server_config``) and the OTLP receiver (``receivers.otlp.tls``):
    a file that is missing, unreadable or not PEM is an ``AacoError`` naming it and ``setting.<key>``.
    """
    for key, path in (("cert_file", cert_file), ("key_file", key_file), ("client_ca_file", ca_file)):
        if path is None:
            continue
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise AacoError(
                f"cannot read the file {setting}.{key} names: {exc.strerror or exc}", subject=path, hint=hint
            ) from exc
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = minimum
    ctx.maximum_version = maximum
    try:
        ctx.load_cert_chain(cert_file, key_file)
    except ssl.SSLError as exc:
        raise AacoError(
            f"not a PEM certificate with its key {key_file} ({exc.reason or exc})",
            subject=cert_file,
            hint=f"{setting}.cert_file and key_file; {hint}",
        ) from exc
    if ca_file is not None:
        try:
            ctx.load_verify_locations(cafile=ca_file)
        except ssl.SSLError as exc:
            raise AacoError(
                f"no PEM CA certificate in it ({exc.reason or exc})",
                subject=ca_file,
                hint=f"{setting}.client_ca_file; {hint}",
            ) from exc
        ctx.verify_mode = verify_mode
    return ctx
