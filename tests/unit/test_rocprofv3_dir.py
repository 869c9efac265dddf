"""A rocprofv3 output directory: its traces read, its statistics and counters named once and not read.

The directory is built from real rocprofv3 outputs (``tests/data/rocprofv3-dir``, the rocprofiler-sdk
documentation's files, and ``examples/data/rocprofv3/kernel_trace.csv``). Also: which rocTX ranges
are iterations (outermost per thread, or the ones named in ``iteration_ranges``), and a file names the
same model whichever source reads it.
"""

from __future__ import annotations

import csv
import shutil
import time
from pathlib import Path

import numpy as np
import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources.base import Journal, SourceContext
from aaco.agent.sources.ingest import Quarantine
from aaco.agent.sources.replay import ReplaySource, ReplaySourceConfig
from aaco.agent.sources.trace_dir import TraceDirConfig, TraceDirSource
from aaco.agent.sources.traces.detect import identify, recognise
from aaco.agent.sources.traces.files import expand, expand_paths, read_head
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.agent.sources.traces.rocprofv3_outputs import NOT_READ, not_read
from aaco.agent.sources.traces.tables import iteration_ranges
from aaco.contract.errors import TraceFormatError
from aaco.contract.stats import SOURCE_ERRORS, Stats

DATA = Path(__file__).resolve().parents[1] / "data" / "rocprofv3-dir"
READ = ["hsa_api_trace.csv", "kernel_trace.csv", "marker_api_trace.csv", "memory_copy_trace.csv"]
NOT_READ_FILES = {
    "counter_collection.csv": "hardware counters",
    "hip_api_stats.csv": "statistics",
    "kernel_names.csv": "hardware counters",  # a counter collection under another name: known by its header
}


@pytest.fixture
def rocprof_dir(tmp_path: Path, samples: Path) -> Path:
    """A rocprofv3 output directory: the real files of tests/data/rocprofv3-dir and the real kernel trace."""
    out = tmp_path / "host" / "4242"
    shutil.copytree(DATA, out, ignore=shutil.ignore_patterns("README.md"))
    shutil.copy(samples / "rocprofv3" / "kernel_trace.csv", out / "kernel_trace.csv")
    return out


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def context(tmp_path: Path) -> SourceContext:
    stats = Stats()
    return SourceContext("n", stats, Bus(stats), Journal(stats), quarantine=tmp_path / "quarantine")


def drained(ctx: SourceContext) -> dict[str, list]:
    """The tables on the bus by kind, each piece folded into the ledger as a lake commit does."""
    out: dict[str, list] = {}
    while (item := ctx.bus.get(0)) is not None:
        out.setdefault(item.kind, []).append(item.batch)
        ctx.ledger.apply(list(item.ranges))
    ctx.ledger.apply([])
    return out


def count(tables: list) -> int:
    return sum(t.num_rows for t in tables)


def column(tables: list, name: str) -> list:
    return [v for t in tables for v in t.column(name).to_pylist()]


def test_each_file_is_known_by_its_content(rocprof_dir):
    for name, what in NOT_READ_FILES.items():
        known = not_read(rocprof_dir / name, read_head(rocprof_dir / name))
        assert known is not None and what in known.message, name
        with pytest.raises(TraceFormatError, match="not a recognised trace"):
            recognise(rocprof_dir / name)
    for name in READ:
        assert not_read(rocprof_dir / name, read_head(rocprof_dir / name)) is None
        recognise(rocprof_dir / name)  # a trace: no error
    times = b'"Start_Timestamp","End_Timestamp"\n'
    header = b'"Kind","Operation","Agent_Id","Allocation_Size","Address","Correlation_Id",' + times
    assert "memory allocation" in not_read(Path("memory_allocation_trace.csv"), header).message
    header = b'"Kind","Operation","Agent_Id","Queue_Id","Thread_Id","Alloc_Flags",' + times
    assert "scratch memory" in not_read(Path("x.csv"), header).message
    assert "Perfetto" in not_read(Path("4242_results.pftrace"), b"\x0a\x8f").message
    assert "OTF2" in not_read(Path("4242_results.otf2"), b"").message
    assert not_read(Path("notes.txt"), b"hello\n") is None


def test_expand_lists_the_traces_and_names_the_rest(rocprof_dir):
    listed = expand_paths([rocprof_dir.parent.parent])
    assert [p.name for p in listed.files] == READ
    assert sorted(k.path.name for k in listed.not_read) == sorted(NOT_READ_FILES)
    assert expand([rocprof_dir]) == listed.files
    # what is neither a trace nor a known output is still handed on, for recognise to refuse
    (rocprof_dir / "notes.txt").write_text("hello\n")
    assert [p.name for p in expand([rocprof_dir])] == [*READ[:3], READ[3], "notes.txt"]


def test_a_replay_reads_every_trace_and_names_each_other_file_once(tmp_path, rocprof_dir):
    ctx = context(tmp_path)
    ReplaySource(ReplaySourceConfig(paths=[rocprof_dir]), "replay").run(ctx)
    got = drained(ctx)
    kernels = rows(rocprof_dir / "kernel_trace.csv")
    copies = rows(rocprof_dir / "memory_copy_trace.csv")
    assert sorted(column(got["kernels"], "kind")) == ["kernel"] * len(kernels) + ["memcpy"] * len(copies)
    assert count(got["iterations"]) == 2  # the marker trace's outermost ranges (see below)
    problems = list(ctx.journal.problems)
    named = sorted(Path(p.subject).name for p in problems if p.reason == NOT_READ)
    assert named == sorted(NOT_READ_FILES)
    assert all(not p.fatal for p in problems)
    assert not [p for p in problems if p.reason == "unreadable"]
    assert ctx.stats.total(SOURCE_ERRORS) == 0  # a note, not an error
    assert sorted(Path(r.subject).name for r in ctx.journal.records) == READ


