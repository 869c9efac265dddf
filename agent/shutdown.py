"""The last step of a shutdown: exporters and forwarders closed together against one deadline.

Each exporter is flushed and shut down, and each forwarder (the receiver's ``OtlpSender`` for metrics
and logs) shut down, on its own daemon thread, all at once, so one whose upstream is down or slow
takes the time left from no other. Each is bounded by the deadline itself (sends capped by the time
left, gRPC calls cancelled); the threads are only waited for until the deadline, so one that is not
bounded cannot hold the agent past it (those told the deadline get ``GRACE_S`` more to return from
it). What could not be sent is counted by the components
(``aaco_events_dropped_total{reason="shutdown"}``) and said here in one log line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence

from aaco.contract.stats import EVENTS_DROPPED, Stats
from aaco.exporters.base import Exporter

log = logging.getLogger("aaco.service")
GRACE_S = 0.5  # for a closer that stopped at the deadline to return and count what it dropped


def close_exporter(exporter: Exporter, deadline: float) -> None:
    """Flush and shut down one exporter within the monotonic ``deadline``."""
    try:
        exporter.force_flush(max(0.0, deadline - time.monotonic()))
        exporter.shutdown(max(0.0, deadline - time.monotonic()))
    except Exception:
        log.exception("exporter %s failed to shut down", exporter.name)


def close_together(closers: Sequence[tuple[str, Callable[[], object]]], deadline: float) -> list[str]:
    """Run every closer at once; return the names of those still running just after the monotonic ``deadline``."""
    threads = []
    for name, close in closers:
        thread = threading.Thread(target=close, name=f"aaco-close-{name}", daemon=True)
        thread.start()
        threads.append((name, thread))
    for _, thread in threads:
        thread.join(max(0.0, deadline + GRACE_S - time.monotonic()))
    return [name for name, thread in threads if thread.is_alive()]


def dropped_at_shutdown(stats: Stats) -> Counter[tuple[str, ...]]:
    """Events dropped for the reason ``shutdown`` so far, by (component,)."""
    return stats.counts(EVENTS_DROPPED, ("component",), reason="shutdown")


def report(stats: Stats, before: Counter[tuple[str, ...]], timeout_s: float, late: list[str]) -> None:
    """One line for what this shutdown could not send (nothing when everything went)."""
    lost = dropped_at_shutdown(stats)
    lost.subtract(before)
    counts = ", ".join(f"{component} {n}" for (component,), n in sorted(lost.items()) if n > 0)
    if not counts and not late:
        return
    log.warning(
        "shutdown: not sent within pipeline.shutdown_timeout_s=%gs and dropped: %s%s; check the upstream "
        "(exporters.otlp.endpoint) or raise the timeout",
        timeout_s,
        counts or "nothing counted",
        f" (still closing at the deadline: {', '.join(late)})" if late else "",
    )
