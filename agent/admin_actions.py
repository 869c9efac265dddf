"""The admin actions, run once ``admin`` has said who asked: ``POST /api/v1/capture``.

An action returns its JSON answer, or raises an ``ActionError`` whose type says why it refused
(``agent/http.py`` maps each type to its HTTP status). Kept apart from ``admin`` (the credentials),
which ``aaco capture`` imports: this one reaches the capture source and with it the trace formats.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from aaco.agent.admin import ADMIN_REQUESTS
from aaco.agent.sources.base import Source
from aaco.agent.sources.capture import CaptureSource, Outcome
from aaco.contract.stats import Stats

log = logging.getLogger("aaco.admin")

Action = Callable[[dict[str, str], str], dict[str, Any]]  # (query, who asked) -> JSON answer


class ActionError(Exception):
    """An admin action refused: ``doc`` is its JSON answer (with an ``error``), ``outcome`` its counted reason."""

    def __init__(self, doc: dict[str, Any], outcome: str, what: str) -> None:
        super().__init__(str(doc.get("error", "")))
        self.doc = doc
        self.outcome = outcome
        self.what = what  # for the log line: "capture of pid 42"


class BadRequestError(ActionError):
    """The request's parameters are wrong."""


class NotFoundError(ActionError):
    """No such source or process."""


class ForbiddenError(ActionError):
    """The target may not be acted on."""


class ConflictError(ActionError):
    """The action already runs for this target."""


class TooManyRequestsError(ActionError):
    """Rate limited, or the queue is full: retry later."""


# Why a capture was refused, as an error type.
CAPTURE_REFUSALS: dict[Outcome, type[ActionError]] = {
    Outcome.NO_SUCH_PROCESS: NotFoundError,
    Outcome.NOT_A_TARGET: ForbiddenError,
    Outcome.FORBIDDEN: ForbiddenError,
    Outcome.ALREADY: ConflictError,
    Outcome.RATE_LIMITED: TooManyRequestsError,
    Outcome.QUEUE_FULL: TooManyRequestsError,
}


def capture(sources: dict[str, Source], params: dict[str, str], who: str, stats: Stats) -> dict[str, Any]:
    """``POST /api/v1/capture?pid=P[&source=NAME]`` asked by ``who``: the queued capture; logged and counted.

    Raises an ``ActionError`` (typed by the reason) when it is refused.
    """
    try:
        pid = int(params.get("pid", ""))
    except ValueError:
        raise _refused(stats, BadRequestError, "bad_request", {"error": "pid must be an integer"}) from None
    captures = {n: s for n, s in sources.items() if isinstance(s, CaptureSource)}
    wanted = params.get("source")
    if wanted:
        captures = {n: s for n, s in captures.items() if n == wanted}
    if not captures:
        why = "this agent has no capture source" + (f" named {wanted}" if wanted else "")
        raise _refused(stats, NotFoundError, "no_source", {"error": why})
    name, source = next(iter(captures.items()))
    answer = source.request(pid, f"asked by {who}")
    doc: dict[str, Any] = {
        "queued": answer.queued,
        "source": name,
        "pid": answer.pid,
        "reason": answer.outcome.value,
    }
    if not answer.queued:
        doc["error"] = answer.detail
        raise _refused(stats, CAPTURE_REFUSALS[answer.outcome], answer.outcome.value, doc, pid)
    stats.inc(ADMIN_REQUESTS, 1, action="capture", outcome=answer.outcome.value)
    log.info("capture of pid %d on source %s asked by %s: %s", pid, name, who, answer.outcome.value)
    return doc


def _refused(
    stats: Stats, kind: type[ActionError], outcome: str, doc: dict[str, Any], pid: int | None = None
) -> ActionError:
    """The error to raise for a refusal, counted (``agent/http.py`` logs it with its status)."""
    stats.inc(ADMIN_REQUESTS, 1, action="capture", outcome=outcome)
    return kind(doc, outcome, f"capture of pid {pid}" if pid is not None else "capture")
