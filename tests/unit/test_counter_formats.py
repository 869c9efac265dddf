"""rocprofv3's counter collection in its three output formats: CSV, JSON and rocpd read alike.

No real JSON or rocpd counter capture is published (rocprofiler-sdk documents the CSV only), so the
real MI210 capture (``tests/data/rocprofv3-pmc-mi210``, vibesys, MIT) is written here in the other two
formats as rocprofiler-sdk writes them: the JSON in the shape of its published schema
(``source/docs/rocprofv3-schema.json``), the rocpd database from its published tables
(``tests/support/rocpd_db.py``). Each counter is split into instances the way the profiler records
them (one record per dimension instance); the CSV holds their sums (``generateCSV.cpp``), so every
reader must give the CSV's rows back.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.counters import publish_capture
from aaco.agent.sources.counters.files import WorkloadError
from aaco.agent.sources.counters.rocpd import read_rocpd_counters
from aaco.agent.sources.counters.rocprofv3 import read_counter_collection
from aaco.agent.sources.counters.rocprofv3_json import read_rocprofv3_counters
from aaco.contract.counters import CounterRow, dispatches
from aaco.contract.stats import Stats
from tests.support.rocpd_db import Db

DATA = Path(__file__).resolve().parents[1] / "data" / "rocprofv3-pmc-mi210"
CSV = DATA / "782163_counter_collection.csv"
AGENT_HANDLE, NODE_ID, INSTANCES = 93_885_001_226_624, 1, 4


def context() -> SourceContext:
    stats = Stats()
    return SourceContext("n", stats, Bus(stats), Journal(stats))


def landed(ctx: SourceContext) -> pa.Table:
    """The ``counters`` rows a source published on its context's bus."""
    batches = []
    while (item := ctx.bus.get(0.0)) is not None:
        assert item.kind == "counters"
        batches.append(item.batch)
    return pa.Table.from_batches(batches)


def real_rows() -> list[CounterRow]:
    return list(read_counter_collection(CSV))


