"""The agent's main thread: run a service until a signal (or the end of its sources), reload on SIGHUP."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

from aaco.agent.config import AgentConfig
from aaco.agent.service import AgentService
from aaco.contract.errors import AacoError

log = logging.getLogger("aaco.service")


def run_until_stopped(
    service: AgentService,
    *,
    stop_when_sources_done: bool,
    reload_config: Callable[[], AgentConfig] | None = None,
    poll_s: float = 0.5,
) -> None:
    """Run ``service`` in the main thread until SIGTERM/SIGINT (or, if asked, until its sources are done).

    SIGHUP calls ``reload_config`` and applies the result; a configuration that does not validate
    is logged and the running one kept. A second SIGINT/SIGTERM while shutting down exits at once.

    The main thread sleeps on ``service.wake``, which the signal handlers and every ending source
    set; ``poll_s`` only bounds how late a signal is handled when the kernel delivered it to another
    thread (Python runs handlers in the main thread, once it runs again). Waking often costs CPU:
    a 20 Hz poll alone is 0.2 % of a core.
    """
    stop = threading.Event()
    reload_requested = threading.Event()
    wake = service.wake

    def on_stop(signum: int, _frame: object) -> None:
        if stop.is_set():
            log.error("second %s: exiting without finishing the flush", signal.Signals(signum).name)
            raise SystemExit(130)
        log.info("%s received: flushing and stopping", signal.Signals(signum).name)
        stop.set()
        wake.set()

    def on_hup(_signum: int, _frame: object) -> None:
        reload_requested.set()
        wake.set()

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    signal.signal(signal.SIGHUP, on_hup)
    try:
        service.start()
        while not stop.is_set():
            if reload_requested.is_set():
                reload_requested.clear()
                if reload_config is None:
                    log.info("SIGHUP: no configuration file to reload")
                else:
                    try:
                        service.reload(reload_config())
                    except AacoError as exc:
                        log.error("SIGHUP: configuration not reloaded:\n%s", exc)
            if stop_when_sources_done and service.sources_done():
                break
            wake.wait(poll_s)
            wake.clear()  # before the checks: whatever is set after them wakes the next wait at once
        service.shutdown()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
