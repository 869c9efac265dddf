"""The agent's own HTTP routes, served by the metrics exporter beside ``/metrics``.

- ``/healthz`` and ``/readyz``: the service's liveness and readiness (200, or 503 with why), open
  to anyone: Kubernetes probes carry no secret and learn nothing but up or not.
- ``/api/v1/capture`` (and any admin action): ``POST`` only, with a credential the admin auth
  accepts. An action's refusal is an ``ActionError`` whose type gives the status (``STATUS``); the
  admin Unix socket answers with the same statuses through ``run_action``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from aaco.agent.admin_actions import (
    Action,
    ActionError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    TooManyRequestsError,
)
from aaco.exporters.routes import HttpRequest, HttpResponse, Route

log = logging.getLogger("aaco.admin")

ACCEPTED = 202  # an action that went through queued its work
STATUS: dict[type[ActionError], int] = {
    BadRequestError: 400,
    ForbiddenError: 403,
    NotFoundError: 404,
    ConflictError: 409,
    TooManyRequestsError: 429,
}


class Health(Protocol):
    """Liveness and readiness as the service sees them."""

    def live(self) -> tuple[bool, str]:
        """True while the pipeline makes progress (else why not)."""

    def ready(self) -> tuple[bool, str]:
        """True once running and the pipeline went round (else why not)."""


class AdminAuth(Protocol):
    """Who may run admin actions over HTTP (``agent/admin.py``'s ``TokenAuth``)."""

    def authorize(self, authorization: str | None, peer: str) -> tuple[bool, str]:
        """(True, who asked) when the ``Authorization`` header allows admin actions, else (False, why not)."""


def run_action(action: Action, params: dict[str, str], who: str) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON answer) of one admin action: 202 when it went through, its error's status when refused."""
    try:
        return ACCEPTED, action(params, who)
    except ActionError as exc:
        status = STATUS[type(exc)]
        log.warning("%s asked by %s refused (%d %s): %s", exc.what, who, status, exc.outcome, exc.doc.get("error"))
        return status, exc.doc


def json_response(status: int, doc: dict[str, Any], headers: tuple[tuple[str, str], ...] = ()) -> HttpResponse:
    """A JSON answer."""
    return HttpResponse(status, json.dumps(doc).encode() + b"\n", "application/json", headers)


def health_routes(health: Health) -> dict[str, Route]:
    """``/healthz`` (liveness) and ``/readyz`` (readiness): 200 or 503, with the reason as text."""

    def probe(check: str) -> Route:
        def route(_request: HttpRequest) -> HttpResponse:
            ok, why = health.live() if check == "live" else health.ready()
            return HttpResponse(200 if ok else 503, (why + "\n").encode())

        return route

    return {"/healthz": probe("live"), "/readyz": probe("ready")}


def action_route(action: Action, auth: AdminAuth | None) -> Route:
    """An admin action over HTTP: POST only (405), admin credentials required (403 when none is set, 401 when wrong)."""

    def route(request: HttpRequest) -> HttpResponse:
        if request.method != "POST":
            return json_response(405, {"error": "use POST"}, (("Allow", "POST"),))
        if auth is None:
            return json_response(403, {"error": "admin actions are off on this agent (no admin credential configured)"})
        ok, who = auth.authorize(request.authorization, request.peer)
        if not ok:
            log.warning("admin action %s refused from %s: %s", request.path, request.peer, who)
            return json_response(401, {"error": who}, (("WWW-Authenticate", 'Bearer realm="aaco"'),))
        return json_response(*run_action(action, dict(request.query), who))

    return route


def routes(health: Health, actions: Mapping[str, Action], auth: AdminAuth | None) -> dict[str, Route]:
    """Every route the agent serves beside ``/metrics``."""
    return {**health_routes(health), **{path: action_route(a, auth) for path, a in actions.items()}}
