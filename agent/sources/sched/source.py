"""The ``sched`` source: context switches, runqueue latency, off-CPU time and page faults of GPU workloads.

A GPU waits when the thread that feeds it is descheduled or stalls on a page fault. Every
``interval_s`` this source publishes, per target process and thread, the deltas of on-CPU and
off-CPU time, runqueue wait, voluntary and involuntary switches and page faults, a log2 histogram
of runqueue latency per process, and optionally the off-CPU intervals longer than a threshold
(rows of the ``sched`` kind, see ``aaco.contract.sched``). The ``sched`` analyzer turns them into the
``aaco_sched_*`` metrics and the two indices of ``docs/metrics.md``.

Backends (``backend``):

- ``ebpf``: bcc-compiled programs on kernel tracepoints, filtered and aggregated in the kernel
  (``ebpf``): BTF-typed tracepoints with threads in task storage where the kernel allows
  (``sched_task.c``), else raw tracepoints with the task layout from BTF, else classic ones
  (``sched_bpf.c``); needs
  root (or CAP_BPF + CAP_PERFMON), bcc and kernel headers (and tracefs for classic tracepoints);
- ``proc``: ``/proc/<pid>/task/<tid>/{schedstat,status,stat}`` (``proc``), for any user;
- ``auto``: eBPF where it can run, else ``proc``.

The agent says once, in its log, which backend it uses and why. Targets (``targets``) are
re-resolved every ``discover_interval_s``: processes holding a GPU device open, configured pids
and cgroups, the agent itself, or every task (``all_tasks``).
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Literal, Protocol

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from aaco.agent.sources.base import Source, SourceContext, SourceRecord
from aaco.agent.sources.sched.proc import ProcBackend
from aaco.agent.sources.sched.targets import Resolution, TargetResolver
from aaco.contract.config_base import StrictModel
from aaco.contract.errors import AacoError
from aaco.contract.sched import Drain, drain_to_table
from aaco.contract.stats import EVENTS_DROPPED

log = logging.getLogger("aaco.sources.sched")

Backend = Literal["auto", "ebpf", "proc"]


class SchedSourceConfig(StrictModel):
    """Scheduler events of GPU workloads: context switches, runqueue latency, off-CPU time, page faults."""

    type: Literal["sched"] = "sched"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    backend: Backend = Field(
        "auto", description="ebpf (bcc on kernel tracepoints, needs root), proc (/proc, any user), or auto."
    )
    interval_s: PositiveFloat = Field(5.0, description="How often counters are drained and published, in seconds.")
    gpu_processes: bool = Field(
        True, description="Trace processes with /dev/kfd, /dev/dri/renderD* or /dev/nvidia* open."
    )
    pids: list[PositiveInt] = Field(default_factory=list, description="Also trace these processes (or threads').")
    cgroups: list[Path] = Field(
        default_factory=list,
        description="Also trace every process in these cgroup v2 directories and below (a pod's); "
        "relative paths are under /sys/fs/cgroup.",
    )
    include_self: bool = Field(False, description="Also trace the agent's own process (where the ort source runs).")
    all_tasks: bool = Field(False, description="Trace every task on the node (for diagnosis; targets are ignored).")
    discover_interval_s: PositiveFloat = Field(10.0, description="How often targets are resolved again, in seconds.")
    max_processes: PositiveInt = Field(1024, description="Target processes at most (the kernel's target map size).")
    max_threads: PositiveInt = Field(
        16384, description="Threads tracked at most (LRU-bounded kernel maps; the proc backend's per-read cap)."
    )
    offcpu_threshold_ms: NonNegativeFloat = Field(
        0.0, description="Publish each off-CPU interval at least this long (eBPF only); 0 turns them off."
    )
    max_offcpu_events: PositiveInt = Field(10_000, description="Off-CPU intervals published per drain at most.")
    max_workloads: PositiveInt = Field(
        64, description="Processes with their own metric labels; later ones are summed under comm=other."
    )

    @model_validator(mode="after")
    def _has_targets(self) -> SchedSourceConfig:
        if not (self.all_tasks or self.gpu_processes or self.pids or self.cgroups or self.include_self):
            raise ValueError("no targets: enable gpu_processes, all_tasks or include_self, or list pids or cgroups")
        return self


class SchedBackend(Protocol):
    """What the source needs from a backend."""

    name: str

    def set_targets(self, tgids: set[int]) -> None:
        """Trace exactly these processes."""

    def drain(self) -> Drain:
        """Deltas since the previous drain."""

    def close(self) -> None:
        """Stop tracing and release everything (idempotent)."""


_announced: set[tuple[str, str]] = set()
_announce_lock = threading.Lock()


def announce(backend: str, reason: str) -> bool:
    """Log which backend is used and why, once per process and (backend, reason); True if logged now."""
    with _announce_lock:
        if (backend, reason) in _announced:
            return False
        _announced.add((backend, reason))
    if backend == "proc" and not reason.startswith("configured"):
        log.warning("sched: using the proc backend (/proc schedstat and status): %s", reason)
    else:
        log.info("sched: using the %s backend: %s", backend, reason)
    return True


def select_backend(cfg: SchedSourceConfig) -> tuple[SchedBackend, str]:
    """The backend ``cfg`` asks for, and why it was chosen; ``ebpf`` that cannot run is an ``AacoError``."""
    proc = lambda: ProcBackend(all_tasks=cfg.all_tasks, max_threads=cfg.max_threads)  # noqa: E731
    if cfg.backend == "proc":
        return proc(), "configured (backend: proc)"
    from aaco.agent.sources.sched.ebpf import EbpfBackend, EbpfSettings
    from aaco.agent.sources.sched.host import unavailable_reason

    reason = unavailable_reason()
    if reason is None:
        settings = EbpfSettings(
            all_tasks=cfg.all_tasks,
            max_targets=cfg.max_processes,
            max_threads=cfg.max_threads,
            offcpu_threshold_ns=int(cfg.offcpu_threshold_ms * 1e6),
            max_events_per_drain=cfg.max_offcpu_events,
        )
        try:
            backend = EbpfBackend(settings)
        except Exception as exc:  # bcc reports compile and load failures as plain exceptions
            reason = f"loading the eBPF program failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
        else:
            why = (
                "configured (backend: ebpf)" if cfg.backend == "ebpf" else "root, bcc and kernel tracepoints available"
            )
            how = {
                "task": "BTF-typed tracepoints, threads in task storage",
                "raw": f"raw tracepoints, task offsets from BTF; task storage unused: {backend.fallback}",
                "classic": f"classic tracepoints; task storage unused: {backend.fallback}",
            }[backend.attach]
            return backend, f"{why}; bcc on sched/exceptions/task tracepoints ({how}), aggregated in the kernel"
    if cfg.backend == "ebpf":
        raise AacoError(f"the eBPF backend cannot run here: {reason}", subject="sched.backend", hint="use auto or proc")
    return proc(), reason


class SchedCollector:
    """A backend and its targets: what the source and ``aaco sched`` both drive."""

    def __init__(self, cfg: SchedSourceConfig) -> None:
        self.cfg = cfg
        self.backend, self.reason = select_backend(cfg)
        announce(self.backend.name, self.reason)
        self.resolver = TargetResolver(
            pids=list(cfg.pids),
            cgroups=list(cfg.cgroups),
            gpu=cfg.gpu_processes,
            include_self=cfg.include_self,
            max_processes=cfg.max_processes,
        )
        self.targets: set[int] = set()

    def refresh_targets(self) -> Resolution:
        """Resolve the targets again and hand them to the backend (a no-op resolution when tracing all)."""
        if self.cfg.all_tasks:
            return Resolution()
        res = self.resolver.resolve()
        self.backend.set_targets(res.tgids)
        self.targets = res.tgids
        return res

    def drain(self) -> Drain:
        """One interval's deltas."""
        return self.backend.drain()

    def close(self) -> None:
        """Unload (eBPF) and forget everything."""
        self.backend.close()


