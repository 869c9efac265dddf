"""rocprofv3's counter collection in a rocpd database (SQLite, ``--pmc`` with the default output of ROCm 7).

Read as rocprofiler-sdk's own ``counters_collection`` view reads it (``source/share/rocprofiler-sdk-rocpd/
data_views.sql``): ``rocpd_pmc_event`` (``event_id``, ``pmc_id``, ``value``, one row per counter
instance) joined to ``rocpd_info_pmc`` (``name``) and to the ``rocpd_kernel_dispatch`` of the same event,
``SUM(value)`` grouped by dispatch, counter name and agent: the instances of a counter summed, as in the
CSV. Times, pid and agent come from the dispatch in either table generation (``traces.rocpd.Layout``);
the device is the agent's ``absolute_index`` (its node id, the CSV's ``Agent_Id``); the correlation id
is the dispatch's event's. Rows are fetched in chunks.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from aaco.agent.sources.counters.files import MAX_BYTES, WorkloadError
from aaco.agent.sources.traces.limits import TraceLimits
from aaco.agent.sources.traces.rocpd import Layout, columns, connect
from aaco.agent.sources.traces.rocpd_rows import small
from aaco.contract.counters import CounterRow

FETCH_ROWS: Final = 65_536


def _sql(con: sqlite3.Connection) -> str:
    lay = Layout(con, "rocpd_kernel_dispatch", "K")
    agent = lay.agent if lay.tracked else "K.agent_id"
    return (
        f"SELECT K.dispatch_id, {lay.start}, {lay.end}, {lay.pid}, A.absolute_index, E.correlation_id, "
        "COALESCE(S.display_name, S.kernel_name), I.name, SUM(PE.value) "
        "FROM rocpd_pmc_event PE "
        "JOIN rocpd_info_pmc I ON I.id = PE.pmc_id AND I.guid = PE.guid "
        "JOIN rocpd_kernel_dispatch K ON K.event_id = PE.event_id AND K.guid = PE.guid "
        "LEFT JOIN rocpd_event E ON E.id = PE.event_id AND E.guid = PE.guid "
        "LEFT JOIN rocpd_info_kernel_symbol S ON S.id = K.kernel_id AND S.guid = K.guid "
        f"{lay.joins}"
        f"LEFT JOIN rocpd_info_agent A ON A.id = {agent} AND A.guid = K.guid "
        f"GROUP BY PE.guid, K.id, I.name, {agent} ORDER BY K.id, I.name"
    )


def read_rocpd_counters(
    path: Path, problems: list[str] | None = None, meta: dict[str, str] | None = None
) -> Iterator[CounterRow]:
    """Every counter of every dispatch in a rocpd database (``WorkloadError`` naming one that is not).

    ``meta`` receives ``arch``, the first GPU agent's name (``gfx942``), before the first row.
    """
    said = problems if problems is not None else []
    try:
        with connect(path, TraceLimits(max_file_bytes=MAX_BYTES)) as con:
            if not columns(con, "rocpd_pmc_event") or not columns(con, "rocpd_kernel_dispatch"):
                raise WorkloadError("a rocpd database without counters: no rocpd_pmc_event view", subject=path)
            gpu = con.execute("SELECT name FROM rocpd_info_agent WHERE type = 'GPU' ORDER BY id LIMIT 1").fetchone()
            if meta is not None and gpu and gpu[0]:
                meta["arch"] = str(gpu[0])
            cur = con.execute(_sql(con))
            while rows := cur.fetchmany(FETCH_ROWS):
                for dispatch, start, end, pid, agent, corr, kernel, name, value in rows:
                    d, v = small(dispatch), value
                    if d is None or not name or not isinstance(v, int | float):
                        said.append(f"{path}: dispatch {dispatch}: no dispatch id, counter name or value: skipped")
                        continue
                    yield CounterRow(
                        small(start) or 0,
                        small(end) or 0,
                        small(pid),
                        "" if agent is None else str(agent),
                        d,
                        small(corr),
                        kernel or "",
                        str(name),
                        float(v),
                    )
    except sqlite3.DatabaseError as exc:
        raise WorkloadError(f"not a rocpd database of a known schema: {exc}", subject=path) from exc
    except (OSError, ValueError) as exc:
        raise WorkloadError(f"cannot read: {exc}", subject=path) from exc
