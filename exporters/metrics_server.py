"""The ``/metrics`` port: the Prometheus endpoint and the agent's routes, served on ``contract/http_loop``.

Kinds of work have lanes of their own, so none waits behind another: the kubelet's probes
(``/healthz``, ``/readyz``), scrapes, the bcrypt checks of credentials not seen before, and admin
actions. Basic auth is decided in the loop when the credential's verdict is known (``basic_auth``),
so wrong passwords repeated by many clients cost no thread; a credential not seen before waits for
the one bcrypt check at a time. TLS (the web-config file's certificate, read again when it changes),
the client certificate's SANs and ``http_server_config.headers`` apply to every request; basic auth
to all but the routes (probes carry no secret, admin actions their own bearer token).
"""

from __future__ import annotations

import gzip
import ssl
import urllib.parse
from collections.abc import Mapping
from typing import Final

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from aaco.contract.http_app import HTTP_CONNECTIONS, Answer, Head, Lane, Refuse, Reply, Work
from aaco.contract.signals import MetricDef
from aaco.contract.stats import Stats
from aaco.exporters.routes import HttpRequest, Route
from aaco.exporters.web_config import WebConfigWatcher, WebState, allowed_san

PORT_LABEL: Final = "metrics"
PROBES: Final = frozenset({"/healthz", "/readyz"})
ROUTE_BODY: Final = 64 * 1024  # the most body a route's request may carry


def lanes(workers: int) -> dict[str, Lane]:
    """The port's lanes: probes, scrapes (``workers`` threads), credentials' first bcrypt check, admin actions."""
    return {"probe": Lane(1, 32), "metrics": Lane(workers, 16), "auth": Lane(1, 8), "admin": Lane(1, 4)}


class MetricsApp:
    """What the ``/metrics`` port does with a request (``contract.http_app.App``)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        routes: Mapping[str, Route],
        web: WebConfigWatcher | None,
        stats: Stats,
        refused: MetricDef,
    ) -> None:
        self.registry = registry
        self.routes = dict(routes)
        self.web = web
        self.stats = stats
        self.refused = refused

    # -- the loop's questions (quick) -------------------------------------------------------------------

    def label(self, path: str | None) -> str:
        """Requests are counted by reason only."""
        return PORT_LABEL

    def admit(self, head: Head) -> Refuse | Answer | Work:
        """Probes and routes to their lanes; anything else past basic auth (decided now when its verdict is known)."""
        if head.path in self.routes:
            return Work("probe" if head.path in PROBES else "admin", max_body=ROUTE_BODY)
        state = self.web.current() if self.web is not None else None
        if state is not None and state.error is not None:
            self.stats.inc(self.refused, reason="config_error")
            return Answer(self._reply(state, 500, b"the agent's web-config file did not load; its log says why\n"))
        if state is not None and state.users:  # before the path is looked at: no path is told apart without them
            assert self.web is not None
            verdict = self.web.auth.known(state.users, head.headers.get("authorization"))
            if verdict is None:
                return Work("auth")
            if not verdict[0]:
                return Answer(self._unauthorized(state, verdict[1]))
        return self._authorized(state, head)

    def _authorized(self, state: WebState | None, head: Head) -> Answer | Work:
        """What an authorised request gets: the metrics (in their lane), the index, 405 or 404."""
        if head.path == "/metrics":
            if head.method != "GET":
                return Answer(self._reply(state, 405, b"use GET\n", (("Allow", "GET"),)))
            return Work("metrics")
        if head.path == "/":
            return Answer(
                self._reply(state, 200, ("AACO agent: " + " ".join(["/metrics", *self.routes]) + "\n").encode())
            )
        return Answer(self._reply(state, 404, b"not found; try /metrics\n"))

    def tls(self) -> ssl.SSLContext | None:
        """The web-config file's TLS context as it is now (None: plain HTTP)."""
        if self.web is None or not self.web.tls:
            return None
        return self.web.current().context

    def check_peer(self, sock: ssl.SSLSocket) -> str | None:
        """``client_san`` when the client's certificate has none of ``client_allowed_sans``."""
        state = self.web.current() if self.web is not None else None
        tls = state.config.tls_server_config if state is not None else None
        if (
            tls is not None
            and tls.client_allowed_sans
            and not allowed_san(sock.getpeercert() or {}, tls.client_allowed_sans)
        ):
            return "client_san"
        return None

    def release(self, reserved: int) -> None:
        """Nothing is reserved."""

    def count(self, label: str, outcome: str) -> None:
        """A refused request (timeout, malformed, busy, too_large, ...)."""
        self.stats.inc(self.refused, reason=outcome)

    def count_connection(self, outcome: str) -> None:
        """A connection accepted, or ended."""
        self.stats.inc(HTTP_CONNECTIONS, port=PORT_LABEL, outcome=outcome)

    # -- a lane's work ----------------------------------------------------------------------------------

    def handle(self, head: Head, body: bytes, lane: str) -> Reply:
        """A route's answer, or the metrics (after the bcrypt check, in the ``auth`` lane)."""
        state = self.web.current() if self.web is not None else None
        if lane in ("probe", "admin"):
            return self._route(state, head)
        if lane == "auth":
            assert self.web is not None and state is not None
            ok, why = self.web.auth.check(state.users, head.headers.get("authorization"))
            if not ok:
                return self._unauthorized(state, why)
            then = self._authorized(state, head)
            if isinstance(then, Answer):
                return then.reply
        return self._metrics(state, head)

    def _metrics(self, state: WebState | None, head: Head) -> Reply:
        """The exposition the Accept header asks for (text or OpenMetrics), gzip when accepted, ``name[]`` kept."""
        encoder, content_type = choose_encoder(head.headers.get("accept", ""))
        params = urllib.parse.parse_qs(head.query)
        registry = self.registry.restricted_registry(params["name[]"]) if "name[]" in params else self.registry
        output = encoder(registry)
        extra: tuple[tuple[str, str], ...] = ()
        if gzip_accepted(head.headers.get("accept-encoding", "")):
            output, extra = gzip.compress(output, compresslevel=5), (("Content-Encoding", "gzip"),)
        return self._reply(state, 200, output, extra, content_type)

    def _route(self, state: WebState | None, head: Head) -> Reply:
        request = HttpRequest(
            method=head.method,
            path=head.path,
            query={k: v[-1] for k, v in urllib.parse.parse_qs(head.query).items()},
            authorization=head.headers.get("authorization"),
            peer=head.peer,
        )
        answer = self.routes[head.path](request)
        return self._reply(state, answer.status, answer.body, answer.headers, answer.content_type)

    def _unauthorized(self, state: WebState, why: str) -> Reply:
        self.stats.inc(self.refused, reason=why)
        return self._reply(state, 401, b"Unauthorized\n", (("WWW-Authenticate", 'Basic realm="aaco"'),))

    @staticmethod
    def _reply(
        state: WebState | None,
        status: int,
        body: bytes,
        headers: tuple[tuple[str, str], ...] = (),
        content_type: str = "text/plain; charset=utf-8",
    ) -> Reply:
        """A reply with the web-config file's ``http_server_config.headers``."""
        extra = tuple(state.headers) if state is not None else ()
        return Reply(status, body, content_type, headers + extra)