def instances(value: float) -> list[float]:
    """``value`` as the profiler records it, one part per instance (integers: the sum is exact)."""
    part = float(int(value) // INSTANCES)
    return [part] * (INSTANCES - 1) + [value - part * (INSTANCES - 1)]


def as_json(rows: list[CounterRow], path: Path) -> Path:
    names = sorted({r.counter for r in rows})
    counter_id = {n: 1000 + i for i, n in enumerate(names)}
    kernels = sorted({r.kernel for r in rows})
    kernel_id = {k: 7 + i for i, k in enumerate(kernels)}
    records, traced = [], []
    for d in dispatches(rows):
        info = {"agent_id": {"handle": AGENT_HANDLE}, "dispatch_id": d.dispatch_id, "kernel_id": kernel_id[d.kernel]}
        records.append(
            {
                "dispatch_data": {
                    "correlation_id": {"internal": d.correlation_id, "external": 0},
                    "dispatch_info": info,
                },
                "records": [
                    {"counter_id": {"handle": counter_id[n]}, "value": part}
                    for n, v in d.counters.items()
                    for part in instances(v)
                ],
                "thread_id": d.pid,
            }
        )
        traced.append({"dispatch_info": info, "start_timestamp": d.start_ns, "end_timestamp": d.end_ns})
    doc = {
        "rocprofiler-sdk-tool": [
            {
                "metadata": {"pid": rows[0].pid},
                "agents": [
                    {"id": {"handle": 5}, "type": 1, "node_id": 0, "name": "AMD EPYC 7763 64-Core Processor"},
                    {"id": {"handle": AGENT_HANDLE}, "type": 2, "node_id": NODE_ID, "name": "gfx90a"},
                ],
                "counters": [
                    {"id": {"handle": counter_id[n]}, "agent_id": {"handle": AGENT_HANDLE}, "name": n} for n in names
                ],
                "kernel_symbols": [
                    {"kernel_id": kernel_id[k], "kernel_name": f"_Z{k}", "formatted_kernel_name": k} for k in kernels
                ],
                "buffer_records": {"kernel_dispatch": traced},
                "callback_records": {"counter_collection": records},
            }
        ]
    }
    path.write_text(json.dumps(doc, indent=2))
    return path


def as_rocpd(rows: list[CounterRow], path: Path, tracked: bool) -> Path:
    db = Db(path, tracked)
    agent = 2  # rocpd_info_agent row 2: the first GPU, absolute_index 1 (its node id), named gfx942 by Db
    symbols = {k: db.symbol(k) for k in sorted({r.kernel for r in rows})}
    pmcs = {n: [db.pmc(n, agent, i) for i in range(INSTANCES)] for n in sorted({r.counter for r in rows})}
    for d in dispatches(rows):
        event = db.dispatch(d.correlation_id, symbols[d.kernel], agent, d.start_ns, d.end_ns, d.dispatch_id)
        for n, v in d.counters.items():
            for pmc, part in zip(pmcs[n], instances(v), strict=True):
                db.pmc_event(event, pmc, part)
    db.con.commit()
    db.con.close()
    return path


def comparable(rows: list[CounterRow]) -> list[tuple]:
    return sorted((r.dispatch_id, r.counter, r) for r in rows)


def test_the_json_output_reads_as_the_csv(tmp_path: Path):
    rows = real_rows()
    meta: dict[str, str] = {}
    got = [r for d in read_rocprofv3_counters(as_json(rows, tmp_path / "c.json"), None, meta) for r in d.rows()]
    assert len(got) == len(rows) == 16
    assert comparable(got) == comparable(rows)
    assert meta == {"arch": "gfx90a"}


@pytest.mark.parametrize("tracked", [False, True], ids=["direct", "tracked"])
def test_the_rocpd_database_reads_as_the_csv(tmp_path: Path, tracked: bool):
    rows = real_rows()
    meta: dict[str, str] = {}
    got = list(read_rocpd_counters(as_rocpd(rows, tmp_path / "c.db", tracked), None, meta))
    assert comparable(got) == comparable([r._replace(pid=4242) for r in rows])  # the database's one process
    assert meta == {"arch": "gfx942"}  # the database's own GPU agent


def test_all_three_land_through_the_source_as_the_same_rows(tmp_path: Path):
    rows = real_rows()
    paths = [CSV, as_json(rows, tmp_path / "c.json"), as_rocpd(rows, tmp_path / "c.db", False)]
    out = []
    for path in paths:
        ctx = context()
        assert publish_capture(ctx, "counters", path) == len(rows)
        assert not ctx.journal.problems
        table = landed(ctx)
        cols = [table.column(c).to_pylist() for c in ("dispatch_id", "device", "counter", "value")]
        out.append(sorted(zip(*cols, strict=True)))
    assert out[0] == out[1] == out[2]


def test_a_record_of_an_unknown_counter_is_said_and_the_rest_kept(tmp_path: Path):
    path = as_json(real_rows(), tmp_path / "c.json")
    doc = json.loads(path.read_text())
    first = doc["rocprofiler-sdk-tool"][0]["callback_records"]["counter_collection"][0]
    first["records"].append({"counter_id": {"handle": 1}, "value": 5})
    first["records"].append({"counter_id": {"handle": 1000}, "value": "x"})
    del doc["rocprofiler-sdk-tool"][0]["callback_records"]["counter_collection"][1]["dispatch_data"]["dispatch_info"]
    path.write_text(json.dumps(doc))
    said: list[str] = []
    got = list(read_rocprofv3_counters(path, said))
    assert [d.dispatch_id for d in got] == [4, 28, 30]
    assert got[0].counters == {r.counter: r.value for r in real_rows() if r.dispatch_id == 4}
    assert len(said) == 3 and "counter_collection[1]: no dispatch_info.dispatch_id" in said[2]


def test_a_kernel_trace_json_without_counters_lands_nothing(tmp_path: Path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"rocprofiler-sdk-tool": [{"metadata": {"pid": 1}, "callback_records": {}}]}))
    ctx = context()
    assert publish_capture(ctx, "counters", path) == 0 and not ctx.journal.problems


def test_a_rocpd_database_without_counter_tables_is_named(tmp_path: Path):
    path = tmp_path / "trace.db"
    db = Db(path, False)
    db.con.execute("DROP VIEW rocpd_pmc_event")
    db.con.commit()
    db.con.close()
    with pytest.raises(WorkloadError, match="without counters") as err:
        list(read_rocpd_counters(path))
    assert str(path) in str(err.value)
    ctx = context()
    assert publish_capture(ctx, "counters", path) == 0
    assert [p.reason for p in ctx.journal.problems] == ["unreadable"]


def test_a_file_that_is_not_sqlite_is_named(tmp_path: Path):
    path = tmp_path / "x.db"
    path.write_bytes(b"not a database at all" * 100)
    with pytest.raises(WorkloadError, match="rocpd") as err:
        list(read_rocpd_counters(path))
    assert str(path) in str(err.value)
