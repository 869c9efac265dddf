"""rocprofv3 JSON's whole-file fast path reads exactly what the streaming path reads, or leaves the file to it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from aaco.agent.sources.traces import rocprofv3_json as rj
from aaco.agent.sources.traces import rocprofv3_json_fast as fast_path
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.limits import TraceLimits
from aaco.agent.sources.traces.parse import context_for
from aaco.contract.clock import ClockOffset
from tests.support import tracegen

CLOCK = ClockOffset(1_700_000_000_000_000_000, 10, "test")


def context(path: Path):
    return context_for(identify(path), node="n", source="rocprofv3", clock=CLOCK)


def both(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[bool, list, list]:
    """Whether the fast path took the file, and the chunks of each path."""
    used = rj.prepare(path, context(path), TraceLimits()) is not None
    fast = list(rj.parse_rocprofv3_json(path, context(path)))
    with monkeypatch.context() as m:
        m.setattr(rj, "prepare", lambda *_: None)
        streamed = list(rj.parse_rocprofv3_json(path, context(path)))
    return used, fast, streamed


def assert_same(fast: list, streamed: list) -> None:
    assert len(fast) == len(streamed)
    for a, b in zip(fast, streamed, strict=True):
        assert a.kernels.equals(b.kernels)
        assert a.iterations.equals(b.iterations)
        assert a.skipped == b.skipped
        assert (a.pids, a.devices, a.model, a.anchor_raw_ns) == (b.pids, b.devices, b.model, b.anchor_raw_ns)


@pytest.mark.parametrize(
    "kw",
    [
        {"dispatches": 3000, "copies": 40},
        {"dispatches": 500, "copies": 5, "big_ids": True},  # every id and handle at or above 2**63
        {"dispatches": 400, "copies": 0, "indent": False},
    ],
    ids=["plain", "big-ids", "compact"],
)
def test_the_fast_path_reads_what_the_streaming_path_reads(tmp_path, monkeypatch, kw):
    path = tmp_path / "results.json"
    wrote = tracegen.rocprofv3_json(path, **kw)
    used, fast, streamed = both(path, monkeypatch)
    assert used
    assert_same(fast, streamed)
    kinds = [k for p in fast for k in p.kernels.column("kind").to_pylist()]
    assert kinds.count("kernel") == wrote["kernels"] and kinds.count("memcpy") == wrote["copies"]
    assert any(p.kernels.column("launch_name").null_count < p.kernels.num_rows for p in fast if p.kernels.num_rows)


def test_chunks_split_at_the_same_rows_and_a_gzip_file_too(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    tracegen.rocprofv3_json(path, rj.CHUNK_ROWS + 1000, 3)
    gz = tmp_path / "results.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes(), compresslevel=1))
    for p in (path, gz):
        used, fast, streamed = both(p, monkeypatch)
        assert used and len(fast) >= 2
        assert_same(fast, streamed)


def edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc["rocprofiler-sdk-tool"])
    path.write_text(json.dumps(doc, indent=1))


def test_records_out_of_the_window_or_without_times_are_skipped_alike(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    tracegen.rocprofv3_json(path, 300, 4)

    def spoil(procs):
        records = procs[0]["buffer_records"]
        records["kernel_dispatch"][3]["end_timestamp"] = records["kernel_dispatch"][3]["start_timestamp"] - 1
        records["kernel_dispatch"][5]["start_timestamp"] = 10**19  # past int64: out of the window
        del records["kernel_dispatch"][7]["start_timestamp"]
        records["hip_api"][2]["end_timestamp"] = None
        del records["hip_api"][4]["correlation_id"]
        records["memory_copy"][1]["start_timestamp"] = 5  # 1990 is later

    edit(path, spoil)
    used, fast, streamed = both(path, monkeypatch)
    assert used
    assert_same(fast, streamed)
    assert sum(fast[0].skipped.values()) >= 5


@pytest.mark.parametrize(
    "why",
    ["odd-values", "cut-short", "two-processes", "beside-dispatch-info", "negative-handle", "key-twice"],
)
def test_a_file_of_another_shape_goes_the_streaming_way_whole(tmp_path, monkeypatch, why):
    path = tmp_path / "results.json"
    tracegen.rocprofv3_json(path, 200, 3, odd_values=why == "odd-values")
    if why == "cut-short":
        data = path.read_bytes()
        path.write_bytes(data[: data.index(b'"kernel_dispatch"') + 5000])
    elif why == "two-processes":
        edit(path, lambda procs: procs.append(procs[0]))
    elif why == "beside-dispatch-info":
        edit(path, lambda procs: procs[0]["buffer_records"]["kernel_dispatch"][0].update(kernel_id=1))
    elif why == "negative-handle":
        edit(path, lambda procs: procs[0]["buffer_records"]["kernel_dispatch"][9]["stream_id"].update(handle=-1))
    elif why == "key-twice":
        data = path.read_bytes()
        path.write_bytes(data.replace(b'"thread_id":', b'"thread_id": 1, "thread_id":', 1))
    used, fast, streamed = both(path, monkeypatch)
    assert not used
    assert_same(fast, streamed)


def test_a_file_past_the_fast_bound_streams(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    tracegen.rocprofv3_json(path, 300, 2)
    monkeypatch.setattr(fast_path, "MAX_BYTES", path.stat().st_size - 1)
    used, fast, streamed = both(path, monkeypatch)
    assert not used
    assert_same(fast, streamed)
