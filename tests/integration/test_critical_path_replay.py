"""``aaco replay`` puts HTA's critical path of each step on the iteration rows of a distributed job's ranks."""

from __future__ import annotations

import json

import pyarrow.dataset as ds
import pytest

from tests.conftest import ROOT

from .helpers import run_aaco_each

pytestmark = pytest.mark.integration

RANKS = [ROOT / "tests/data/kineto-multirank" / f"trace_filter_sampled_rank-{r}.json.gz" for r in (0, 1)]
FIELDS = ("length", "cpu", "compute", "comm", "launch", "gap")


def hta_answers() -> dict[str, dict]:
    """HTA 0.5.0's own answers for each rank's first step (tests/data/critical_path_hta, made by HTA itself)."""
    doc = json.loads((ROOT / "tests/data/critical_path_hta/hta-0.5.0.json").read_text())
    cases = doc if isinstance(doc, list) else doc["cases"]
    return {
        c["trace"]: c["hta"]
        for c in cases
        if "trace_filter" in c["trace"] and c["instance"] == 0 and not c.get("include_last_step")
    }


def test_each_ranks_steps_carry_htas_critical_path_and_a_lone_trace_does_not_by_default(tmp_path, aaco_bin, samples):
    alexnet = samples / "kineto" / "a100_alexnet_trace.json.gz"
    ranks, lone = run_aaco_each(
        aaco_bin,
        ("replay", *map(str, RANKS), "--out", str(tmp_path / "ranks"), "--no-progress"),
        ("replay", str(alexnet), "--out", str(tmp_path / "lone"), "--no-progress"),
    )
    assert ranks.returncode == 0 and lone.returncode == 0, (ranks.stderr, lone.stderr)
    rows = ds.dataset(tmp_path / "ranks" / "iterations", partitioning="hive").to_table().to_pylist()
    answers = hta_answers()
    for r in (0, 1):
        first = next(row for row in rows if row["rank"] == r and row["name"] == "ProfilerStep#551")
        hta = answers[f"tests/data/kineto-multirank/trace_filter_sampled_rank-{r}.json.gz"]
        assert [first[f"cp_{f}_ns"] for f in FIELDS] == [hta[f"{f}_us"] * 1000 for f in FIELDS]
        last = next(row for row in rows if row["rank"] == r and row["name"] == "ProfilerStep#552")
        assert last["cp_length_ns"] is None  # HTA leaves a trace's last step out
    lone_rows = ds.dataset(tmp_path / "lone" / "iterations", partitioning="hive").to_table().to_pylist()
    assert all(row["cp_length_ns"] is None for row in lone_rows)  # not a rank: no path unless asked
