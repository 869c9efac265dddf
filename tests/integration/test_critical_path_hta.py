"""AACO's critical path against Holistic Trace Analysis' own, on HTA's own critical path traces.

``tests/data/critical_path_hta/hta-0.5.0.json`` holds HTA 0.5.0's answer for each case (a trace, an
annotation and its instance, HTA's options): the path's length, its breakdown by ``bound_by``, its
node count and its events (a digest of their positions in ``traceEvents``). HTA 0.5.0 made them
(``tests/integration/hta_critical_path_oracle.py --write``); its critical path cannot run on the
pandas 3 this environment installs, so the live comparison runs where an interpreter with HTA 0.5.0
and pandas < 3 is at hand (this one, or ``AACO_HTA_PYTHON``), and checks the file as well as AACO.

simple_add's overlaid output (``tests/data/kineto-multirank``) is HTA's answer after 0.5.0 (its
end-to-end test data, the whole trace): AACO gives it exactly with ``kernel_gap_limit_us=1500``,
the kernel-kernel limit HTA added then, and HTA 0.5.0's own answer without it.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from aaco.agent.sources.traces.critical_path import CriticalPathAnalysis, critical_paths
from aaco.agent.sources.traces.critical_path_graph import DEPENDENCY, LAUNCH_DELAY, SYNC
from tests.integration.hta_critical_path_oracle import digest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests/data/critical_path_hta/hta-0.5.0.json"
DOC = json.loads(GOLDEN.read_text())
MULTIRANK = ROOT / "tests/data/kineto-multirank"
SIMPLE_ADD_IN = MULTIRANK / "critical_path_end_to_end_simple_add_input_trace.json.gz"
SIMPLE_ADD_OUT = MULTIRANK / "critical_path_end_to_end_simple_add_output_overlaid_critical_path_trace.json.gz"


@cache
def _events(trace: str) -> list:
    with gzip.open(ROOT / trace) as f:
        return json.load(f)["traceEvents"]


@cache
def _analysis(trace: str, include_last: bool, zero_weight: bool, gap_limit: float | None) -> CriticalPathAnalysis:
    return CriticalPathAnalysis(
        _events(trace),
        include_last_step=include_last,
        zero_weight_launch_edges=zero_weight,
        kernel_gap_limit_us=gap_limit,
    )


def ours(case: dict) -> dict:
    """AACO's figures for a case, in HTA's units (whole microseconds)."""
    a = _analysis(
        case["trace"],
        bool(case.get("include_last_step")),
        bool(case.get("zero_weight_launch_edges")),
        case.get("kernel_gap_limit_us"),
    )
    p = a.path(case["annotation"], case["instance"])
    if p is None:
        return {"error": True}
    return {
        "length_us": p.length_ns // 1000,
        "cpu_us": p.cpu_ns // 1000,
        "compute_us": p.compute_ns // 1000,
        "comm_us": p.comm_ns // 1000,
        "launch_us": p.launch_ns // 1000,
        "gap_us": p.gap_ns // 1000,
        "nodes": p.nodes,
        "events": len(p.events),
        "digest": digest(list(p.events)),
    }


def _expected(hta: dict) -> dict:
    return {"error": True} if "error" in hta else {k: v for k, v in hta.items() if k != "ok"}


def _id(case: dict) -> str:
    ann = case["annotation"].removeprefix("[param|").removesuffix("]") or "whole"
    opts = "".join(f"-{k}" for k in ("include_last_step", "zero_weight_launch_edges") if case.get(k))
    return f"{Path(case['trace']).name[:24]}-{ann}-{case['instance']}{opts}"


@pytest.mark.parametrize("case", DOC["cases"], ids=_id)
def test_length_and_shares_equal_hta_0_5_0(case):
    assert ours(case) == _expected(case["hta"])


@pytest.mark.parametrize("case", DOC["later_cases"], ids=_id)
def test_with_the_later_kernel_gap_limit_equal_hta_0_6(case):
    assert ours(case) == _expected(case["hta"])


def test_simple_add_overlaid_output_is_reproduced():
    """The events HTA marked ``critical`` and its flow edges, against AACO's path of the whole trace."""
    with gzip.open(SIMPLE_ADD_OUT) as f:
        overlaid = json.load(f)["traceEvents"]
    marked = {i for i, e in enumerate(overlaid) if e.get("ph") == "X" and e.get("args", {}).get("critical") == 1}
    flows = [e for e in overlaid if e.get("cat") == "critical_path" and e.get("ph") == "s"]
    assert flows and all(e["args"]["critical"] for e in flows)

    trace = str(SIMPLE_ADD_IN.relative_to(ROOT))
    a = _analysis(trace, False, False, 1500)
    _, edges, _ = a.path_edges("", None)
    p = a.path("", None)
    assert set(p.events) == marked and len(marked) == 624
    # the overlay draws the path's dependency, launch and sync edges (DEFAULT_EDGE_TYPES_IN_VIZ)
    drawn = Counter(e.type for e in edges if e.type in (DEPENDENCY, LAUNCH_DELAY, SYNC))
    assert drawn == Counter(e["args"]["type"] for e in flows)
    assert p.launch_ns == 1000 * sum(e["args"]["weight"] for e in flows if e["args"]["type"] == LAUNCH_DELAY)

    # HTA 0.5.0 (no limit) takes a kernel-kernel gap of 11.9 ms instead of the CPU's cudaMalloc
    old = _analysis(trace, False, False, None).path("", None)
    assert len(old.events) == 600 and old.gap_ns > 11_000_000 > p.gap_ns


def test_steps_of_a_fractional_trace():
    """ns_resolution: four of its five ProfilerSteps (HTA leaves the last out), each its own path."""
    trace = "examples/data/kineto-hta/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz"
    steps = critical_paths(_events(trace))
    assert [(s.name, s.instance) for s in steps] == [(f"ProfilerStep#{101 + i}", i) for i in range(4)]
    by_case = {c["instance"]: c["hta"] for c in DOC["cases"] if c["trace"] == trace and not c.get("include_last_step")}
    for s in steps:
        assert s.length_ns == 1000 * by_case[s.instance]["length_us"]
        assert s.length_ns == s.cpu_ns + s.compute_ns + s.comm_ns + s.launch_ns + s.gap_ns


def _hta_python() -> str | None:
    """An interpreter whose HTA 0.5.0 can run its critical path (pandas < 3), or None."""
    if os.environ.get("AACO_HTA_PYTHON"):
        return os.environ["AACO_HTA_PYTHON"]
    try:
        import hta  # noqa: F401
        import pandas
    except ImportError:
        return None
    return sys.executable if int(pandas.__version__.split(".")[0]) < 3 else None


def test_live_hta_agrees_with_the_file_and_with_aaco():
    python = _hta_python()
    if python is None:
        pytest.skip("HTA 0.5.0's critical path needs pandas < 3 (set AACO_HTA_PYTHON to such an interpreter)")
    out = subprocess.run(
        [python, str(ROOT / "tests/integration/hta_critical_path_oracle.py"), str(GOLDEN)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        cwd=ROOT,
    )
    live = json.loads(out.stdout)
    for case, hta in zip(DOC["cases"], live, strict=True):
        assert hta == case["hta"], _id(case)
        assert ours(case) == _expected(hta), _id(case)
