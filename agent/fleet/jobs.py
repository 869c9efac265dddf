"""Distributed training jobs across the fleet's lakes (``aaco fleet jobs``; docs/jobs.md, "Across the fleet").

HTA's definitions are not written again in SQL: DuckDB selects each job's iteration and kernel rows
and hands them, as conformed batches, to the node's own jobs analyzer (``analyzers/jobs.py``), whose
result is read back. So a node's ``analysis.json`` and the fleet agree by construction.

1. **The jobs** (``plan``). Every rank trace in the lake (rows of one node, job, rank and ``run_id``)
   has a span: its iterations' first start to last end, else its kernels'. A job name of the derived
   form (``<backend>-<world_size>x-<UTC second>``, ``contract.jobs.derived_name``) was given by the node
   that read the trace, from the ranks that node held; three nodes holding some ranks each can have
   named one job three ways. So such rows are named again with ``contract.jobs.derive_jobs`` over
   every such span in the lake; names that came from the configuration or the process environment are
   kept as they are.
2. **Each job** (``analyze``): its iterations (by rank, run and start), then its kernels (the same
   order), in batches of ``MAX_BATCH_ROWS``, into a ``JobsAnalyzer`` of its own, which keeps every
   step of the selection (``window_steps`` = the most steps of a rank): HTA's figures over the whole
   trace, not the live agent's recent window. The temporal breakdown and overlap are a rank's latest
   window (run), as the analyzer reports them.

``analyze_at`` does step 2 from a lake URL alone, so a distributed engine can run one task per job
(docs/fleet.md, "Beyond one machine: Dask").
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.analyzers.jobs import JobsAnalyzer, JobsSettings
from aaco.analyzers.jobs_result import JobView
from aaco.contract.channel import MAX_BATCH_ROWS
from aaco.contract.jobs import RankSpan, derive_jobs
from aaco.contract.schemas import SCHEMAS, EventBatch, conform

_DERIVED: Final = re.compile(r"^(?P<backend>.+)-(?P<world>\d+)x-\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
_MEMBERS: Final = "_job_members"

# One row per rank trace (node, job, rank, run): its backend, world size, steps and span.
SPANS: Final = """
WITH i AS (SELECT node, job, rank, coalesce(run_id, '') AS run, max(world_size) AS world_size,
                  max(dist_backend) AS backend, min(start_ns) AS start_ns, max(end_ns) AS end_ns,
                  count(DISTINCT iteration) AS steps
           FROM iterations WHERE job IS NOT NULL AND rank IS NOT NULL GROUP BY ALL),
     k AS (SELECT node, job, rank, coalesce(run_id, '') AS run, max(world_size) AS world_size,
                  max(dist_backend) AS backend, min(start_ns) AS start_ns, max(end_ns) AS end_ns
           FROM kernels WHERE job IS NOT NULL AND rank IS NOT NULL GROUP BY ALL)
SELECT node, job, rank, run, coalesce(i.world_size, k.world_size) AS world_size,
       coalesce(i.backend, k.backend) AS backend, coalesce(i.start_ns, k.start_ns) AS start_ns,
       coalesce(i.end_ns, k.end_ns) AS end_ns, coalesce(i.steps, 0) AS steps
FROM k FULL OUTER JOIN i USING (node, job, rank, run)
ORDER BY node, job, rank, run
"""


@dataclass(frozen=True)
class Member:
    """One rank trace of a job as the lake holds it: where it is and the name its node gave it."""

    node: str
    job: str
    rank: int
    run: str  # run_id, '' when none
    steps: int


@dataclass(frozen=True)
class FleetJob:
    """A job of the fleet: its name, the rank traces that are its ranks."""

    name: str
    members: tuple[Member, ...]

    @property
    def ranks(self) -> int:
        """Distinct ranks."""
        return len({m.rank for m in self.members})

    def settings(self, stragglers: int = 2) -> JobsSettings:
        """The analyzer's bounds for this job: all of its ranks and every step of each."""
        steps = max([m.steps for m in self.members] or [0])
        return JobsSettings(
            max_jobs=1, max_ranks=max(64, self.ranks), window_steps=max(16, steps), stragglers=stragglers
        )


