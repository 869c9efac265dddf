"""rocprofv3's counter collection (``--pmc``), CSV: ``counter_collection.csv``, one row per dispatch and counter.

Header (rocprofiler-sdk ``source/lib/output/generateCSV.cpp``): ``Correlation_Id, Dispatch_Id,
Agent_Id, Queue_Id, Process_Id, Thread_Id, Grid_Size, [Kernel_Id,] Kernel_Name, Workgroup_Size,
LDS_Block_Size, Scratch_Size, VGPR_Count, SGPR_Count, Counter_Name, Counter_Value`` and, in newer
releases, ``Start_Timestamp, End_Timestamp``. The columns are found by name; the rows land as they
are (a counter rocprofv3 already accumulated over instances comes as one row). A row without a
dispatch id, counter name or numeric value is skipped and said in ``problems``.
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from aaco.agent.sources.counters.files import WorkloadError, open_csv
from aaco.contract.counters import CounterRow

REQUIRED: Final = ("Dispatch_Id", "Kernel_Name", "Counter_Name", "Counter_Value")


def read_counter_collection(path: Path, problems: list[str] | None = None) -> Iterator[CounterRow]:
    """Every counter row of a ``counter_collection.csv`` (``WorkloadError`` naming a file that is not one)."""
    said = problems if problems is not None else []
    with open_csv(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None) or []
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise WorkloadError(f"not a rocprofv3 counter collection: no {', '.join(missing)} column", subject=path)
        at = {name: i for i, name in enumerate(header)}

        def number(row: list[str], column: str) -> float | None:
            if column not in at:
                return None
            try:
                return float(row[at[column]])
            except ValueError:
                return None

        for line, row in enumerate(reader, start=2):
            if len(row) != len(header):
                said.append(f"{path}: line {line}: {len(row)} fields, the header has {len(header)}: skipped")
                continue
            dispatch, value = number(row, "Dispatch_Id"), number(row, "Counter_Value")
            name = row[at["Counter_Name"]].strip()
            if dispatch is None or value is None or not name:
                said.append(f"{path}: line {line}: no dispatch id, counter name or numeric value: skipped")
                continue
            pid, correlation = number(row, "Process_Id"), number(row, "Correlation_Id")
            yield CounterRow(
                int(number(row, "Start_Timestamp") or 0),
                int(number(row, "End_Timestamp") or 0),
                int(pid) if pid is not None else None,
                row[at["Agent_Id"]].strip() if "Agent_Id" in at else "",
                int(dispatch),
                int(correlation) if correlation is not None else None,
                row[at["Kernel_Name"]],
                name,
                value,
            )


def agent_arch(counters: Path) -> str | None:
    """The GPU architecture (``gfx90a``) of the ``agent_info.csv`` beside a counter collection, if there is one.

    rocprofv3 writes ``<pid>_agent_info.csv`` next to ``<pid>_counter_collection.csv``: one row per agent,
    the GPU's ``Name`` its architecture. The first GPU's is taken; None without the file or a GPU row.
    """
    prefix = counters.name[: -len("counter_collection.csv")]
    info = counters.with_name(f"{prefix}agent_info.csv")
    if not info.is_file():
        return None
    try:
        with open_csv(info) as fh:
            for row in csv.DictReader(fh):
                if row.get("Agent_Type") == "GPU" and row.get("Name"):
                    return row["Name"].strip()
    except WorkloadError:
        return None
    return None
