"""The agent's lifecycle: build, start, run, reload, and shut down against one deadline.

Shutdown (SIGTERM, SIGINT, the end of a replay) runs in this order, all within
``pipeline.shutdown_timeout_s``:

1. sources are asked to stop reading; they publish what they already hold (waiting for room);
2. when they have ended (or their share of the deadline is spent) the bus is closed, and what it
   still holds is drained through the correlator, the analyzers and the exporters;
3. held kernels are released, a final snapshot is published, and every exporter and forwarder is
   flushed and shut down, all at once (``shutdown.close_together``): sends are capped by the time
   left, what is not sent by the deadline is counted dropped and said in one log line.

``shutdown`` is idempotent and safe before ``start``. ``reload`` (SIGHUP) applies a new
configuration: sources whose configuration is unchanged keep running (a finished replay is not
replayed again), changed exporters are replaced, analyzers keep their state unless their settings
changed; pipeline bounds apply at the next start.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aaco.agent.admin import TokenAuth, load_token
from aaco.agent.admin_actions import Action
from aaco.agent.admin_actions import capture as capture_action
from aaco.agent.admin_socket import AdminSocketServer
from aaco.agent.config import AgentConfig, source_names
from aaco.agent.http import routes
from aaco.agent.memory_guard import MemoryGuard
from aaco.agent.memory_guard import limits as memory_limits
from aaco.agent.pipeline.bus import Bus
from aaco.agent.pipeline.correlator import Correlator
from aaco.agent.pipeline.worker import Pipeline
from aaco.agent.receivers.base import Forwarder, ReceiverContext, SpanSink
from aaco.agent.receivers.registry import RECEIVERS
from aaco.agent.shutdown import close_exporter, close_together, dropped_at_shutdown, report
from aaco.agent.sources import SOURCES
from aaco.agent.sources.base import Journal, NullProgress, Problem, Progress, Source, SourceContext
from aaco.agent.sources.capture import CaptureConfig
from aaco.agent.sources.supervise import Supervisor
from aaco.agent.verdict.environment import node_versions
from aaco.analyzers.base import Analyzer
from aaco.analyzers.registry import AgentHints, build
from aaco.contract.budget import ByteBudget
from aaco.contract.component import Component
from aaco.contract.ledger import Ledger
from aaco.contract.memory import cgroup_memory_limit
from aaco.contract.snapshot import AnalysisSnapshot
from aaco.contract.stats import Stats, declare_components
from aaco.exporters.base import Exporter
from aaco.exporters.context import ExporterContext
from aaco.exporters.otlp_settings import resource_attributes
from aaco.exporters.registry import EXPORTERS

if TYPE_CHECKING:
    from aaco.exporters.otlp_sender import OtlpSender  # gRPC only when a receiver forwards

log = logging.getLogger("aaco.service")


class State(enum.Enum):
    """Where the service is in its life."""

    NEW = "new"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass
class _Running:
    """A source with its thread, its supervisor and the configuration it was started from."""

    source: Source
    config: Any
    ctx: SourceContext
    thread: threading.Thread
    supervisor: Supervisor  # its ``ended`` is set as the thread ends (before it wakes the main thread)


def analyzer_hints(config: AgentConfig) -> AgentHints:
    """What the analyzers need to know of the sources (smi names and interval, sched bound) and the receiver."""
    smi = [(name, src) for name, src in zip(source_names(config), config.sources, strict=True) if src.type == "smi"]
    sched = [src.max_workloads for src in config.sources if src.type == "sched"]
    return AgentHints(
        smi_compat={name: src.compat for name, src in smi if src.compat != "off"},
        smi_interval_s=max((src.interval_s for _, src in smi), default=1.0),
        sched_max_workloads=max(sched, default=64),
        request_spans=config.receivers.otlp.enabled,
    )


def build_analyzers(config: AgentConfig) -> list[Analyzer]:
    """The registered analyzers, configured from ``analyzers`` and the sources (aaco.analyzers.registry)."""
    return build(config.analyzers, analyzer_hints(config))


class AgentService:
    """One agent: sources, bus, pipeline worker, exporters."""

    def __init__(
        self, config: AgentConfig, progress: Progress | None = None, extra_exporters: list[Exporter] | None = None
    ) -> None:
        self.config = config
        self.progress = progress or NullProgress()
        self.stats = Stats()
        # One byte budget for the OTLP data held: receiver, assembly, export and forward queues.
        self.budget = ByteBudget(config.exporters.otlp.memory_budget_mib * 1024 * 1024, self.stats)
        p = config.pipeline
        soft, hard = memory_limits(
            p.memory_limit_mib, p.memory_spike_mib, config.exporters.otlp.memory_budget_mib, cgroup_memory_limit()
        )
        self.memory_guard = MemoryGuard(soft, hard, self.budget, self.stats)
        self.journal = Journal(self.stats)
        self.state = State.NEW
        self._lock = threading.RLock()
        self._extra = list(extra_exporters or [])
        p = config.pipeline
        self.bus = Bus(self.stats, p.queue_max_batches, p.queue_max_events)
        self.exporters: list[Exporter] = []
        self.ledger = Ledger()
        self.pipeline = Pipeline(
            self.bus,
            Correlator(self.stats, p.correlator_hold_s, p.correlator_max_pending_events),
            build_analyzers(config),
            [],
            self.stats,
            config.node,
            p.snapshot_interval_s,
            ledger=self.ledger,
        )
        self._sources: dict[str, _Running] = {}
        self._worker: threading.Thread | None = None
        self._worker_stop = threading.Event()
        # Set when a source thread ends, so the main thread waits on events instead of polling often.
        self.wake = threading.Event()
        self.final_snapshot: AnalysisSnapshot | None = None
        self.receivers: dict[str, Component] = {}  # by kind, those enabled
        self._forwarders: list[OtlpSender] = []  # queues forwarding received metrics and logs upstream
        self.admin: TokenAuth | None = None  # who may run admin actions, once started with a capture source
        self._admin_socket: AdminSocketServer | None = None

    # -- exporters ----------------------------------------------------------------------------------

    def _build_exporters(self, config: AgentConfig) -> list[Exporter]:
        """The registered exporters its configuration turns on, then the extra ones given."""
        rx = config.receivers.otlp
        ctx = ExporterContext(
            config.node,
            self.stats,
            self.budget,
            self.ledger,
            self.journal.records_json,
            routes(self, self._actions(), self.admin),
            link_window_s=rx.link_window_s,
            link_mode=rx.link_mode,
            receiving=rx.enabled,
            versions=node_versions() if config.exporters.lake.enabled else None,
        )
        built = (reg.factory(getattr(config.exporters, reg.config.section), ctx) for reg in EXPORTERS)
        return [e for e in built if e is not None] + self._extra

    @staticmethod
    def _start_all(exporters: list[Exporter]) -> None:
        started: list[Exporter] = []
        try:
            for exp in exporters:
                exp.start()
                started.append(exp)
        except Exception:
            for exp in started:
                exp.shutdown(2.0)
            raise

    # -- sources ------------------------------------------------------------------------------------

    def _start_source(self, name: str, cfg: Any) -> None:
        factory = SOURCES[cfg.type].factory
        source: Source = factory(cfg, name)
        lake = self.config.exporters.lake
        ctx = SourceContext(
            self.config.node,
            self.stats,
            self.bus,
            self.journal,
            progress=self.progress,
            ledger=self.ledger,
            quarantine=(lake.path / "quarantine" / name) if lake.enabled else None,
        )
        declare_components(self.stats, [name], [])  # its error and drop counters shown at 0 from the start
        supervisor = Supervisor(name, source, ctx, on_end=self.wake.set)
        thread = threading.Thread(target=supervisor.run, name=f"aaco-source-{name}", daemon=True)
        self._sources[name] = _Running(source, cfg, ctx, thread, supervisor)
        thread.start()

    def _stop_sources(self, names: list[str], deadline: float) -> None:
        for n in names:
            self._sources[n].ctx.stop.set()
        for n in names:
            self._sources[n].thread.join(max(0.0, deadline - time.monotonic()))
        for n in names:
            run = self._sources.pop(n)
            if run.thread.is_alive():
                run.ctx.abort.set()
                log.warning("source %s did not stop in time; what it still holds is dropped", n)

    @property
    def sources(self) -> dict[str, Source]:
        """The running (or finished) sources by name."""
        with self._lock:
            return {name: run.source for name, run in self._sources.items()}

    def capture_request(self, params: dict[str, str], who: str) -> dict[str, Any]:
        """``POST /api/v1/capture?pid=P[&source=NAME]`` asked by ``who``: a capture source's window of ``pid``.

        Raises an ``admin_actions.ActionError`` when refused.
        """
        return capture_action(self.sources, params, who, self.stats)

    def _actions(self) -> dict[str, Action]:
        return {"/api/v1/capture": self.capture_request}

    def _start_admin(self) -> None:
        """The admin credentials (token, Unix socket), when a capture source gives them something to guard."""
        if not any(isinstance(s, CaptureConfig) for s in self.config.sources):
            return
        adm = self.config.admin
        self.admin = TokenAuth(load_token(adm.token_file), self.stats)
        if adm.socket is not None:
            self._admin_socket = AdminSocketServer(
                adm.socket, adm.allowed_uids, self._actions(), self.admin, self.stats
            )
            self._admin_socket.start()

    def sources_done(self) -> bool:
        """True when every source has ended (replays finished, fixed cycles run)."""
        with self._lock:
            return all(r.supervisor.ended.is_set() for r in self._sources.values())

    @property
    def problems(self) -> list[Problem]:
        """Bad input met so far."""
        return list(self.journal.problems)

    # -- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start exporters, the pipeline worker and the sources (an exporter that cannot start is an error)."""
        with self._lock:
            if self.state is not State.NEW:
                raise RuntimeError(f"cannot start a service that is {self.state.value}")
            self._start_admin()
            self.exporters = self._build_exporters(self.config)
            try:
                self._start_all(self.exporters)
            except Exception:
                if self._admin_socket is not None:
                    self._admin_socket.stop()
                raise
            self.pipeline.exporters = self.exporters
            declare_components(self.stats, [], [e.name for e in self.exporters])
            self._worker = threading.Thread(target=self._work, name="aaco-pipeline", daemon=True)
            self._worker.start()
            self.memory_guard.start()
            self._start_receivers()
            for name, cfg in zip(source_names(self.config), self.config.sources, strict=True):
                self._start_source(name, cfg)
            self.state = State.RUNNING
            log.info(
                "agent running on node %s: %d source(s), exporters: %s",
                self.config.node,
                len(self.config.sources),
                ", ".join(e.name for e in self.exporters) or "none",
            )

    def _start_receivers(self) -> None:
        """Start the receivers the configuration turns on, handing spans to the exporter that takes them."""
        sink = next((e for e in self.exporters if isinstance(e, SpanSink)), None)
        ctx = ReceiverContext(
            self.stats,
            self.budget,
            resource_attributes(self.config.node),
            sink,
            self._forwarder,
            bus=self.bus,
            node=self.config.node,
        )
        for reg in RECEIVERS:
            receiver = reg.factory(getattr(self.config.receivers, reg.config.section), ctx)
            if receiver is not None:
                receiver.start()
                self.receivers[reg.kind] = receiver

    def _forwarder(self, signal: str) -> Forwarder | None:
        """A started queue forwarding ``signal`` upstream, when the OTLP settings name an endpoint for it."""
        from aaco.exporters.otlp_forward import forwarder  # gRPC and protobuf only when a receiver runs

        sender = forwarder(self.config.exporters.otlp, signal, self.stats, self.budget)  # type: ignore[arg-type]
        if sender is not None:
            sender.start()
            self._forwarders.append(sender)
        return sender

    def _work(self) -> None:
        while not self._worker_stop.is_set():
            self.pipeline.step(self.pipeline.idle_wait())

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Stop everything, flushing what was read, within one deadline. Idempotent; safe before start."""
        with self._lock:
            if self.state in (State.STOPPING, State.STOPPED):
                return
            if self.state is State.NEW:
                self.state = State.STOPPED
                return
            self.state = State.STOPPING
        total = self.config.pipeline.shutdown_timeout_s if timeout_s is None else timeout_s
        # A tenth (at most 1 s) is kept for the closers' grace and the process's own exit: the deadline is the exit's.
        deadline = time.monotonic() + total - min(1.0, 0.1 * total)
        before = dropped_at_shutdown(self.stats)
        sources_deadline = deadline - min(2.0, 0.3 * total)
        if self._admin_socket is not None:
            self._admin_socket.stop(min(2.0, 0.2 * total))
        for receiver in self.receivers.values():
            receiver.shutdown(min(2.0, 0.2 * total))
        for sender in self._forwarders:  # nothing more comes in: they send what they hold until the deadline
            sender.close(deadline)
        self._stop_sources(list(self._sources), sources_deadline)
        self._worker_stop.set()  # before closing the bus: the close wakes a worker waiting on it
        self.bus.close()
        if self._worker is not None:
            self._worker.join(max(0.0, deadline - time.monotonic()))
        drained = self.pipeline.drain(deadline)
        if not drained:
            log.warning("shutdown deadline reached with %d event(s) still queued", self.bus.depth)
        self.final_snapshot = self.pipeline.finish()
        closers = [(e.name, lambda e=e: close_exporter(e, deadline)) for e in self.exporters]
        closers += [(s.component, lambda s=s: s.shutdown(deadline - time.monotonic())) for s in self._forwarders]
        report(self.stats, before, total, close_together(closers, deadline))
        self.memory_guard.stop()
        with self._lock:
            self.state = State.STOPPED
        log.info("agent stopped")

    def reload(self, new: AgentConfig) -> None:
        """Apply a new configuration to the running agent (SIGHUP)."""
        with self._lock:
            if self.state is not State.RUNNING:
                return
            old = self.config
            if new == old:
                log.info("reload: configuration unchanged")
                return
            if new.pipeline != old.pipeline:
                log.warning("reload: pipeline settings change at the next restart")
            if new.exporters != old.exporters or new.node != old.node:
                fresh = self._build_exporters(new)
                try:
                    self._start_all([e for e in fresh if e not in self._extra])
                except Exception as exc:
                    log.error("reload: new exporters failed to start (%s); keeping the running ones", exc)
                    return
                self.pipeline.publish_snapshot()
                for exp in self.exporters:
                    if exp not in self._extra:
                        exp.force_flush(5.0)
                        exp.shutdown(5.0)
                self.exporters = fresh
                self.pipeline.exporters = fresh
                declare_components(self.stats, [], [e.name for e in fresh])
            if new.analyzers != old.analyzers or new.node != old.node:
                self.pipeline.analyzers = build_analyzers(new)
            self.pipeline.node = new.node
            wanted = dict(zip(source_names(new), new.sources, strict=True))
            changed = [n for n, r in self._sources.items() if wanted.get(n) != r.config or new.node != old.node]
            self._stop_sources(changed, time.monotonic() + new.pipeline.shutdown_timeout_s)
            self.config = new
            started = [name for name in wanted if name not in self._sources]
            for name in started:
                self._start_source(name, wanted[name])
            log.info("reload: applied; %d source(s) stopped, %d started", len(changed), len(started))

    # -- health (served on /healthz and /readyz) ----------------------------------------------------

    def sources_down(self) -> list[str]:
        """The sources that crashed and are not running (waiting to restart, or given up), with why."""
        with self._lock:
            runs = list(self._sources.items())
        return [f"source {name} {why}" for name, r in runs if (why := r.supervisor.down()) is not None]

    def live(self) -> tuple[bool, str]:
        """Alive while the pipeline worker makes progress and every source runs (or ended well)."""
        if self.state is State.NEW:
            return False, "not started"
        if self.state is State.STOPPED:
            return False, "stopped"
        stalled = time.monotonic() - self.pipeline.heartbeat
        if self.state is State.RUNNING and (self._worker is None or not self._worker.is_alive()):
            return False, "pipeline worker is not running"
        if stalled > self.config.pipeline.stall_timeout_s:
            return False, f"pipeline stalled for {stalled:.0f}s"
        down = self.sources_down()
        if down:
            return False, "; ".join(down)
        return True, "ok"

    def ready(self) -> tuple[bool, str]:
        """Ready once running, the pipeline has gone round at least once, and no source is down."""
        if self.state is not State.RUNNING:
            return False, self.state.value
        if self.pipeline.steps == 0:
            return False, "starting"
        down = self.sources_down()
        if down:
            return False, "; ".join(down)
        return True, "ok"
