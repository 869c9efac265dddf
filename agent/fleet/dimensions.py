"""The fleet's dimensions beyond counts and latency, as SQL over the lake's views (docs/fleet.md).

Device activity, throttled time, kernel families and versions, each defined as the node's own
analyzers define them (``analyzers.activity``, ``analyzers.throttle``, ``contract.kernels``) and
written in SQL that Spark SQL and Trino run as well: window functions with ``ROWS`` frames and
``lead``, ``greatest``/``least``, ``CASE``; no engine's special joins. Where the SQL simplifies
what an analyzer does, docs/fleet.md says how.
"""

from __future__ import annotations

from typing import Final, Literal

from aaco.contract.kernels import FAMILY_RULES, KIND_FAMILIES
from aaco.contract.telemetry import THROTTLE
from aaco.contract.versions import FIELDS as VERSION_FIELDS

Dialect = Literal["duckdb", "spark", "trino"]

STALE_NS: Final = 60 * 10**9  # analyzers.throttle.stale_s: a gap between samples counts up to this
TOP_FAMILIES: Final = 3  # families listed per node or model, by kernel time

_MATCH: Final[dict[str, str]] = {
    "duckdb": "regexp_matches({col}, '{rx}')",
    "trino": "regexp_like({col}, '{rx}')",
    "spark": "{col} RLIKE '{rx}'",
}


def family_case(dialect: Dialect = "duckdb", name: str = "name", kind: str = "kind") -> str:
    """A SQL ``CASE`` giving a kernel's family from ``contract.kernels.FAMILY_RULES`` (first match wins).

    The patterns are lower case and matched against ``lower(name)``, as the rules match case-insensitively.
    Spark SQL string literals treat a backslash as an escape, so its patterns have theirs doubled.
    """
    lines = [f"WHEN {kind} = '{k}' THEN '{fam}'" for k, fam in KIND_FAMILIES.items()]
    lines.append(f"WHEN {name} IS NULL OR {name} = '' THEN 'other'")
    for family, patterns in FAMILY_RULES:
        rx = "|".join(patterns)
        if dialect == "spark":
            rx = rx.replace("\\", "\\\\")
        lines.append(f"WHEN {_MATCH[dialect].format(col=f'lower({name})', rx=rx)} THEN '{family}'")
    return "CASE " + " ".join(lines) + " ELSE 'other' END"


def families_sql(dialect: Dialect = "duckdb") -> str:
    """Kernels and kernel time per (node, model, family); time is the sum of durations, as the analyzer's.

    Kernels are first reduced to their distinct (node, model, name, kind), so the patterns run once per
    name and not once per kernel. Kernels outside iterations count under model ``unknown``.
    """
    return f"""
WITH n AS (SELECT node, coalesce(model, 'unknown') AS model, name, kind, count(*) AS kernels,
                  sum(greatest(end_ns - start_ns, 0)) AS time_ns
           FROM kernels GROUP BY node, coalesce(model, 'unknown'), name, kind),
     f AS (SELECT node, model, {family_case(dialect)} AS family, kernels, time_ns FROM n)
SELECT node, model, family, sum(kernels) AS kernels, sum(time_ns) / 1e9 AS time_s
FROM f GROUP BY node, model, family
ORDER BY node, model, time_s DESC, family
"""


def activity_cte(keys: tuple[str, ...] = ()) -> str:
    """CTEs ``kw`` (one row per capture window) for device activity, windows split further by ``keys``.

    A window is the analyzer's: one (node, device, run) from its first kernel, copy or memset to its
    last; ``busy_ns`` is the union of their intervals, summed in start order as the time each one
    reaches beyond the furthest end before it (``analyzers.activity.union_extend``).
    """
    extra = "".join(f", {k}" for k in keys)
    part = f"node, device, run{extra}"
    where = " WHERE " + " AND ".join(f"{k} IS NOT NULL" for k in keys) if keys else ""
    return f"""
ka AS (SELECT node, coalesce(device, 'unknown') AS device, coalesce(run_id, source) AS run{extra},
              start_ns, end_ns
       FROM kernels{where}),
kr AS (SELECT {part}, start_ns, end_ns,
              max(end_ns) OVER (PARTITION BY {part} ORDER BY start_ns, end_ns
                                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach_ns
       FROM ka),
kw AS (SELECT {part}, max(end_ns) - min(start_ns) AS window_ns,
              sum(greatest(end_ns - greatest(start_ns, coalesce(reach_ns, start_ns)), 0)) AS busy_ns
       FROM kr GROUP BY {part})"""