def poll(src: TraceDirSource, ctx: SourceContext, times: int = 3) -> None:
    q = Quarantine(ctx.quarantine)
    for _ in range(times):
        src.poll(ctx, q)
        time.sleep(0.02)


def test_the_spool_names_the_other_files_once_and_quarantines_none(tmp_path, rocprof_dir):
    spool = rocprof_dir.parent.parent
    ctx = context(tmp_path)
    poll(TraceDirSource(TraceDirConfig(path=spool, settle_s=0.001), "spool"), ctx)
    got = drained(ctx)
    # the kernel trace and the copy trace are tailed; this copy trace's last line has no newline, which a
    # tail holds back as unfinished (a replay reads it): its first copy only
    kinds = column(got["kernels"], "kind")
    assert (kinds.count("kernel"), kinds.count("memcpy")) == (len(rows(rocprof_dir / "kernel_trace.csv")), 1)
    assert count(got["iterations"]) == 2
    named = [Path(p.subject).name for p in ctx.journal.problems if p.reason == NOT_READ]
    assert sorted(named) == sorted(NOT_READ_FILES)  # once each, however many polls
    assert not ctx.quarantine.exists() or list(ctx.quarantine.iterdir()) == []
    assert ctx.stats.total(SOURCE_ERRORS) == 0
    # committed as seen: a restarted spool does not name them again
    restarted = context(tmp_path)
    restarted.ledger.load(ctx.ledger.snapshot())
    poll(TraceDirSource(TraceDirConfig(path=spool, settle_s=0.001), "spool"), restarted)
    assert [p for p in restarted.journal.problems if p.reason == NOT_READ] == []


# --- which ranges are iterations ------------------------------------------------------------------


def test_outermost_ranges_per_thread():
    # thread (1, 1): an outer range [0, 100] with two phases; thread (1, 2): one range overlapping it
    start = np.array([0, 10, 50, 5, 60, 60], dtype=np.int64)
    end = np.array([100, 40, 90, 200, 70, 70], dtype=np.int64)
    pid = [1, 1, 1, 1, 1, 1]
    tid = [1, 1, 1, 2, 2, 2]
    names = ["step", "fwd", "bwd", "other", "inner", "inner"]
    assert iteration_ranges(start, end, pid, tid, names).tolist() == [True, False, False, True, False, False]
    # ranges that overlap without one holding the other are both kept; an identical one is not
    start, end = np.array([0, 50, 0]), np.array([100, 150, 100])
    assert iteration_ranges(start, end, [1] * 3, [1] * 3, ["a", "b", "a"]).tolist() == [True, True, False]
    # named ranges win over nesting
    start = np.array([0, 10, 50], dtype=np.int64)
    end = np.array([100, 40, 90], dtype=np.int64)
    kept = iteration_ranges(start, end, [1] * 3, [1] * 3, ["epoch", "step 1", "step 2"], ("step*",))
    assert kept.tolist() == [False, True, True]


def marker_iterations(path: Path, **kw):
    tf = identify(path)
    parts = list(parse_any(tf, context_for(tf, node="n", source="replay", **kw)))
    return parts[0].iterations


def test_real_nested_rocTX_ranges(rocprof_dir):
    """``hipMemcpy`` is pushed inside ``hipLaunchKernel`` on thread 717: one iteration, not two."""
    path = rocprof_dir / "marker_api_trace.csv"
    ranges = [r for r in rows(path) if int(r["End_Timestamp"]) > int(r["Start_Timestamp"])]
    assert [r["Function"] for r in ranges] == ["hipMemcpy", "hipLaunchKernel", "hipLaunchKernel range"]
    its = marker_iterations(path)
    assert its["name"].to_pylist() == ["hipLaunchKernel range", "hipLaunchKernel"]
    assert its["tid"].to_pylist() == [0, 717]
    assert its["iteration"].to_pylist() == [0, 1]
    assert marker_iterations(path, iteration_ranges=("hipMemcpy",))["name"].to_pylist() == ["hipMemcpy"]


def test_iteration_ranges_setting_reaches_the_reader(tmp_path, rocprof_dir):
    ctx = context(tmp_path)
    cfg = ReplaySourceConfig(paths=[rocprof_dir / "marker_api_trace.csv"], iteration_ranges=["hip*"])
    ReplaySource(cfg, "replay").run(ctx)
    names = column(drained(ctx)["iterations"], "name")
    assert sorted(names) == ["hipLaunchKernel", "hipLaunchKernel range", "hipMemcpy"]


# --- the model a file names -------------------------------------------------------------------------


def test_a_csv_names_the_same_model_through_replay_and_the_spool(tmp_path, samples):
    """Replayed, or tailed in a spool (an uncompressed kernel trace grows: it is tailed), the same model."""
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copy(samples / "rocprofv3" / "kernel_trace.csv", spool / "kernel_trace.csv")
    replayed = context(tmp_path)
    ReplaySource(ReplaySourceConfig(paths=[spool / "kernel_trace.csv"]), "replay").run(replayed)
    spooled = context(tmp_path)
    poll(TraceDirSource(TraceDirConfig(path=spool, settle_s=0.001), "spool"), spooled)
    by_replay = column(drained(replayed)["kernels"], "model")
    by_spool = column(drained(spooled)["kernels"], "model")
    assert len(by_replay) == len(by_spool) == 9
    assert set(by_replay) == set(by_spool) == {"kernel_trace"}