def is_derived(job: str, backend: str | None, world_size: int | None) -> bool:
    """Whether ``job`` has the form ``derived_name`` gives for this backend and world size."""
    m = _DERIVED.match(job)
    return bool(m and backend and world_size and m["backend"] == backend.lower() and int(m["world"]) == world_size)


def fleet_names(spans: Iterable[dict[str, Any]]) -> dict[tuple[str, str, int, str], str]:
    """(node, job, rank, run) -> the job's name in the fleet: derived names derived again over every span."""
    out: dict[tuple[str, str, int, str], str] = {}
    derived = []
    for s in spans:
        key = (s["node"], s["job"], int(s["rank"]), s["run"])
        out[key] = s["job"]
        if is_derived(s["job"], s["backend"], s["world_size"]) and s["start_ns"] is not None:
            derived.append(RankSpan(key, s["backend"], int(s["world_size"]), int(s["start_ns"]), int(s["end_ns"])))
    out.update(derive_jobs(derived))  # type: ignore[arg-type]
    return out


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def plan(con: duckdb.DuckDBPyConnection) -> list[FleetJob]:
    """The fleet's jobs, by name."""
    spans = _rows(con, SPANS)
    names = fleet_names(spans)
    jobs: dict[str, list[Member]] = {}
    for s in spans:
        key = (s["node"], s["job"], int(s["rank"]), s["run"])
        jobs.setdefault(names[key], []).append(Member(*key, int(s["steps"])))
    return [FleetJob(name, tuple(members)) for name, members in sorted(jobs.items())]


def _members_table(job: FleetJob) -> pa.Table:
    return pa.table(
        {
            "node": pa.array([m.node for m in job.members], pa.string()),
            "job": pa.array([m.job for m in job.members], pa.string()),
            "rank": pa.array([m.rank for m in job.members], pa.int64()),
            "run": pa.array([m.run for m in job.members], pa.string()),
        }
    )


def _select(kind: str, order: str, stored: int) -> str:
    """The kind's columns (the fleet's job name as ``job``) of the job's rank traces, in the analyzer's order.

    Parameters: the fleet's name, then the ``stored`` names the rows carry (a filter the scan can use).
    """
    cols = ", ".join(f"t.{f.name}" if f.name != "job" else "? AS job" for f in SCHEMAS[kind])
    names = ", ".join("?" * stored)
    return (
        f"SELECT {cols} FROM {kind} t JOIN {_MEMBERS} m ON t.node = m.node AND t.job = m.job AND t.rank = m.rank "
        f"AND coalesce(t.run_id, '') = m.run WHERE t.job IN ({names}) ORDER BY {order}"
    )


ITERATION_ORDER: Final = "t.rank, m.run, t.start_ns, t.end_ns, t.iteration"
KERNEL_ORDER: Final = "t.rank, m.run, t.start_ns, t.end_ns, t.stream, t.correlation_id, t.name"


def _batches(con: duckdb.DuckDBPyConnection, kind: str, order: str, job: FleetJob) -> Iterator[EventBatch]:
    stored = sorted({m.job for m in job.members})
    rel = con.sql(_select(kind, order, len(stored)), params=[job.name, *stored])
    # a stream of record batches: to_arrow_reader in DuckDB 2, fetch_arrow_reader before
    reader = getattr(rel, "to_arrow_reader", None) or rel.fetch_arrow_reader
    for batch in reader(MAX_BATCH_ROWS):
        if batch.num_rows:
            yield EventBatch(kind, conform(kind, batch), "fleet")


