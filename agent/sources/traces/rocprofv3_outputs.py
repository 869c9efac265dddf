"""The files of a rocprofv3 output directory that AACO knows and does not read: named, never refused.

rocprofv3 writes one directory per process (``<host>/<pid>/``) holding a file per domain and
output format (rocprofiler-sdk ``source/lib/output/``: ``generateCSV.cpp``, ``domain_type.cpp``).
The traces are read (``rocprofv3_csv``, ``rocprofv3_json``, ``rocpd``: kernel dispatches, memory
copies, HIP/HSA/marker/RCCL API calls, agents); beside them lie files that are not traces of a
kind AACO stores. Replaying or spooling the directory reads every trace in it and names each of
these once, as a note rather than an error (``NotRead``):

- statistics, ``--stats`` (``kernel_stats.csv``, ``hip_api_stats.csv``, ``domain_stats.csv``,
  ``memory_copy_stats.csv``, ... any ``*_stats.csv``): header ``Name, Calls, TotalDurationNs,
  AverageNs, Percentage, MinNs, MaxNs, StdDev``. Derived from the traces beside them.
- hardware counters, ``--pmc`` (``counter_collection.csv``): header ``Correlation_Id,
  Dispatch_Id, Agent_Id, ..., Kernel_Name, ..., Counter_Name, Counter_Value[, Start_Timestamp,
  End_Timestamp]``, no ``Kind`` column. Read by the ``counters`` source and the ``capture``
  source's ``pmc`` windows (docs/counters.md), not as a trace.
- scratch memory and memory allocation traces (``scratch_memory_trace.csv``,
  ``memory_allocation_trace.csv``): ``Kind, Operation, Agent_Id, ...``. Not events AACO stores.
- the same events in the output formats AACO does not parse: ``*.pftrace`` (Perfetto) and
  ``*.otf2`` (the OTF2 archive's anchor file).

Files are told by their header (the content, as every format is: a renamed file is still known),
the two binary formats by their suffix. A file none of these rules knows is left to
``detect.recognise``, which refuses what is not a trace.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aaco.agent.sources.traces.rocprofv3_csv_layout import parse_header

NOT_READ = "not_read"  # the reason a known file that is not read is named under (a note, not an error)
_STATS = frozenset({"Name", "Calls", "TotalDurationNs", "AverageNs", "Percentage"})
_COUNTERS = frozenset({"Dispatch_Id", "Kernel_Name", "Counter_Name", "Counter_Value"})
_MEMORY = frozenset({"Kind", "Operation", "Agent_Id", "Start_Timestamp", "End_Timestamp"})
_OTHER_FORMATS = {
    ".pftrace": "a Perfetto trace written by rocprofv3 (--output-format pftrace)",
    ".otf2": "an OTF2 archive written by rocprofv3 (--output-format otf2)",
}
_SAME_EVENTS = "the same events as its csv, json or rocpd output, which AACO reads"


@dataclass(frozen=True)
class NotRead:
    """A file known and not read: its path, what it is, and why it is not read (one sentence)."""

    path: Path
    message: str


def not_read(path: Path, head: bytes) -> NotRead | None:
    """What ``path`` is when it is a rocprofv3 output AACO does not read (see the module doc), else None.

    ``head``: the first bytes of its (decompressed) content.
    """
    name = path.name.removesuffix(".gz").lower()
    for suffix, what in _OTHER_FORMATS.items():
        if name.endswith(suffix):
            return NotRead(path, f"{what}: {_SAME_EVENTS}; not read")
    cols = set(parse_header(head) or ())
    if cols >= _STATS:
        return NotRead(path, "rocprofv3 statistics (--stats), derived from the traces beside it; not read")
    if cols >= _COUNTERS and "Kind" not in cols:
        return NotRead(
            path, "rocprofv3 hardware counters (--pmc): not read as a trace (the counters source and capture read them)"
        )
    if cols >= _MEMORY and "Kernel_Name" not in cols and "Direction" not in cols:
        what = "memory allocation" if "Allocation_Size" in cols else "scratch memory"
        return NotRead(path, f"a rocprofv3 {what} trace; not a kind of event AACO stores, not read")
    return None
