"""A rocprof-compute (omniperf) workload directory: ``pmc_perf.csv``, ``sysinfo.csv``, ``roofline.csv``.

``pmc_perf.csv`` has one row per dispatch: the dispatch's identity (``Dispatch_ID``, ``Kernel_Name``,
``GPU_ID``, ``Grid_Size`` ... ``Start_Timestamp``, ``End_Timestamp``; repeated with ``_1``, ``_2``
suffixes for each profiling pass merged into the row, and on MI300 ``Correlation_ID`` and
``XCC_Index``) and every counter collected for it, one column each: a block's counter
(``SQ_WAVES``), a counter per hardware instance (``TCC_HIT[0]`` .. ``TCC_HIT[15]``, one per L2
channel) and rocprof's accumulations over the instances (``TCC_HIT_sum``), which the profiler
collects in its own pass (so they need not equal the sum of the instance columns of another pass).
Every counter column lands as it is named; an instance group without its ``_sum`` column also
lands summed as ``<name>_sum``, as rocprof-compute defines that name (docs/counters.md).
``sysinfo.csv`` describes the machine (``gpu_arch``, ``lds_banks_per_cu``, ``cu_per_gpu`` ...);
``roofline.csv`` the peaks rocprof-compute measured on it, per device (GB/s and GFLOP/s).
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Final

from aaco.agent.sources.counters.files import WorkloadError, open_csv
from aaco.contract.counters import Dispatch

METADATA: Final = frozenset(
    {
        "Dispatch_ID",
        "Kernel_Name",
        "GPU_ID",
        "Grid_Size",
        "Workgroup_Size",
        "LDS_Per_Workgroup",
        "Scratch_Per_Workitem",
        "Arch_VGPR",
        "Accum_VGPR",
        "SGPR",
        "wave_size",
        "Wave_Size",
        "obj",
        "Correlation_ID",
        "XCC_Index",
        "Start_Timestamp",
        "End_Timestamp",
        "queue-id",
        "queue-index",
        "pid",
        "tid",
        "sig",
        "DispatchNs",
        "CompleteNs",
    }
)
_PASS = re.compile(r"^(.*)_(\d+)$")  # a metadata column repeated by a later profiling pass
_INSTANCE = re.compile(r"^(.*)\[(\d+)\]$")


def is_metadata(column: str) -> bool:
    """True for a dispatch's identity column (or its repeat by another pass), False for a counter."""
    if column in METADATA:
        return True
    m = _PASS.match(column)
    return m is not None and m.group(1) in METADATA


def read_pmc_perf(path: Path, problems: list[str] | None = None) -> Iterator[Dispatch]:
    """The dispatches of a ``pmc_perf.csv`` with their counters.

    A file that is not one raises ``WorkloadError`` naming it; a row of the wrong width or without a
    dispatch id is skipped, a counter that is not a number left out of its dispatch, each said in
    ``problems``. Times may be written in exponent form (``8.1097E+14``: a capture saved through a
    spreadsheet); they are read as the numbers they say, whatever precision was lost.
    """
    said = problems if problems is not None else []
    with open_csv(path) as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if not header or "Dispatch_ID" not in header or "Kernel_Name" not in header:
            raise WorkloadError(
                "not a rocprof-compute pmc_perf.csv: no Dispatch_ID and Kernel_Name columns", subject=path
            )
        at = {name: i for i, name in enumerate(header)}
        counters = [(i, name) for i, name in enumerate(header) if not is_metadata(name)]
        groups: dict[str, list[int]] = {}
        for i, name in counters:
            if (m := _INSTANCE.match(name)) is not None:
                groups.setdefault(m.group(1), []).append(i)
        summed = {base: idx for base, idx in groups.items() if f"{base}_sum" not in at}
        for line, row in enumerate(reader, start=2):
            if len(row) != len(header):
                said.append(f"{path}: line {line}: {len(row)} fields, the header has {len(header)}: skipped")
                continue
            dispatch = _number(row[at["Dispatch_ID"]])
            if dispatch is None:
                said.append(f"{path}: line {line}: no dispatch id: skipped")
                continue

            def time(column: str, row: list[str] = row) -> int:
                value = _number(row[at[column]]) if column in at else None
                return int(value) if value is not None else 0

            correlation = _number(row[at["Correlation_ID"]]) if "Correlation_ID" in at else None
            d = Dispatch(
                int(dispatch),
                row[at["Kernel_Name"]],
                row[at["GPU_ID"]] if "GPU_ID" in at else "",
                time("Start_Timestamp"),
                time("End_Timestamp"),
                int(correlation) if correlation is not None else None,
            )
            for i, name in counters:
                value = _number(row[i])
                if value is None:
                    said.append(f"{path}: line {line}, column {name}: not a number: {row[i][:40]!r}")
                else:
                    d.counters[name] = value
            for base, idx in summed.items():
                parts = [_number(row[i]) for i in idx]
                if None not in parts:
                    d.counters[f"{base}_sum"] = sum(parts)  # type: ignore[arg-type]
            yield d


def read_sysinfo(path: Path) -> dict[str, str]:
    """``sysinfo.csv``: its one row as a mapping (``WorkloadError`` naming the file)."""
    with open_csv(path) as fh:
        found = list(csv.DictReader(fh))
    if len(found) != 1:
        raise WorkloadError(f"expected one row of machine description, found {len(found)}", subject=path)
    return {k: v for k, v in found[0].items() if k is not None}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_peaks(path: Path) -> dict[str, dict[str, float]]:
    """``roofline.csv``: per device (its ``device`` column), the measured peaks by name (GB/s, GFLOP/s)."""
    with open_csv(path) as fh:
        found = list(csv.DictReader(fh))
    if not found or "device" not in found[0] or "HBMBw" not in found[0]:
        raise WorkloadError("not a rocprof-compute roofline.csv: no device and HBMBw columns", subject=path)
    out: dict[str, dict[str, float]] = {}
    for row in found:
        peaks = {k: v for k, v in ((k, _number(v or "")) for k, v in row.items() if k and k != "device")}
        out[row["device"]] = {k: v for k, v in peaks.items() if v is not None}
    return out
