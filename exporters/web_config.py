"""TLS and basic auth for ``/metrics``: a Prometheus web-config file, as node-exporter takes ``--web.config.file``.

The file is exporter-toolkit's format (``tls_server_config``, ``basic_auth_users`` with bcrypt hashes,
``http_server_config.headers``); relative paths in it are relative to the file's own folder. Unknown keys
are errors naming the file and the key, as exporter-toolkit's strict YAML reading makes them.

exporter-toolkit reads the file on every request so that a rotated certificate is picked up at once;
:class:`WebConfigWatcher` does the same more cheaply: it stats the file and the certificate, key and CA
files it names, and reads them again only when one of them changed (a Kubernetes Secret update swaps all
of them). A change that does not load leaves the server failing closed (500 on every guarded request,
counted) until the file is fixed; the TLS layer keeps the last certificate that loaded.

What Python's ``ssl`` cannot do as Go's ``crypto/tls`` does: ``RequestClientCert`` requests no certificate
(nothing here would use an unverified one, as with exporter-toolkit), ``RequireAnyClientCert`` verifies the
certificate it requires (against ``client_ca_file``, which it then needs), ``cipher_suites`` and
``curve_preferences`` (Go names) are left to OpenSSL's defaults with a warning. TLS below 1.2 is refused.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from aaco.contract.config_base import StrictModel
from aaco.contract.errors import AacoError
from aaco.contract.signals import define
from aaco.contract.stats import Stats
from aaco.contract.tls import server_context
from aaco.exporters.basic_auth import BasicAuth

log = logging.getLogger("aaco.exporters.web_config")

WEB_CONFIG_RELOADS = define(
    "aaco.metrics_server.web_config.reloads",
    "aaco_metrics_server_web_config_reloads",
    "counter",
    "{reload}",
    "Times the /metrics web-config file (or a certificate, key or CA file it names) changed and was read "
    "again, by result (ok; error: the server refuses guarded requests with 500 until the file is fixed).",
    ("result",),
)

ClientAuth = Literal[
    "NoClientCert",
    "RequestClientCert",
    "RequireAnyClientCert",
    "RequireClientCert",  # exporter-toolkit's older name for RequireAnyClientCert
    "VerifyClientCertIfGiven",
    "RequireAndVerifyClientCert",
]
TlsVersionName = Literal["TLS12", "TLS13"]  # exporter-toolkit also knows TLS10 and TLS11; this agent refuses them
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
VERIFYING = ("RequireAnyClientCert", "RequireClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
REQUIRING = ("RequireAnyClientCert", "RequireClientCert", "RequireAndVerifyClientCert")
# exporter-toolkit's extraHTTPHeaders: the headers that may be set, and the values allowed where it fixes them.
EXTRA_HEADERS: dict[str, tuple[str, ...]] = {
    "Strict-Transport-Security": (),
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": (),
    "Content-Security-Policy": (),
}
BCRYPT_PREFIXES = (b"$2a$", b"$2b$", b"$2y$")


class TlsServerConfig(StrictModel):
    """``tls_server_config``: the server certificate and the client certificate policy."""

    cert_file: Path | None = None
    key_file: Path | None = None
    client_auth_type: ClientAuth = "NoClientCert"
    client_ca_file: Path | None = None
    client_allowed_sans: list[str] = Field(default_factory=list)
    min_version: TlsVersionName = "TLS12"
    max_version: TlsVersionName = "TLS13"
    cipher_suites: list[str] = Field(default_factory=list)
    curve_preferences: list[str] = Field(default_factory=list)
    prefer_server_cipher_suites: bool = True

    @model_validator(mode="after")
    def _consistent(self) -> TlsServerConfig:
        if self.cert_file is None or self.key_file is None:
            raise ValueError("cert_file and key_file are both needed to serve TLS")
        if self.client_ca_file is not None and self.client_auth_type == "NoClientCert":
            raise ValueError(
                "client_ca_file is set but client_auth_type is NoClientCert (set RequireAndVerifyClientCert)"
            )
        if self.client_auth_type in VERIFYING and self.client_ca_file is None:
            raise ValueError(f"client_auth_type {self.client_auth_type} needs client_ca_file (the CA to verify with)")
        if self.client_allowed_sans and self.client_auth_type not in REQUIRING:
            raise ValueError("client_allowed_sans needs client_auth_type RequireAndVerifyClientCert")
        if TLS_VERSIONS[self.min_version] > TLS_VERSIONS[self.max_version]:
            raise ValueError(f"min_version {self.min_version} is above max_version {self.max_version}")
        return self


class HttpServerConfig(StrictModel):
    """``http_server_config``: extra response headers (HTTP/2 is not served; ``http2`` is accepted)."""

    http2: bool = True
    headers: dict[str, str] = Field(default_factory=dict)

    @field_validator("headers")
    @classmethod
    def _known_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        for name, value in headers.items():
            if name not in EXTRA_HEADERS:
                raise ValueError(f"HTTP header {name!r} can not be configured (allowed: {', '.join(EXTRA_HEADERS)})")
            if EXTRA_HEADERS[name] and value not in EXTRA_HEADERS[name]:
                raise ValueError(f"invalid value for {name}: {value!r} (expected one of {list(EXTRA_HEADERS[name])})")
        return headers


class WebConfig(StrictModel):
    """A Prometheus web-config file."""

    tls_server_config: TlsServerConfig | None = None
    http_server_config: HttpServerConfig = Field(default_factory=HttpServerConfig)
    basic_auth_users: dict[str, str] = Field(default_factory=dict)

    @field_validator("basic_auth_users")
    @classmethod
    def _bcrypt_hashes(cls, users: dict[str, str]) -> dict[str, str]:
        for user, hashed in users.items():
            raw = hashed.encode()
            if not raw.startswith(BCRYPT_PREFIXES) or len(raw) != 60:
                raise ValueError(
                    f"user {user!r}: not a bcrypt hash (make one with: htpasswd -nBC 10 '' | tr -d ':\\n')"
                )
        return users


def _joined(base: Path, path: Path | None) -> Path | None:
    """``path`` relative to the web-config file's folder, as exporter-toolkit's SetDirectory does."""
    return None if path is None else base / path


def load(path: Path) -> WebConfig:
    """Read and validate a web-config file; every problem is an AacoError naming the file and the key."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AacoError(
            f"cannot read the web-config file: {exc.strerror or exc}",
            subject=path,
            hint="exporters.prometheus.web_config_file / --web-config-file",
        ) from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise AacoError(f"not valid YAML: {exc}", subject=path, hint="see docs/web-config examples") from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise AacoError("a web-config file is a YAML mapping", subject=path)
    try:
        config = WebConfig.model_validate(doc)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top)"
            what = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {what}")
        raise AacoError(
            "; ".join(problems), subject=path, hint="the Prometheus web-config format (exporter-toolkit)"
        ) from exc
    tls = config.tls_server_config
    if tls is not None:
        base = path.parent
        tls = tls.model_copy(
            update={
                "cert_file": _joined(base, tls.cert_file),
                "key_file": _joined(base, tls.key_file),
                "client_ca_file": _joined(base, tls.client_ca_file),
            }
        )
        config = config.model_copy(update={"tls_server_config": tls})
    return config


