"""``aaco sched``: scheduler interference of processes over a few seconds.

Context switches, runqueue latency, on/off-CPU time and page faults per process, measured by the
same backends as the ``sched`` source (eBPF as root with bcc, else ``/proc``).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from typing import Annotated, Any

import typer

from aaco.agent.cli.common import AsJson, LogLevel, fail, out_console, print_note, setup_logging, table
from aaco.agent.cli.progress import progress_for
from aaco.contract.errors import AacoError

FIELDS = (
    "context_switches",
    "voluntary",
    "involuntary",
    "runqueue_latency_p50_s",
    "runqueue_latency_p99_s",
    "oncpu_s",
    "offcpu_s",
    "page_faults",
)


def _check_pids(pids: list[int]) -> list[int]:
    """The processes of ``pids`` (a thread id stands for its process); a missing one is an error."""
    from aaco.agent.sources.sched.proc import alive
    from aaco.agent.sources.sched.targets import tgid_of

    out: list[int] = []
    for pid in pids:
        tgid = tgid_of(pid)
        if tgid is None or not alive(tgid):
            raise AacoError("no such process", subject=f"--pid {pid}")
        if tgid not in out:
            out.append(tgid)
    return out


def _row(w: dict[str, Any]) -> dict[str, Any]:
    return {
        "pid": w["pid"],
        "comm": w["comm"],
        **{k: w[k] for k in FIELDS},
        "interference_ratio": w["interference_ratio_overall"],
        "fault_penalty_index": w["fault_penalty_index_overall"],
        "threads": w["threads"],
        "exited": w["exited"],
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.6f}" if abs(v) < 1 else f"{v:.3f}"
    return str(v)


def sched(
    pid: Annotated[
        list[int] | None,
        typer.Option(
            "--pid", "-p", metavar="PID", help="Process to trace (repeat for several; a tid means its process)."
        ),
    ] = None,
    all_tasks: Annotated[bool, typer.Option("--all", help="Trace every task on the machine.")] = False,
    duration: Annotated[float, typer.Option("--duration", "-d", min=0.1, help="Seconds to trace.")] = 5.0,
    as_json: AsJson = False,
    backend: Annotated[
        str, typer.Option("--backend", help="auto (eBPF where it can run, else /proc), ebpf or proc.")
    ] = "auto",
    top: Annotated[
        int, typer.Option("--top", min=1, help="With --all: show this many processes (most switches).")
    ] = 20,
    no_progress: Annotated[bool, typer.Option("--no-progress", help="No progress on stderr.")] = False,
    log_level: LogLevel = "warning",
) -> None:
    """Trace processes' scheduling for a while and print, per pid, what held them off the CPU.

    Context switches (voluntary, involuntary), runqueue latency p50/p99, on-CPU and off-CPU
    seconds and page faults, and which backend measured them (ebpf as root with bcc, else proc).
    """
    setup_logging(log_level)
    from pydantic import ValidationError

    from aaco.agent.sources.sched.proc import alive
    from aaco.agent.sources.sched.source import SchedCollector, SchedSourceConfig
    from aaco.analyzers.sched import SchedAnalyzer
    from aaco.contract.sched import drain_to_table
    from aaco.contract.schemas import EventBatch, conform

    try:
        if bool(pid) == all_tasks:
            raise AacoError("give --pid PID (one or more) or --all, not both and not neither", subject="aaco sched")
        if backend not in ("auto", "ebpf", "proc"):
            raise AacoError(f"unknown backend {backend!r}: use auto, ebpf or proc", subject="--backend")
        tgids = _check_pids(pid or [])
        try:
            cfg = SchedSourceConfig(
                backend=backend,  # type: ignore[arg-type]
                gpu_processes=False,
                pids=tgids,
                all_tasks=all_tasks,
                interval_s=min(duration, 5.0),
            )
        except ValidationError as exc:
            raise AacoError(str(exc).splitlines()[-1], subject="aaco sched") from None
        collector = SchedCollector(cfg)
    except AacoError as exc:
        raise fail(exc) from None
    analyzer = SchedAnalyzer(max_workloads=1 << 20, retain_s=1e9, stale_s=1e9)
    started = time.monotonic()
    bars = progress_for(not no_progress and not as_json)
    task = "tracing (s)"
    try:
        with bars if bars is not None else contextlib.nullcontext():
            if bars is not None:
                bars.start(task, math.ceil(duration))
            collector.refresh_targets()
            deadline, next_drain, shown = started + duration, started + cfg.interval_s, 0
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(max(0.0, min(left, next_drain - time.monotonic(), 1.0)))
                now = time.monotonic()
                if now >= next_drain or now >= deadline:
                    next_drain = now + cfg.interval_s
                    drained = drain_to_table(collector.drain(), node="local", source="sched")
                    if drained.num_rows:
                        analyzer.update(EventBatch("sched", conform("sched", drained), "sched"))
                if bars is not None and int(now - started) > shown:
                    bars.advance(task, int(now - started) - shown)
                    shown = int(now - started)
            if bars is not None:
                bars.finish(task)
    except KeyboardInterrupt:
        print_note("interrupted: reporting what was measured")
    finally:
        collector.close()
    elapsed = time.monotonic() - started
    workloads = analyzer.snapshot().to_dict()["workloads"]
    if all_tasks:
        workloads = sorted(workloads, key=lambda w: -w["context_switches"])[:top]
    else:
        known = {w["pid"]: w for w in workloads}
        workloads = [known[p] for p in tgids if p in known] + [w for w in workloads if w["pid"] not in tgids]
    rows = [_row(w) for w in workloads]
    if not all_tasks:
        seen = {r["pid"] for r in rows}
        nothing = {k: None if k.startswith("runqueue") else 0 for k in FIELDS}
        rows += [{"pid": p, "comm": None, **nothing, "exited": not alive(p)} for p in tgids if p not in seen]
    doc = {"backend": collector.backend.name, "reason": collector.reason, "duration_s": round(elapsed, 3), "pids": rows}
    if as_json:
        typer.echo(json.dumps(doc))
        return
    short = {"context_switches": "switches", "runqueue_latency_p50_s": "rq p50 s", "runqueue_latency_p99_s": "rq p99 s"}
    headers = [short.get(col, col) for col in ("pid", "comm", *FIELDS)]
    out = table(*headers, right=set(headers) - {"comm"}, title=f"aaco sched: {elapsed:.1f} s, backend {doc['backend']}")
    for r in rows:
        out.add_row(*(_fmt(r.get(c)) for c in ("pid", "comm", *FIELDS)))
    out_console.print(out)