def throttle_cte(stale_ns: int = STALE_NS) -> str:
    """CTEs ``ts`` (per GPU sample: throttled or not, and the time to the next sample) and ``tn`` (per node).

    A GPU is throttled at a sample when any reason's vendor flag (``aaco.gpu.throttle.active``) is
    set; the time from it to the GPU's next sample, at most ``stale_ns``, counts as throttled, as
    the throttle analyzer counts it (a GPU's last sample adds nothing: ``coalesce`` makes its step 0,
    since engines differ on ``least`` with a null). ``tn`` holds each node's throttled stretches (any GPU
    throttled), disjoint, so iterations can be placed in them.
    """
    return f"""
tf AS (SELECT node, coalesce(device, 'unknown') AS device, ts_ns,
              max(CASE WHEN value >= 0.5 THEN 1 ELSE 0 END) AS throttled
       FROM telemetry WHERE metric = '{THROTTLE}' GROUP BY node, coalesce(device, 'unknown'), ts_ns),
ts AS (SELECT node, device, ts_ns, throttled,
              least(coalesce(lead(ts_ns) OVER (PARTITION BY node, device ORDER BY ts_ns), ts_ns) - ts_ns,
                    {stale_ns}) AS step_ns
       FROM tf),
tg AS (SELECT node, ts_ns, max(throttled) AS throttled FROM tf GROUP BY node, ts_ns),
tl AS (SELECT node, ts_ns, throttled,
              least(coalesce(lead(ts_ns) OVER (PARTITION BY node ORDER BY ts_ns), ts_ns) - ts_ns, {stale_ns}) AS step_ns
       FROM tg),
tn AS (SELECT node, ts_ns AS from_ns, ts_ns + step_ns AS to_ns FROM tl WHERE throttled = 1)"""


def versions_cte() -> str:
    """CTE ``va``: each node's versions rows with the span of iteration starts each is in force for.

    A row holds from its ``ts_ns`` until the node's next row; the node's earliest row also holds for
    everything before it (what ran before the first row was written is best known from it).
    """
    cols = ", ".join(VERSION_FIELDS)
    return f"""
vr AS (SELECT node, ts_ns, {cols},
              lead(ts_ns) OVER (PARTITION BY node ORDER BY ts_ns) AS next_ns,
              row_number() OVER (PARTITION BY node ORDER BY ts_ns) AS nth
       FROM versions),
va AS (SELECT node, CASE WHEN nth = 1 THEN NULL ELSE ts_ns END AS from_ns, next_ns AS to_ns, {cols} FROM vr)"""


def models_by_version_sql() -> str:
    """Per model, node and the versions in force at each iteration's start: iterations, p50/p95/p99."""
    cols = ", ".join(VERSION_FIELDS)
    vcols = ", ".join(f"va.{c}" for c in VERSION_FIELDS)
    return f"""
WITH {versions_cte().strip()},
iv AS (SELECT i.node, i.model, i.start_ns, (i.end_ns - i.start_ns) / 1e9 AS latency_s, {vcols}
       FROM iterations i LEFT JOIN va ON va.node = i.node
            AND (va.from_ns IS NULL OR i.start_ns >= va.from_ns)
            AND (va.to_ns IS NULL OR i.start_ns < va.to_ns)
       WHERE i.model IS NOT NULL)
SELECT model, node, {cols}, count(*) AS iterations, min(start_ns) AS first_ns, max(start_ns) AS last_ns,
       quantile_cont(latency_s, 0.5) AS p50_s, quantile_cont(latency_s, 0.95) AS p95_s,
       quantile_cont(latency_s, 0.99) AS p99_s
FROM iv GROUP BY model, node, {cols}
ORDER BY model, node, first_ns
"""
