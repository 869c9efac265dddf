"""Slurm jobs on the fleet's GPUs (``aaco fleet jobs``; docs/jobs.md, "Slurm"), from the lake's telemetry rows.

The ``smi`` source writes the Slurm jobs on a GPU into its telemetry rows' attributes
(``aaco.job.name``, ``aaco.job.user``, ``aaco.job.partition``; several jobs comma-joined). Per job:
the nodes and GPUs (``node:device``) that carried it, its first and last sample, the GPUs' mean
utilisation and power over its samples (a GPU shared by jobs counts whole for each), its user and
partition where a row named it alone. A job traced by its ranks has the same name
(``slurm-<id>``) in the jobs list beside it.
"""

from __future__ import annotations

from typing import Any, Final

import duckdb

from aaco.contract.jobs import ATTR_JOB, ATTR_JOB_PARTITION, ATTR_JOB_USER
from aaco.contract.telemetry import POWER, UTILIZATION

MAX_JOBS: Final = 10_000

_SQL: Final = f"""
WITH t AS (
    SELECT node, device, ts_ns, metric, value,
           attributes['{ATTR_JOB}'] AS names,
           attributes['{ATTR_JOB_USER}'] AS users,
           attributes['{ATTR_JOB_PARTITION}'] AS parts
    FROM telemetry
    WHERE attributes['{ATTR_JOB}'] IS NOT NULL AND attributes['{ATTR_JOB}'] <> ''
), j AS (
    SELECT unnest(string_split(names, ',')) AS job, node, device, ts_ns, metric, value, names, users, parts FROM t
)
SELECT job,
       list(DISTINCT node ORDER BY node) AS nodes,
       list(DISTINCT node || ':' || coalesce(device, '?') ORDER BY node || ':' || coalesce(device, '?')) AS gpus,
       min(ts_ns) AS first_ns,
       max(ts_ns) AS last_ns,
       avg(value) FILTER (WHERE metric = '{UTILIZATION}') AS utilization,
       avg(value) FILTER (WHERE metric = '{POWER}') AS power_w,
       min(users) FILTER (WHERE NOT contains(names, ',')) AS job_user,
       min(parts) FILTER (WHERE NOT contains(names, ',')) AS job_partition
FROM j
WHERE job <> ''
GROUP BY job
ORDER BY job
LIMIT {MAX_JOBS}
"""


def slurm_jobs(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Every Slurm job the lake's GPU telemetry names (in the views' time window), by name."""
    cur = con.execute(_SQL)
    cols = [d[0] for d in cur.description]
    out = []
    for row in cur.fetchall():
        r = dict(zip(cols, row, strict=True))
        out.append(
            {
                "job": r["job"],
                "nodes": list(r["nodes"]),
                "gpus": list(r["gpus"]),
                "first_ns": int(r["first_ns"]),
                "last_ns": int(r["last_ns"]),
                "utilization": None if r["utilization"] is None else float(r["utilization"]),
                "power_w": None if r["power_w"] is None else float(r["power_w"]),
                "user": r["job_user"] or None,
                "partition": r["job_partition"] or None,
            }
        )
    return out
