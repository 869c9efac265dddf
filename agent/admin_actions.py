"""The admin actions, run once ``admin`` has said who asked: ``POST /api/v1/capture``.

Kept apart from ``admin`` (the credentials), which ``aaco capture`` imports: this one reaches the
capture source and with it the trace formats.
"""

from __future__ import annotations

import logging
from typing import Any

from aaco.agent.admin import ADMIN_REQUESTS
from aaco.agent.sources.base import Source
from aaco.agent.sources.capture import CaptureSource, Outcome
from aaco.contract.stats import Stats

log = logging.getLogger("aaco.admin")

# How each capture outcome is answered over HTTP.
CAPTURE_STATUS = {
    Outcome.QUEUED: 202,
    Outcome.NO_SUCH_PROCESS: 404,
    Outcome.NOT_A_TARGET: 403,
    Outcome.FORBIDDEN: 403,
    Outcome.ALREADY: 409,
    Outcome.RATE_LIMITED: 429,
    Outcome.QUEUE_FULL: 429,
}


def capture(sources: dict[str, Source], params: dict[str, str], who: str, stats: Stats) -> tuple[int, dict[str, Any]]:
    """``POST /api/v1/capture?pid=P[&source=NAME]`` asked by ``who``: (HTTP status, JSON body); logged and counted."""
    try:
        pid = int(params.get("pid", ""))
    except ValueError:
        return _answer(stats, who, 400, "bad_request", {"error": "pid must be an integer"})
    captures = {n: s for n, s in sources.items() if isinstance(s, CaptureSource)}
    wanted = params.get("source")
    if wanted:
        captures = {n: s for n, s in captures.items() if n == wanted}
    if not captures:
        why = "this agent has no capture source" + (f" named {wanted}" if wanted else "")
        return _answer(stats, who, 404, "no_source", {"error": why})
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
    return _answer(stats, who, CAPTURE_STATUS[answer.outcome], answer.outcome.value, doc, pid)


def _answer(
    stats: Stats, who: str, code: int, outcome: str, doc: dict[str, Any], pid: int | None = None
) -> tuple[int, dict[str, Any]]:
    stats.inc(ADMIN_REQUESTS, 1, action="capture", outcome=outcome)
    what = f"capture of pid {pid}" if pid is not None else "capture"
    if code < 300:
        log.info("%s on source %s asked by %s: %s", what, doc.get("source"), who, outcome)
    else:
        log.warning("%s asked by %s refused (%d %s): %s", what, who, code, outcome, doc.get("error"))
    return code, doc
