"""The OTLP/HTTP port: OTLP's admission rules on the shared selector loop (``contract/http_loop``).

The loop owns every connection while it costs no work and bounds connections (overall and per peer,
the oldest idle one closed to make room), time and threads (docs/security.md, "The HTTP ports").
What this port adds is checked on a request's head, before any body byte is read: a known path
(404), POST (405), a Content-Length that is present (411 without one, unless chunked) and not over
``max_message_bytes`` (413), and the bytes admitted by the agent's byte budget (503 with Retry-After
when it is full; chunked bodies reserve ``max_message_bytes``). A request read whole is handed to
the ``otlp`` lane (``max_workers`` threads), which parses and forwards it. Every refusal is counted
in ``aaco_receiver_requests_total`` (by signal, ``unknown`` before the path is known), every
connection's end in ``aaco_http_connections_total{port="otlp_http"}``.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from aaco.agent.receivers.config import OtlpReceiverConfig
from aaco.agent.receivers.http_wire import MAX_HEADER_BYTES, PATHS, Count, Request
from aaco.contract.budget import ByteBudget
from aaco.contract.http_app import HTTP_CONNECTIONS, Answer, Head, Lane, Limits, Refuse, Reply, Work
from aaco.contract.http_loop import LoopServer
from aaco.contract.stats import Stats

PORT_LABEL = "otlp_http"
log = logging.getLogger("aaco.receivers.otlp")


@dataclass
class OtlpHttp:
    """The OTLP/HTTP port's ``http_app.App``: ``handler`` answers each request read whole."""

    config: OtlpReceiverConfig
    stats: Stats
    budget: ByteBudget
    handler: Callable[[Request], Reply]
    counter: Count
    context: ssl.SSLContext | None

    def label(self, path: str | None) -> str:
        """The signal a path names (``unknown`` when none)."""
        return PATHS.get(path or "", "unknown")

    def admit(self, head: Head) -> Refuse | Answer | Work:
        """Admit a request on its head alone (see the module docstring)."""
        if head.path not in PATHS:
            return Refuse(404, "not_found", "unknown path; use /v1/traces, /v1/metrics or /v1/logs\n")
        if head.method != "POST":
            return Refuse(405, "not_allowed", "use POST\n", (("Allow", "POST"),))
        limit = self.config.max_message_bytes
        if "transfer-encoding" in head.headers:  # h11 accepts chunked only (501 otherwise)
            reserve = limit
        elif "content-length" not in head.headers:
            return Refuse(411, "length_required", "Content-Length required\n")
        else:
            reserve = int(head.headers["content-length"])  # digits only: h11 refused anything else
            if reserve > limit:
                return Refuse(413, "too_large", "request too large\n")
        if not self.budget.try_acquire("receiver", reserve):
            outcome = self.budget.refusing or "over_budget"
            return Refuse(503, outcome, "the agent holds too much data; retry later\n", (("Retry-After", "1"),))
        return Work("otlp", max_body=limit, reserved=reserve)

    def handle(self, head: Head, body: bytes, lane: str) -> Reply:
        """Parse and forward one request (``OtlpReceiver._http_request``)."""
        return self.handler(Request(PATHS[head.path], head.headers, body, head.peer))

    def release(self, reserved: int) -> None:
        """Give the request's bytes back to the budget."""
        self.budget.release("receiver", reserved)

    def count(self, label: str, outcome: str) -> None:
        """A request refused or failed, by signal."""
        self.counter(label, outcome)

    def count_connection(self, outcome: str) -> None:
        """A connection accepted, or ended."""
        self.stats.inc(HTTP_CONNECTIONS, port=PORT_LABEL, outcome=outcome)

    def tls(self) -> ssl.SSLContext | None:
        """``receivers.otlp.tls`` (set at start)."""
        return self.context

    def check_peer(self, sock: ssl.SSLSocket) -> str | None:
        """Client certificates are checked by the context alone."""
        return None


def http_server(app: OtlpHttp) -> LoopServer:
    """The OTLP/HTTP port (``bind``, ``start``, ``stop``) of ``app``."""
    cfg = app.config
    limits = Limits(
        cfg.max_connections,
        cfg.max_connections_per_peer,
        cfg.read_timeout_s,
        cfg.idle_timeout_s,
        MAX_HEADER_BYTES,
        cfg.backlog,
    )
    lanes = {"otlp": Lane(cfg.max_workers, cfg.max_connections)}
    return LoopServer("otlp-http", cfg.address, cfg.http_port, limits, lanes, app, log)