def analyze(con: duckdb.DuckDBPyConnection, job: FleetJob, stragglers: int = 2) -> dict[str, Any]:
    """One job's answer (``aaco fleet jobs --json``'s shape), from the analyzer fed with its rows."""
    analyzer = JobsAnalyzer(job.settings(stragglers))
    con.register(_MEMBERS, _members_table(job))
    try:
        durations: dict[int, list[int]] = {}
        for item in _batches(con, "iterations", ITERATION_ORDER, job):
            analyzer.update(item)
            b = item.batch
            ns = pc.subtract(b.column("end_ns"), b.column("start_ns"))
            for rank, d in zip(b.column("rank").to_pylist(), ns.to_pylist(), strict=True):
                durations.setdefault(rank, []).append(d)
        for item in _batches(con, "kernels", KERNEL_ORDER, job):
            analyzer.update(item)
        collectives = _rows(con, COLLECTIVES)
    finally:
        con.unregister(_MEMBERS)
    views = analyzer.snapshot().jobs
    if not views:
        return {"job": job.name, "world_size": None, "backend": None, "ranks": [], "stragglers": [], "collectives": []}
    return answer(views[0], job, durations, collectives)


COLLECTIVES: Final = f"""
SELECT t.collective AS op, count(*) AS count, sum(t.end_ns - t.start_ns) / 1e9 AS time_s
FROM kernels t JOIN {_MEMBERS} m ON t.node = m.node AND t.job = m.job AND t.rank = m.rank
     AND coalesce(t.run_id, '') = m.run
WHERE t.collective IS NOT NULL
GROUP BY t.collective ORDER BY t.collective
"""


def _pct(figures: dict[str, Any], key: str) -> float | None:
    v = figures.get(key)
    return None if v is None else float(v)


def answer(
    view: JobView, job: FleetJob, durations: dict[int, list[int]], collectives: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON of one job: ranks with HTA's figures and step times, stragglers, collectives."""
    ranks = []
    for r in view.ranks:
        figures = r.figures.to_dict() if r.figures else {}
        steps = durations.get(r.rank, [])
        ranks.append(
            {
                "rank": r.rank,
                "node": r.node,
                "idle_pct": _pct(figures, "idle_time_pctg"),
                "compute_pct": _pct(figures, "compute_time_pctg"),
                "non_compute_pct": _pct(figures, "non_compute_time_pctg"),
                "comm_comp_overlap_pct": _pct(figures, "comp_comm_overlap_pctg"),
                "step_p50_s": r.step_p50_s,
                "step_p95_s": float(np.percentile(np.array(steps, np.float64) / 1e9, 95)) if steps else None,
                "critical_path": r.critical.to_dict() if r.critical else None,
            }
        )
    bus = view.bus_bandwidth
    return {
        "job": view.job,
        "world_size": view.world_size,
        "backend": view.backend,
        "nodes": sorted({m.node for m in job.members}),
        "ranks": ranks,
        "stragglers": list(view.stragglers.stragglers) if view.stragglers else [],
        "collectives": [
            {
                "op": c["op"],
                "count": int(c["count"]),
                "time_s": float(c["time_s"]),
                "bus_bandwidth_gbps": bus[c["op"]] / 1e9 if c["op"] in bus else None,
            }
            for c in collectives
        ],
    }


def jobs(con: duckdb.DuckDBPyConnection, stragglers: int = 2) -> dict[str, Any]:
    """``{"jobs": [...], "slurm_jobs": [...]}``: every traced job of the lake and every Slurm job on its GPUs.

    Both in the views' time window, by name (``slurm_jobs.slurm_jobs``: docs/jobs.md, "Slurm").
    """
    from aaco.agent.fleet.slurm_jobs import slurm_jobs

    return {"jobs": [analyze(con, job, stragglers) for job in plan(con)], "slurm_jobs": slurm_jobs(con)}


def analyze_at(url: str, since_ns: int | None, job: FleetJob, stragglers: int = 2) -> dict[str, Any]:
    """One job's answer read from the lake at ``url`` (a task of its own: everything it needs is in its arguments)."""
    from aaco.agent.fleet.lake import FleetLake

    with FleetLake.open(url).connect(since_ns) as con:
        return analyze(con, job, stragglers)
