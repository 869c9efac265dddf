"""Where a lake lives: a local directory or an object store, named by a URL, opened as a pyarrow filesystem.

``s3://bucket/prefix``, ``gs://bucket/prefix``, ``abfs://container@account.dfs.core.windows.net/prefix``
(pyarrow's own filesystems, so no extra client library), ``file:///dir`` or a plain path. S3 takes
its connection from the standard settings: ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``) for a
store other than AWS (SeaweedFS, MinIO, Ceph), ``AWS_REGION`` (or ``AWS_DEFAULT_REGION``), and the
credentials by the AWS SDK's own chain (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, profiles,
IRSA, instance roles). ``StoreOptions`` overrides the endpoint and region from the configuration.
pyarrow reads some of these itself in some versions only; they are read here so that every version
behaves the same.
"""

from __future__ import annotations

import os
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

from aaco.contract.errors import AacoError

REMOTE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss")
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")


_AWS_CODE = re.compile(r"AWS Error ([A-Z_]+)")
_UNREACHABLE = ("NETWORK_CONNECTION", "Could not connect", "Couldn't resolve", "Connection refused")
_REFUSED = ("ACCESS_DENIED", "INVALID_ACCESS_KEY_ID", "SIGNATURE_DOES_NOT_MATCH", "EXPIRED_TOKEN", "UNAUTHORIZED")
UNREACHABLE_HINT = "check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and that the store is up"
CREDENTIALS_HINT = "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or the node's role, and the bucket's policy"


class StoreError(AacoError):
    """A lake URL that names no store this agent can reach, or a store that cannot be opened."""


def explain(exc: Exception) -> tuple[str, str]:
    """What a store's failure means, and the fix: (``cannot reach the store (NETWORK_CONNECTION)``, hint).

    pyarrow's messages carry the AWS SDK's error code; an unknown failure is given as it was said.
    """
    text = str(exc)
    found = _AWS_CODE.search(text)
    code = f" ({found.group(1)})" if found else ""
    if any(s in text for s in _UNREACHABLE):
        return (
            f"cannot reach the store{code}",
            "check AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3) and that the store is up",
        )
    if any(s in text for s in _REFUSED):
        return f"the store refused the credentials{code}", CREDENTIALS_HINT
    return text, "check the URL and the store's settings"


@dataclass(frozen=True)
class StoreOptions:
    """What the configuration says about the connection (None: the standard environment variables)."""

    endpoint_url: str | None = None
    region: str | None = None
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 30.0  # a stall limit: a request that moves no byte for this long fails
    max_attempts: int = 3  # the SDK's own retries of a request (a caller with its own backoff asks for 1)


@dataclass(frozen=True)
class Store:
    """An opened lake location: the filesystem and the base path inside it (no trailing slash)."""

    url: str
    fs: pafs.FileSystem
    base: str

    def key(self, relative: str) -> str:
        """The full path in the store of ``relative`` (a path inside the lake, ``/``-separated)."""
        return f"{self.base}/{relative}" if self.base else relative

    @property
    def remote(self) -> bool:
        """True for an object store, False for a local directory."""
        return not isinstance(self.fs, pafs.LocalFileSystem)


def scheme(url: str) -> str | None:
    """The URL's scheme in lower case (``s3``), or None for a plain path."""
    found = _URL.match(url)
    return found.group(1).lower() if found else None


def is_remote(url: str) -> bool:
    """True when ``url`` names an object store (any scheme other than ``file``)."""
    s = scheme(url)
    return s is not None and s != "file"


def local_path(url: str) -> Path:
    """The directory a plain path or ``file://`` URL names."""
    if scheme(url) == "file":
        return Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))
    return Path(url)


def check_url(url: str) -> str:
    """``url`` when it names a location this agent can write to; a ``StoreError`` naming the fix otherwise."""
    s = scheme(url)
    if s is None or s == "file" or s in REMOTE_SCHEMES:
        if s in REMOTE_SCHEMES and not urllib.parse.urlsplit(url).netloc:
            raise StoreError(f"{url}: no bucket in the URL", hint=f"write {s}://BUCKET/PREFIX")
        return url
    raise StoreError(
        f"{url}: {s}:// is not a lake location",
        hint="use a local path, file://DIR, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or abfs://CONTAINER@ACCOUNT/PREFIX",
    )


def _s3(url: str, options: StoreOptions, env: Mapping[str, str]) -> tuple[pafs.FileSystem, str]:
    parts = urllib.parse.urlsplit(url)
    endpoint = options.endpoint_url or env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
    region = options.region or env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    kwargs: dict[str, object] = {
        "connect_timeout": options.connect_timeout_s,
        "request_timeout": options.request_timeout_s,
        "retry_strategy": pafs.AwsStandardS3RetryStrategy(max_attempts=options.max_attempts),
    }
    if endpoint:
        ep = urllib.parse.urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = ep.netloc
        kwargs["scheme"] = ep.scheme or "https"
        kwargs["force_virtual_addressing"] = False
    if region:
        kwargs["region"] = region
    elif endpoint:
        kwargs["region"] = "us-east-1"  # a store of its own has no region; spare the SDK a lookup that cannot answer
    if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
        kwargs["access_key"] = env["AWS_ACCESS_KEY_ID"]
        kwargs["secret_key"] = env["AWS_SECRET_ACCESS_KEY"]
        if env.get("AWS_SESSION_TOKEN"):
            kwargs["session_token"] = env["AWS_SESSION_TOKEN"]
    fs = pafs.S3FileSystem(**kwargs)  # type: ignore[arg-type]
    return fs, f"{parts.netloc}{parts.path}".rstrip("/")


def open_store(url: str, options: StoreOptions | None = None, env: Mapping[str, str] | None = None) -> Store:
    """The filesystem and base path ``url`` names; a ``StoreError`` naming the URL when it cannot be opened."""
    check_url(url)
    options = options or StoreOptions()
    environ = os.environ if env is None else env
    s = scheme(url)
    try:
        if s == "s3":
            fs, base = _s3(url, options, environ)
        elif s is None or s == "file":
            path = local_path(url).absolute()
            return Store(url, pafs.LocalFileSystem(), str(path))
        else:
            fs, base = pafs.FileSystem.from_uri(url)
            base = base.rstrip("/")
    except (OSError, ValueError, TypeError) as exc:
        raise StoreError(f"{url}: cannot open the store: {exc}", hint="check the URL and the store's settings") from exc
    return Store(url, fs, base)
