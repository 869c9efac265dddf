"""The fleet's questions, as SQL over the lake's views (``kernels``, ``iterations``, ``telemetry``).

Each function returns plain rows (dicts) in a stable order, so ``--json`` and the tables print the
same thing, and the same SQL runs unchanged on Spark SQL, Trino or Athena over the same files
(docs/fleet.md). Latency is an iteration's ``end_ns - start_ns``.
"""

from __future__ import annotations

import statistics
from typing import Any

import duckdb

OUTLIER_Z = 3.5  # modified z-score beyond which a node is an outlier (Iglewicz and Hoaglin)
MAD_SCALE = 0.6745  # makes the MAD of normal data comparable to a standard deviation
MIN_NODES = 3  # a median and a spread need at least three nodes

SUMMARY = """
WITH k AS (SELECT node, count(*) AS kernels FROM kernels GROUP BY node),
     i AS (SELECT node, count(*) AS iterations FROM iterations GROUP BY node),
     m AS (SELECT node, list(DISTINCT model ORDER BY model) AS models
           FROM (SELECT node, model FROM iterations UNION ALL SELECT node, model FROM kernels)
           WHERE model IS NOT NULL GROUP BY node),
     n AS (SELECT node FROM k UNION SELECT node FROM i)
SELECT n.node, coalesce(k.kernels, 0) AS kernels, coalesce(i.iterations, 0) AS iterations,
       coalesce(m.models, []) AS models
FROM n LEFT JOIN k USING (node) LEFT JOIN i USING (node) LEFT JOIN m USING (node)
ORDER BY n.node
"""

NODES = """
SELECT node, count(*) AS kernels, count(DISTINCT device) AS devices,
       sum(end_ns - start_ns) / 1e9 AS busy_s,
       (max(end_ns) - min(start_ns)) / 1e9 AS span_s,
       min(start_ns) AS first_ns, max(end_ns) AS last_ns
FROM kernels GROUP BY node ORDER BY node
"""

MODELS = """
WITH i AS (SELECT node, model, count(*) AS iterations,
                  quantile_cont((end_ns - start_ns) / 1e9, 0.5) AS p50_s,
                  quantile_cont((end_ns - start_ns) / 1e9, 0.95) AS p95_s,
                  quantile_cont((end_ns - start_ns) / 1e9, 0.99) AS p99_s
           FROM iterations WHERE model IS NOT NULL GROUP BY node, model),
     k AS (SELECT node, model, count(*) AS kernels FROM kernels WHERE model IS NOT NULL GROUP BY node, model)
SELECT model, node, iterations, p50_s, p95_s, p99_s, coalesce(k.kernels, 0) AS kernels,
       coalesce(k.kernels, 0) / iterations AS kernels_per_iteration
FROM i LEFT JOIN k USING (node, model)
ORDER BY model, node
"""


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict[str, Any]]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def summary(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Per node: kernels, iterations and the models seen (``{"nodes": [...]}``)."""
    return {"nodes": _rows(con, SUMMARY)}


def nodes(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per node: kernels, devices, GPU busy seconds (kernel time summed) and the time span covered."""
    return _rows(con, NODES)


def models(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per model and node: iterations, latency p50/p95/p99 and kernels per iteration."""
    return _rows(con, MODELS)


def outliers(con: duckdb.DuckDBPyConnection, z: float = OUTLIER_Z) -> list[dict[str, Any]]:
    """Per model, the nodes whose p95 latency sits far from the fleet's (modified z-score over nodes).

    For a model on at least three nodes: median and MAD of the nodes' p95, and per node
    ``0.6745 * (p95 - median) / MAD``; beyond ``z`` the node is an outlier. With MAD = 0 (most nodes
    equal) any node off the median by more than 10 % of it is. The rule is in docs/fleet.md.
    """
    by_model: dict[str, list[dict[str, Any]]] = {}
    for row in models(con):
        if row["p95_s"] is not None:
            by_model.setdefault(row["model"], []).append(row)
    out = []
    for model, rows in sorted(by_model.items()):
        if len(rows) < MIN_NODES:
            continue
        p95 = [r["p95_s"] for r in rows]
        median = statistics.median(p95)
        mad = statistics.median(abs(x - median) for x in p95)
        for r in rows:
            if mad > 0:
                score = MAD_SCALE * (r["p95_s"] - median) / mad
                far = abs(score) > z
            else:
                score = None
                far = abs(r["p95_s"] - median) > 0.1 * median
            if far:
                out.append(
                    {
                        "model": model,
                        "node": r["node"],
                        "p95_s": r["p95_s"],
                        "fleet_median_p95_s": median,
                        "modified_z": score,
                        "nodes": len(rows),
                    }
                )
    return out