class SchedSource(Source):
    """Drains a scheduler backend every interval and publishes ``sched`` rows."""

    type = "sched"

    def __init__(self, config: SchedSourceConfig, name: str) -> None:
        super().__init__(name)
        self.config = config
        self.collector: SchedCollector | None = None
        self._reported: set[tuple[str, str]] = set()

    def run(self, ctx: SourceContext) -> None:
        """Resolve targets, drain every interval, publish; unload on stop."""
        cfg = self.config
        try:
            self.collector = collector = SchedCollector(cfg)
        except AacoError as exc:
            ctx.problem(self.name, exc.subject or self.name, "backend", str(exc), fatal=True, count=1)
            return
        rows = 0
        try:
            next_discovery = 0.0
            while True:
                if time.monotonic() >= next_discovery:
                    self._report(ctx, collector.refresh_targets())
                    next_discovery = time.monotonic() + cfg.discover_interval_s
                stopping = ctx.sleep(cfg.interval_s)
                drain = collector.drain()
                for reason, n in drain.dropped.items():
                    ctx.stats.inc(EVENTS_DROPPED, n, component=self.name, reason=reason)
                table = drain_to_table(drain, node=ctx.node, source=self.name)
                if table.num_rows:
                    ctx.publish(self.name, "sched", table, durable=False, live=True)
                    rows += table.num_rows
                if stopping:
                    break
        finally:
            collector.close()
            ctx.record(SourceRecord(self.name, "scheduler", f"sched-{collector.backend.name}", {"sched": rows}, None))

    def _report(self, ctx: SourceContext, res: Resolution) -> None:
        """Targets that could not be found: counted and logged once per cause (they are retried)."""
        causes = [
            (f"pid {pid}", "no_such_process", f"pid {pid} does not exist; watching the others", 1)
            for pid in res.missing_pids
        ]
        causes += [
            (str(cg), "no_such_cgroup", f"cgroup {cg} does not exist (no cgroup.procs)", 1)
            for cg in res.missing_cgroups
        ]
        if res.over_cap:
            msg = f"{res.over_cap} process(es) beyond max_processes={self.config.max_processes} are not traced"
            causes.append(("targets", "max_processes", msg, res.over_cap))
        for subject, reason, message, count in causes:
            if (subject, reason) not in self._reported and len(self._reported) < 10_000:
                self._reported.add((subject, reason))
                ctx.problem(self.name, subject, reason, message, fatal=False, count=count)


def create(config: SchedSourceConfig, name: str) -> SchedSource:
    """Factory used by the source registry."""
    return SchedSource(config, name)
