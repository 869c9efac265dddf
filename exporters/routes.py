"""Routes the agent asks the metrics server to serve beside ``/metrics`` (health, admin actions).

The exporter knows nothing of what they do: it hands each request on its path to the route's handler
and writes back the answer. A route authenticates for itself (probes carry no secret, admin actions
their own bearer token), so the web-config file's basic auth does not apply to it; its TLS and
``http_server_config.headers`` do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class HttpRequest:
    """One request to a route, read whole."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)  # the last value of each parameter
    authorization: str | None = None  # the Authorization header
    peer: str = "?"  # host:port of the client


@dataclass(frozen=True)
class HttpResponse:
    """A route's answer."""

    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


Route = Callable[[HttpRequest], HttpResponse]
