"""The agent's routes (agent/http.py): probes, admin actions over HTTP, and typed refusals mapped to statuses."""

from __future__ import annotations

import json
import logging

import pytest

from aaco.agent.admin_actions import (
    ActionError,
    BadRequestError,
    ConflictError,
    ForbiddenError,
    NotFoundError,
    TooManyRequestsError,
    capture,
)
from aaco.agent.http import STATUS, action_route, health_routes, routes, run_action
from aaco.contract.stats import Stats
from aaco.exporters.routes import HttpRequest


class Health:
    def __init__(self, live: bool, ready: bool) -> None:
        self.state = (live, ready)

    def live(self) -> tuple[bool, str]:
        return self.state[0], "ok" if self.state[0] else "pipeline stalled for 61s"

    def ready(self) -> tuple[bool, str]:
        return self.state[1], "ok" if self.state[1] else "starting"


class Auth:
    def authorize(self, authorization: str | None, peer: str) -> tuple[bool, str]:
        if authorization == "Bearer good":
            return True, f"token from {peer}"
        return False, "wrong token"


def post(path: str = "/api/v1/capture", authorization: str | None = "Bearer good", **query: str) -> HttpRequest:
    return HttpRequest("POST", path, query, authorization, "127.0.0.1:5000")


def test_probes_answer_200_or_503_with_why():
    table = health_routes(Health(live=True, ready=False))
    live = table["/healthz"](HttpRequest("GET", "/healthz"))
    ready = table["/readyz"](HttpRequest("GET", "/readyz"))
    assert (live.status, live.body) == (200, b"ok\n")
    assert (ready.status, ready.body) == (503, b"starting\n")


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (BadRequestError, 400),
        (ForbiddenError, 403),
        (NotFoundError, 404),
        (ConflictError, 409),
        (TooManyRequestsError, 429),
    ],
)
def test_each_refusal_type_has_its_status(error: type[ActionError], status: int, caplog):
    def action(params: dict[str, str], who: str) -> dict:
        raise error({"error": "no"}, "some_reason", "capture of pid 9")

    with caplog.at_level(logging.WARNING, logger="aaco.admin"):
        assert run_action(action, {}, "me") == (status, {"error": "no"})
    assert f"capture of pid 9 asked by me refused ({status} some_reason): no" in caplog.text


def test_every_refusal_type_is_mapped():
    assert set(STATUS) == set(ActionError.__subclasses__())


def test_an_action_that_goes_through_is_accepted():
    assert run_action(lambda params, who: {"queued": True, "who": who}, {}, "me") == (
        202,
        {"queued": True, "who": "me"},
    )


def test_the_action_route_wants_post_and_a_credential():
    asked: list[tuple[dict[str, str], str]] = []

    def action(params: dict[str, str], who: str) -> dict:
        asked.append((params, who))
        return {"queued": True}

    route = action_route(action, Auth())
    got = route(HttpRequest("GET", "/api/v1/capture"))
    assert got.status == 405 and ("Allow", "POST") in got.headers
    got = route(post(authorization="Bearer bad"))
    assert got.status == 401 and json.loads(got.body) == {"error": "wrong token"}
    assert ("WWW-Authenticate", 'Bearer realm="aaco"') in got.headers
    assert asked == []
    got = route(post(pid="42"))
    assert (got.status, got.content_type, json.loads(got.body)) == (202, "application/json", {"queued": True})
    assert asked == [({"pid": "42"}, "token from 127.0.0.1:5000")]


def test_without_an_admin_credential_actions_are_off():
    got = action_route(lambda params, who: {}, None)(post())
    assert got.status == 403 and "admin actions are off" in json.loads(got.body)["error"]


def test_capture_refusals_are_typed(caplog):
    table = routes(Health(True, True), {"/api/v1/capture": lambda p, w: capture({}, p, w, Stats())}, Auth())
    assert set(table) == {"/healthz", "/readyz", "/api/v1/capture"}
    assert table["/api/v1/capture"](post(pid="x")).status == 400
    got = table["/api/v1/capture"](post(pid="42"))
    assert got.status == 404 and json.loads(got.body) == {"error": "this agent has no capture source"}
