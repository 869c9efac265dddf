"""The fleet's questions, as SQL over the lake's views (``kernels``, ``iterations``, ``telemetry``, ``versions``).

Each function returns plain rows (dicts) in a stable order, so ``--json`` and the tables print the
same thing, and the same SQL runs unchanged on Spark SQL, Trino or Athena over the same files
(docs/fleet.md). Latency is an iteration's ``end_ns - start_ns``.
"""

from __future__ import annotations

import statistics
from typing import Any

import duckdb

from aaco.agent.fleet.dimensions import TOP_FAMILIES, activity_cte, families_sql, models_by_version_sql, throttle_cte

OUTLIER_Z = 3.5  # modified z-score beyond which a node is an outlier (Iglewicz and Hoaglin)
MAD_SCALE = 0.6745  # makes the MAD of normal data comparable to a standard deviation
MIN_NODES = 3  # a median and a spread need at least three nodes

SUMMARY = """
WITH k AS (SELECT node, count(*) AS kernels, list(DISTINCT model) FILTER (WHERE model IS NOT NULL) AS models
           FROM kernels GROUP BY node),
     i AS (SELECT node, count(*) AS iterations, list(DISTINCT model) FILTER (WHERE model IS NOT NULL) AS models
           FROM iterations GROUP BY node)
SELECT node, coalesce(k.kernels, 0) AS kernels, coalesce(i.iterations, 0) AS iterations,
       list_sort(list_distinct(list_concat(coalesce(k.models, []), coalesce(i.models, [])))) AS models
FROM k FULL OUTER JOIN i USING (node)
ORDER BY node
"""

NODES = f"""
WITH {activity_cte()},
{throttle_cte()},
k AS (SELECT node, count(*) AS kernels, count(DISTINCT device) AS devices,
             sum(end_ns - start_ns) / 1e9 AS busy_s, (max(end_ns) - min(start_ns)) / 1e9 AS span_s,
             min(start_ns) AS first_ns, max(end_ns) AS last_ns
      FROM kernels GROUP BY node),
a AS (SELECT node, CAST(sum(busy_ns) AS DOUBLE) / sum(greatest(window_ns, 1)) AS active_ratio
      FROM kw GROUP BY node),
t AS (SELECT node, sum(CASE WHEN throttled = 1 THEN step_ns ELSE 0 END) / 1e9 AS throttled_s,
             CAST(sum(CASE WHEN throttled = 1 THEN step_ns ELSE 0 END) AS DOUBLE) / nullif(sum(step_ns), 0)
               AS throttled_share
      FROM ts GROUP BY node)
SELECT k.node, kernels, devices, busy_s, span_s, active_ratio, throttled_s, throttled_share, first_ns, last_ns
FROM k LEFT JOIN a USING (node) LEFT JOIN t USING (node)
ORDER BY k.node
"""

