"""The TLS ports' shared pieces: a server ``ssl.SSLContext`` from PEM files, and the answer to plain HTTP.

Shared by two layers: ``/metrics`` (the exporters' web-config file, ``tls_server_config``) and the
node's OTLP receiver (``receivers.otlp.tls``). A client that sends plain HTTP to a TLS port would
otherwise see its connection closed without a word (the handshake fails on its request line); as
Go's net/http does ("Client sent an HTTP request to an HTTPS server."), each server peeks at a
connection's first bytes (``MSG_PEEK``, nothing consumed) before the handshake and, when they start
like an HTTP request rather than a TLS record (content type 0x16), answers ``plaintext_answer``'s 400
naming the https URL, and closes.
"""

from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path
from typing import Final

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


# OpenSSL's reasons for a handshake that failed on the client's certificate (none given, or not verified).
CLIENT_CERT_REASONS: Final = frozenset(
    {"PEER_DID_NOT_RETURN_A_CERTIFICATE", "CERTIFICATE_VERIFY_FAILED", "TLSV13_ALERT_CERTIFICATE_REQUIRED"}
)
PEEK_BYTES: Final = 1024  # how much of a connection's start is peeked at for the request line and Host
# An HTTP request starts with an upper-case method and a space (a TLS record with 0x14 to 0x18): what has
# arrived may be a prefix of that ("GE" alone is plain HTTP too).
_PLAIN_HTTP: Final = re.compile(rb"[A-Z]{1,16}(?: |\Z)")
_TARGET: Final = re.compile(rb"[A-Z]+ (/[!-~]{0,200})")
_HOST: Final = re.compile(rb"\r\nHost:[ \t]*([A-Za-z0-9.:\[\]-]{1,300})[ \t]*\r\n", re.IGNORECASE)


def plaintext_answer(peeked: bytes, local: tuple[str, int] | tuple[str, int, int, int]) -> bytes | None:
    """The whole ``400 Bad Request`` for a plain HTTP request sent to a TLS port, or None when ``peeked`` is not one.

    ``peeked`` is the connection's first bytes (read with ``MSG_PEEK``), ``local`` the address the client
    reached (``getsockname()``), used when the request names no Host.
    """
    if not _PLAIN_HTTP.match(peeked):
        return None
    host = _HOST.search(peeked)
    if host is not None:
        authority = host.group(1).decode("ascii")
    else:
        address = local[0]
        authority = f"[{address}]:{local[1]}" if ":" in address else f"{address}:{local[1]}"
    target = _TARGET.match(peeked)
    path = target.group(1).decode("ascii") if target is not None else "/"
    body = f"Client sent an HTTP request to an HTTPS server: this port speaks TLS; use https://{authority}{path}\n"
    head = (
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return (head + body).encode("ascii")


def peek(sock: socket.socket) -> bytes:
    """A connection's first bytes, left unread for the TLS handshake (blocks as the socket's timeout says)."""
    return sock.recv(PEEK_BYTES, socket.MSG_PEEK)
