"""Acceptance (issue 13): a rocprofv3 JSON whose every id, handle and hive id is at or above 2**63 replays whole.

The file is generated here (``tracegen.rocprofv3_json``, the layout rocprofiler-sdk writes) with
kernel dispatches and memory copies on two GPUs; agent, queue and stream handles, correlation,
kernel, dispatch, code-object and thread ids and hive ids all lie in [2**63, 2**64), and fields
no parser needs also hold 2**64 + 5, 2**80, -1, 1e999 and strings. ``aaco replay`` (the installed
command) must land every dispatch and copy in the lake: count and summed end - start per kind
equal to a count made here from the file with Python's ``json`` module, correlation ids equal
bit for bit (stored as the int64 of the same 64 bits), each dispatch on the GPU its agent handle
names.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest

from tests.integration.helpers import run_aaco
from tests.support import tracegen

U63 = 1 << 63
DISPATCHES, COPIES = 6_000, 400


def independent_count(path: Path) -> dict[str, object]:
    """Count, summed ns and correlation ids per kind, straight from the JSON text; the GPU of each dispatch."""
    doc = json.loads(path.read_text())
    out: dict[str, object] = {}
    devices: Counter[str] = Counter()
    for proc in doc["rocprofiler-sdk-tool"]:
        gpus = {a["id"]["handle"]: str(a["logical_node_type_id"]) for a in proc["agents"] if a["type"] == 2}
        for section, kind in (("kernel_dispatch", "kernel"), ("memory_copy", "memcpy")):
            recs = proc["buffer_records"][section]
            n, ns, corr = out.get(kind, (0, 0, set()))  # type: ignore[misc]
            n += len(recs)
            ns += sum(r["end_timestamp"] - r["start_timestamp"] for r in recs)
            corr |= {r["correlation_id"]["internal"] for r in recs}
            out[kind] = (n, ns, corr)
            if section == "kernel_dispatch":
                devices.update(gpus[r["dispatch_info"]["agent_id"]["handle"]] for r in recs)
    out["devices"] = devices
    return out


def every_id_is_big(path: Path) -> None:
    """The generated file really holds ids at or above 2**63 everywhere the test claims."""
    doc = json.loads(path.read_text())["rocprofiler-sdk-tool"][0]
    assert all(a["id"]["handle"] >= U63 and a["hive_id"] >= U63 for a in doc["agents"])
    assert all(s["kernel_id"] >= U63 and s["code_object_id"] >= U63 for s in doc["kernel_symbols"])
    assert all(c["code_object_id"] >= U63 for c in doc["code_objects"])
    for r in doc["buffer_records"]["kernel_dispatch"]:
        info = r["dispatch_info"]
        assert min(r["correlation_id"]["internal"], r["thread_id"], r["stream_id"]["handle"]) >= U63
        handles = (info["agent_id"]["handle"], info["queue_id"]["handle"])
        assert min(*handles, info["kernel_id"], info["dispatch_id"]) >= U63
    for r in doc["buffer_records"]["memory_copy"]:
        assert min(r["correlation_id"]["internal"], r["src_agent_id"]["handle"], r["dst_agent_id"]["handle"]) >= U63
    assert all(r["correlation_id"]["internal"] >= U63 for r in doc["buffer_records"]["hip_api"])
    assert doc["agents"][0]["odd"]["huge"] == 2**80 and doc["agents"][0]["odd"]["inf"] == float("inf")


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, aaco_bin: str) -> tuple[Path, Path, dict]:
    work = tmp_path_factory.mktemp("u64")
    trace = work / "4242_results.json"
    truth = tracegen.rocprofv3_json(trace, DISPATCHES, COPIES, big_ids=True, odd_values=True, seed=13)
    proc = run_aaco(aaco_bin, "replay", str(trace), "--out", str(work / "lake"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return trace, work / "lake", truth


def test_the_file_is_what_the_test_claims(replayed):
    trace, _, truth = replayed
    every_id_is_big(trace)
    count = independent_count(trace)
    assert count["kernel"][:2] == (DISPATCHES, truth["kernel_ns"])  # type: ignore[index]
    assert count["memcpy"][:2] == (COPIES, truth["copy_ns"])  # type: ignore[index]


def test_every_dispatch_and_copy_lands(replayed):
    trace, lake, _ = replayed
    count = independent_count(trace)
    kernels = ds.dataset(lake / "kernels", partitioning="hive").to_table()
    for kind in ("kernel", "memcpy"):
        rows = kernels.filter(pc.equal(kernels["kind"], kind))
        n, ns, corr = count[kind]  # type: ignore[misc]
        assert rows.num_rows == n, kind
        assert pc.sum(pc.subtract(rows["end_ns"], rows["start_ns"])).as_py() == ns, kind
        stored = rows["correlation_id"].to_numpy().astype(np.int64).view(np.uint64)
        assert {int(c) for c in stored} == corr, kind  # the same 64 bits, read back unsigned
    dispatches = kernels.filter(pc.equal(kernels["kind"], "kernel"))
    assert Counter(dispatches["device"].to_pylist()) == count["devices"]
    assert set(dispatches["launch_name"].to_pylist()) == {"hipLaunchKernel"}
    assert pc.min(dispatches["queue_id"]).as_py() < 0  # 2**63 and up, as int64 of the same bits


def test_sources_record_skips_nothing(replayed):
    _, lake, _ = replayed
    (record,) = json.loads((lake / "sources.json").read_text())["sources"]
    assert record["format"] == "rocprofv3_json"
    assert record["events"]["kernels"] == DISPATCHES + COPIES
    assert record["skipped"] == {}
    assert set(record["devices"]) == {"0", "1"}
