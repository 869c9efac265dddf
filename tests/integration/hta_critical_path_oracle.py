"""Holistic Trace Analysis' own critical path figures for the cases of tests/data/critical_path_hta.

Run by an interpreter that has HTA 0.5.0 and pandas < 3 (HTA 0.5.0's critical path raises on
pandas 3's ``drop(axis=..., columns=...)`` and relies on chained in-place ``fillna``, which pandas
3's copy-on-write ignores). It needs nothing but HTA and the standard library:

    python tests/integration/hta_critical_path_oracle.py tests/data/critical_path_hta/hta-0.5.0.json
        prints HTA's figures for every case (JSON, one object per case, in order);
    ... --write  writes them into the file's ``hta`` fields (how the file was made).

Times are HTA's: whole microseconds.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BOUND = {
    "cpu_bound": "cpu_us",
    "gpu_compute_bound": "compute_us",
    "gpu_communication_bound": "comm_us",
    "gpu_kernel_launch_overhead": "launch_us",
    "gpu_kernel_kernel_overhead": "gap_us",
}


def digest(events: list[int]) -> str:
    """The path's events (positions in traceEvents), sorted, as one short hash."""
    return hashlib.sha256(",".join(str(i) for i in sorted(events)).encode()).hexdigest()[:16]


def figures(analysis, case: dict) -> dict:
    """HTA's path for one case: its length, its breakdown by ``bound_by``, its nodes and events."""
    os.environ["CRITICAL_PATH_ADD_ZERO_WEIGHT_LAUNCH_EDGE"] = "1" if case.get("zero_weight_launch_edges") else "0"
    rank = analysis.t.get_ranks()[0]
    try:
        res = analysis.critical_path_analysis(rank=rank, annotation=case["annotation"], instance_id=case["instance"])
    except Exception as e:  # HTA fails on the step: AACO has no path there
        return {"error": type(e).__name__}
    if res is None:
        return {"error": "None"}
    graph, ok = res
    edf = graph.get_critical_path_breakdown()
    out = {"length_us": int(edf.duration.sum())} | {v: 0 for v in BOUND.values()}
    for bound, us in edf.groupby("bound_by").duration.sum().items():
        if bound:
            out[BOUND[bound]] = int(us)
    events = [int(i) for i in graph.critical_path_events_set]
    nodes = len(graph.critical_path_nodes)
    return out | {"ok": bool(ok), "nodes": nodes, "events": len(events), "digest": digest(events)}


def run(cases: list[dict]) -> list[dict]:
    from hta.trace_analysis import TraceAnalysis

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    loaded: dict[tuple[str, bool], object] = {}
    out = []
    for case in cases:
        key = (case["trace"], bool(case.get("include_last_step")))
        if key not in loaded:
            d = tempfile.mkdtemp()
            shutil.copy(ROOT / case["trace"], Path(d) / "rank-0.json.gz")  # HTA reads a directory
            loaded[key] = TraceAnalysis(trace_dir=d, include_last_profiler_step=key[1])
        out.append(figures(loaded[key], case))
    return out


def main(argv: list[str]) -> None:
    path = Path(argv[0])
    doc = json.loads(path.read_text())
    results = run(doc["cases"])
    if "--write" in argv:
        for case, hta in zip(doc["cases"], results, strict=True):
            case["hta"] = hta
        path.write_text(json.dumps(doc, indent=1) + "\n")
    else:
        json.dump(results, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
