"""Which Kineto traces get a critical path per step, and the bound on what is kept to find it."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace

import pyarrow as pa

from aaco.agent.sources.traces.kineto_critical import COLUMNS, EventKeeper, with_critical_paths
from aaco.agent.sources.traces.limits import TraceLimits
from tests.conftest import ROOT

RANK0 = ROOT / "tests/data/kineto-multirank/trace_filter_sampled_rank-0.json.gz"


def steps() -> pa.Table:
    return pa.table({"name": ["ProfilerStep#551", "ProfilerStep#552"], "iteration": [551, 552]})


def kept(limits: TraceLimits) -> EventKeeper:
    keeper = EventKeeper(limits)
    events = json.loads(gzip.decompress(RANK0.read_bytes()))["traceEvents"]
    for i in range(0, len(events), 1000):
        keeper.keep(events[i : i + 1000])
    return keeper


def test_a_rank_gets_its_steps_paths_and_the_modes_and_the_bound_hold():
    limits = TraceLimits()
    out = with_critical_paths(steps(), kept(limits), limits, distributed=True)
    assert out.column("cp_length_ns").to_pylist() == [267_581_000, None]  # HTA's answer; the last step has none
    assert set(COLUMNS) <= set(out.column_names)
    assert with_critical_paths(steps(), kept(limits), limits, distributed=False) == steps()
    every = replace(limits, critical_path="all")
    assert with_critical_paths(steps(), kept(every), every, distributed=False).num_columns == 8
    off = replace(limits, critical_path="off")
    assert EventKeeper(off).events is None
    assert with_critical_paths(steps(), kept(off), off, distributed=True) == steps()
    small = replace(limits, critical_path_max_events=1000)
    keeper = kept(small)
    assert keeper.events is None and with_critical_paths(steps(), keeper, small, distributed=True) == steps()