MODELS = f"""
WITH {activity_cte(("model",))},
{throttle_cte()},
i AS (SELECT node, model, count(*) AS iterations,
             quantile_cont((end_ns - start_ns) / 1e9, 0.5) AS p50_s,
             quantile_cont((end_ns - start_ns) / 1e9, 0.95) AS p95_s,
             quantile_cont((end_ns - start_ns) / 1e9, 0.99) AS p99_s,
             max(graph_nodes) AS graph_nodes
      FROM iterations WHERE model IS NOT NULL GROUP BY node, model),
k AS (SELECT node, model, count(*) AS kernels FROM kernels
      WHERE model IS NOT NULL AND iteration IS NOT NULL AND kind = 'kernel' GROUP BY node, model),
a AS (SELECT node, model, CAST(sum(busy_ns) AS DOUBLE) / sum(greatest(window_ns, 1)) AS active_ratio
      FROM kw GROUP BY node, model),
tk AS (SELECT DISTINCT node FROM tf),
it AS (SELECT i.node, i.model, CAST(count(tn.node) AS DOUBLE) / count(*) AS throttled_share
       FROM iterations i JOIN tk ON tk.node = i.node
            LEFT JOIN tn ON tn.node = i.node AND i.start_ns >= tn.from_ns AND i.start_ns < tn.to_ns
       WHERE i.model IS NOT NULL GROUP BY i.node, i.model)
SELECT model, node, iterations, p50_s, p95_s, p99_s, coalesce(k.kernels, 0) AS kernels,
       CAST(coalesce(k.kernels, 0) AS DOUBLE) / iterations AS kernels_per_iteration, graph_nodes,
       CASE WHEN graph_nodes > 0 THEN CAST(coalesce(k.kernels, 0) AS DOUBLE) / iterations / graph_nodes END AS kar,
       active_ratio, throttled_share
FROM i LEFT JOIN k USING (node, model) LEFT JOIN a USING (node, model) LEFT JOIN it USING (node, model)
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
    """Per node: kernels, devices, GPU busy s, span, device active ratio, throttled time, top families."""
    rows = _rows(con, NODES)
    top = _top_families(families(con), by_model=False)
    for row in rows:
        row["top_families"] = top.get((row["node"],), [])
    return rows


def models(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per model and node: p50/p95/p99, kernels per iteration, KAR, active ratio, throttled share, families."""
    rows = _rows(con, MODELS)
    top = _top_families(families(con), by_model=True)
    for row in rows:
        row["top_families"] = top.get((row["node"], row["model"]), [])
    return rows


def families(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per node, model (``unknown`` outside iterations) and kernel family: kernels, time, share of time."""
    rows = _rows(con, families_sql())
    totals: dict[tuple[str, str], float] = {}
    for r in rows:
        totals[(r["node"], r["model"])] = totals.get((r["node"], r["model"]), 0.0) + r["time_s"]
    for r in rows:
        total = totals[(r["node"], r["model"])]
        r["share"] = r["time_s"] / total if total > 0 else None
    return rows


def models_by_version(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Per model, node and the versions in force at each iteration's start: iterations and p50/p95/p99."""
    return _rows(con, models_by_version_sql())


def _top_families(rows: list[dict[str, Any]], by_model: bool, n: int = TOP_FAMILIES) -> dict[tuple[str, ...], list]:
    """The ``n`` families with the most kernel time per node (or per node and model), with their share."""
    time: dict[tuple[str, ...], dict[str, float]] = {}
    for r in rows:
        key = (r["node"], r["model"]) if by_model else (r["node"],)
        fams = time.setdefault(key, {})
        fams[r["family"]] = fams.get(r["family"], 0.0) + r["time_s"]
    out: dict[tuple[str, ...], list] = {}
    for key, fams in time.items():
        total = sum(fams.values())
        ranked = sorted(fams.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        out[key] = [{"family": f, "share": t / total if total > 0 else None} for f, t in ranked]
    return out


def _p95_by_model(con: duckdb.DuckDBPyConnection) -> dict[str, list[dict[str, Any]]]:
    """The rows of ``models`` that have a p95 latency, per model."""
    by_model: dict[str, list[dict[str, Any]]] = {}
    for row in models(con):
        if row["p95_s"] is not None:
            by_model.setdefault(row["model"], []).append(row)
    return by_model


def outlier_scope(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Per model with a p95 latency, on how many nodes it ran: ``outliers`` judges those on ``MIN_NODES`` or more."""
    return {model: len(rows) for model, rows in sorted(_p95_by_model(con).items())}


def outliers(con: duckdb.DuckDBPyConnection, z: float = OUTLIER_Z) -> list[dict[str, Any]]:
    """Per model, the nodes whose p95 latency sits far from the fleet's (modified z-score over nodes).

    For a model on at least three nodes: median and MAD of the nodes' p95, and per node
    ``0.6745 * (p95 - median) / MAD``; beyond ``z`` the node is an outlier. With MAD = 0 (most nodes
    equal) any node off the median by more than 10 % of it is. The rule is in docs/fleet.md.
    """
    out = []
    for model, rows in sorted(_p95_by_model(con).items()):
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