def ssl_context(tls: TlsServerConfig, source: Path) -> ssl.SSLContext:
    """The SSLContext ``tls_server_config`` describes (TLS 1.2 at least; client certificates per client_auth_type)."""
    assert tls.cert_file is not None and tls.key_file is not None  # the model requires both
    verifying = tls.client_auth_type in VERIFYING
    assert not verifying or tls.client_ca_file is not None  # the model requires it
    ctx = server_context(
        tls.cert_file,
        tls.key_file,
        tls.client_ca_file if verifying else None,
        setting="tls_server_config",
        hint=f"in {source}; a relative path is relative to that file's folder",
        verify_mode=ssl.CERT_REQUIRED if tls.client_auth_type in REQUIRING else ssl.CERT_OPTIONAL,
        minimum=TLS_VERSIONS[tls.min_version],
        maximum=TLS_VERSIONS[tls.max_version],
    )
    if tls.prefer_server_cipher_suites:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    for key in ("cipher_suites", "curve_preferences"):
        if getattr(tls, key):
            log.warning("%s: tls_server_config.%s is ignored (Go names; OpenSSL's defaults are used)", source, key)
    if tls.client_auth_type in ("RequireAnyClientCert", "RequireClientCert"):
        log.warning(
            "%s: client_auth_type %s: client certificates are verified against client_ca_file here",
            source,
            tls.client_auth_type,
        )
    return ctx


def allowed_san(cert: dict[str, object], allowed: list[str]) -> bool:
    """Whether a verified peer certificate (``SSLSocket.getpeercert()``) has one of ``allowed`` among its SANs."""
    names = cert.get("subjectAltName") or ()
    wanted = {_canonical(a) for a in allowed}
    return any(_canonical(str(value)) in wanted for _, value in names)  # type: ignore[attr-defined]


def _canonical(name: str) -> str:
    """IP addresses compared as addresses (OpenSSL writes IPv6 uncompressed and in capitals)."""
    try:
        return str(ipaddress.ip_address(name.strip()))
    except ValueError:
        return name


@dataclass(frozen=True)
class WebState:
    """What one version of the web-config file says, ready to serve; ``error`` set while a change fails to load."""

    config: WebConfig
    context: ssl.SSLContext | None
    headers: list[tuple[str, str]] = field(default_factory=list)
    error: str | None = None

    @property
    def users(self) -> dict[str, str]:
        """``basic_auth_users`` (empty: no basic auth)."""
        return self.config.basic_auth_users


Signature = tuple[tuple[int, int, int, int] | None, ...]


class WebConfigWatcher:
    """The web-config file as it is now: read at start (errors raised), read again when it or its files change."""

    def __init__(self, path: Path, stats: Stats) -> None:
        self.path = path
        self.stats = stats
        self.auth = BasicAuth()
        self._lock = threading.Lock()
        self._state = self._load()
        self._signature = self._stat(self._state.config)
        self.tls = self._state.context is not None

    def _load(self) -> WebState:
        config = load(self.path)
        tls = config.tls_server_config
        context = ssl_context(tls, self.path) if tls is not None else None
        return WebState(config, context, list(config.http_server_config.headers.items()))

    def _stat(self, config: WebConfig) -> Signature:
        tls = config.tls_server_config
        files = [self.path]
        if tls is not None:
            files += [p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p is not None]
        out: list[tuple[int, int, int, int] | None] = []
        for f in files:
            try:
                st = os.stat(f)
                out.append((st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    def current(self) -> WebState:
        """The state to serve now (a few stats; the files are read again only when one changed)."""
        signature = self._stat(self._state.config)
        if signature == self._signature:
            return self._state
        with self._lock:
            if self._stat(self._state.config) != self._signature:
                self._reload()
            return self._state

    def _reload(self) -> None:
        last = self._state
        try:
            state = self._load()
            if (state.context is not None) != self.tls:
                raise AacoError(
                    "tls_server_config was added or removed: TLS is turned on or off at start only",
                    subject=self.path,
                    hint="restart the agent",
                )
        except AacoError as exc:
            if last.error != str(exc):
                log.error("web-config change not loaded, guarded requests refused with 500 until fixed: %s", exc)
            self.stats.inc(WEB_CONFIG_RELOADS, result="error")
            self._state = replace(last, error=str(exc))
            self._signature = self._stat(last.config)
            return
        log.info("%s: web-config file read again (changed)", self.path)
        self.stats.inc(WEB_CONFIG_RELOADS, result="ok")
        self._state = state
        self._signature = self._stat(state.config)
