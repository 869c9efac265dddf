"""rocprofv3 JSON (--output-format json): a file of the documented structure, built here, streamed."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from aaco.agent.sources.traces import rocprofv3_json
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.limits import TraceLimitError, TraceLimits
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.clock import ClockOffset
from aaco.contract.schemas import conform

CLOCK = ClockOffset(1_700_000_000_000_000_000, 10, "test")
PID = 4242
N_KERNELS = 19
# rocprofiler_buffer_tracing_kind_t order does not matter here: records name kinds by index
KINDS = [
    {"kind": "NONE", "operations": []},
    {"kind": "HIP_RUNTIME_API", "operations": ["hipNone", "hipLaunchKernel", "hipMemcpyAsync"]},
    {"kind": "MARKER_CORE_API", "operations": ["roctxMarkA", "roctxRangePushA", "roctxRangePop"]},
    {"kind": "KERNEL_DISPATCH", "operations": ["KERNEL_DISPATCH_NONE", "KERNEL_DISPATCH_COMPLETE"]},
    {
        "kind": "MEMORY_COPY",
        "operations": [
            "MEMORY_COPY_NONE",
            "MEMORY_COPY_HOST_TO_HOST",
            "MEMORY_COPY_HOST_TO_DEVICE",
            "MEMORY_COPY_DEVICE_TO_HOST",
            "MEMORY_COPY_DEVICE_TO_DEVICE",
        ],
    },
]
HIP, MARKER, DISPATCH, COPY = 1, 2, 3, 4
CPU_HANDLE, GPU0_HANDLE, GPU1_HANDLE = 9001, 9002, 9003


def agent(handle: int, kind: int, node: int, type_index: int, name: str, product: str) -> dict:
    return {
        "size": 600,
        "id": {"handle": handle},
        "type": kind,
        "node_id": node,
        "logical_node_id": node,
        "logical_node_type_id": type_index,
        "name": name,
        "product_name": product,
        "cpu_cores_count": 0,
        "simd_count": 304,
    }


def symbol(kid: int) -> dict:
    return {
        "size": 200,
        "kernel_id": kid,
        "code_object_id": 1,
        "kernel_name": f"_Z7kernel{kid}Pf",
        "kernel_object": 1000 + kid,
        "kernarg_segment_size": 16,
        "kernarg_segment_alignment": 8,
        "group_segment_size": 0,
        "private_segment_size": 0,
        "formatted_kernel_name": f"kernel{kid}(float*)",
        "demangled_kernel_name": f"kernel{kid}(float*)",
        "truncated_kernel_name": f"kernel{kid}",
    }


def corr(i: int) -> dict:
    return {"internal": i, "external": 0}


def build(n: int, seed: int = 7, copies: int = 50, as_object: bool = False) -> tuple[dict, dict]:
    """A rocprofv3 JSON document and what it holds (count, summed time, names, ...)."""
    rng = random.Random(seed)
    t = 5_000_000_000
    dispatch, hip, names, total = [], [], {}, 0
    for i in range(1, n + 1):
        kid = 1 + i % N_KERNELS
        dur = rng.randint(1_000, 90_000)
        hip.append(
            {
                "size": 64,
                "kind": HIP,
                "operation": 1,
                "correlation_id": corr(i),
                "start_timestamp": t - 3_000,
                "end_timestamp": t - 1_000,
                "thread_id": 555,
            }
        )
        dispatch.append(
            {
                "size": 144,
                "kind": DISPATCH,
                "operation": 1,
                "thread_id": 556,
                "correlation_id": corr(i),
                "start_timestamp": t,
                "end_timestamp": t + dur,
                "dispatch_info": {
                    "size": 96,
                    "agent_id": {"handle": GPU1_HANDLE if i % 4 == 0 else GPU0_HANDLE},
                    "queue_id": {"handle": 77},
                    "kernel_id": kid,
                    "dispatch_id": i,
                    "private_segment_size": 0,
                    "group_segment_size": 0,
                    "workgroup_size": {"x": 256, "y": 1, "z": 1},
                    "grid_size": {"x": 65536, "y": 1, "z": 1},
                },
                "stream_id": {"handle": 1},
            }
        )
        names[f"kernel{kid}(float*)"] = names.get(f"kernel{kid}(float*)", 0) + 1
        total += dur
        t += dur + rng.randint(0, 5_000)
    memory_copy, copy_total = [], 0
    for j in range(copies):
        c = n + 1 + j
        dur = 2_000 + j
        hip.append(
            {
                "size": 64,
                "kind": HIP,
                "operation": 2,
                "correlation_id": corr(c),
                "start_timestamp": t - 500,
                "end_timestamp": t + dur + 100,
                "thread_id": 555,
            }
        )
        memory_copy.append(
            {
                "size": 80,
                "kind": COPY,
                "operation": 2 if j % 2 == 0 else 3,
                "thread_id": 555,
                "correlation_id": corr(c),
                "start_timestamp": t,
                "end_timestamp": t + dur,
                "dst_agent_id": {"handle": GPU0_HANDLE if j % 2 == 0 else CPU_HANDLE},
                "src_agent_id": {"handle": CPU_HANDLE if j % 2 == 0 else GPU0_HANDLE},
                "bytes": 4096 * (j + 1),
            }
        )
        copy_total += dur
        t += dur + 10
    markers = [
        {
            "size": 64,
            "kind": MARKER,
            "operation": 1,
            "correlation_id": corr(10_000_000 + k),
            "start_timestamp": 5_000_000_000 + k * 1_000_000,
            "end_timestamp": 5_000_000_000 + (k + 1) * 1_000_000,
            "thread_id": 555,
        }
        for k in range(3)
    ]
    markers.append({**markers[0], "operation": 0, "correlation_id": corr(10_000_099), "end_timestamp": 5_000_000_000})
    process = {
        "metadata": {"pid": PID, "init_time": 1, "fini_time": t, "config": {}, "command": ["./app"]},
        "agents": [
            agent(CPU_HANDLE, 1, 0, 0, "AMD EPYC 9654", "AMD EPYC 9654"),
            agent(GPU0_HANDLE, 2, 1, 0, "gfx942", "AMD Instinct MI300X"),
            agent(GPU1_HANDLE, 2, 2, 1, "gfx942", "AMD Instinct MI300X"),
        ],
        "counters": [],
        "strings": {
            "callback_records": [],
            "buffer_records": KINDS,
            "marker_api": [{"key": 10_000_000 + k, "value": f"step {k}"} for k in range(3)],
            "correlation_id": {"external": []},
        },
        "code_objects": [],
        "kernel_symbols": [symbol(k) for k in range(1, N_KERNELS + 1)],
        "host_functions": [],
        "summary": [],
        "callback_records": {"counter_collection": []},
        "buffer_records": {
            "kernel_dispatch": dispatch,
            "hip_api": hip,
            "hsa_api": [],
            "marker_api": markers,
            "rccl_api": [],
            "memory_copy": memory_copy,
            "memory_allocation": [],
        },
    }
    doc = {"rocprofiler-sdk-tool": process if as_object else [process]}
    return doc, {"n": n, "total": total, "names": names, "copies": copies, "copy_total": copy_total}


def write(path: Path, doc: dict, gz: bool = False) -> Path:
    data = json.dumps(doc, indent=1).encode()
    path.write_bytes(gzip.compress(data, compresslevel=1) if gz else data)
    return path


def parse(path: Path):
    tf = identify(path)
    assert tf.format == "rocprofv3_json"
    return list(parse_any(tf, context_for(tf, node="n", source="rocprofv3", clock=CLOCK)))


def totals(parts) -> tuple[pa.Table, pa.Table]:
    k = pa.Table.from_batches([conform("kernels", p.kernels) for p in parts])
    kernels = k.filter(pc.equal(k["kind"], "kernel"))
    copies = k.filter(pc.equal(k["kind"], "memcpy"))
    return kernels, copies


def dur(t: pa.Table) -> int:
    return pc.sum(pc.subtract(t["end_ns"], t["start_ns"])).as_py() or 0


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[Path, dict]:
    doc, truth = build(40_000)
    return write(tmp_path_factory.mktemp("json") / "results.json", doc), truth


@pytest.fixture(scope="module")
def big_parts(big) -> list:
    return parse(big[0])


def test_40k_dispatches_replay_exactly(big, big_parts):
    _, truth = big
    parts = big_parts
    kernels, copies = totals(parts)
    assert kernels.num_rows == truth["n"] == 40_000
    assert dur(kernels) == truth["total"]
    counts = pc.value_counts(kernels["name"]).to_pylist()
    assert {c["values"]: c["counts"] for c in counts} == truth["names"]  # every name from kernel_symbols
    assert copies.num_rows == truth["copies"] and dur(copies) == truth["copy_total"]
    assert all(p.kernels.num_rows <= 65_536 for p in parts)


def test_launches_devices_iterations(big_parts):
    parts = big_parts
    kernels, copies = totals(parts)
    assert set(kernels["launch_name"].to_pylist()) == {"hipLaunchKernel"}
    assert pc.all(pc.equal(pc.subtract(kernels["start_ns"], kernels["launch_start_ns"]), 3_000)).as_py()
    assert set(kernels["tid"].to_pylist()) == {555}  # the launching thread
    assert set(kernels["pid"].to_pylist()) == {PID}
    assert {d["values"]: d["counts"] for d in pc.value_counts(kernels["device"]).to_pylist()} == {
        "0": 30_000,
        "1": 10_000,
    }
    assert parts[0].devices["1"]["product_name"] == "AMD Instinct MI300X"
    assert copies["name"].to_pylist()[:2] == ["MEMORY_COPY_HOST_TO_DEVICE", "MEMORY_COPY_DEVICE_TO_HOST"]
    assert set(copies["device"].to_pylist()) == {"0"}  # the GPU side of each copy
    assert copies["bytes"].to_pylist()[:2] == [4096, 8192]
    its = parts[0].iterations
    assert its["name"].to_pylist() == ["step 0", "step 1", "step 2"]  # the mark (start == end) is not a range
    assert sum(p.iterations.num_rows for p in parts) == 3
    assert parts[0].pids == (PID,)


def test_streams_in_bounded_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(rocprofv3_json, "CHUNK_ROWS", 1_000)
    doc, truth = build(4_500, copies=10)
    parts = parse(write(tmp_path / "r.json", doc))
    sizes = [p.kernels.num_rows for p in parts]
    assert max(sizes) <= 1_000 and sum(sizes) == 4_510
    assert next(p.iterations.num_rows for p in parts) == 3 and sum(p.iterations.num_rows for p in parts) == 3
    kernels, _ = totals(parts)
    assert dur(kernels) == truth["total"]


def test_object_root_and_gzip(tmp_path):
    doc, truth = build(300, as_object=True)
    parts = parse(write(tmp_path / "r.json.gz", doc, gz=True))
    kernels, copies = totals(parts)
    assert kernels.num_rows == 300 and dur(kernels) == truth["total"]
    assert copies.num_rows == 50


def test_truncated_file_keeps_what_came_before(tmp_path):
    doc, truth = build(2_000, copies=0)
    data = json.dumps(doc, indent=1).encode()
    cut = data.index(b'"hip_api"')  # inside buffer_records, after every dispatch
    (tmp_path / "cut.json").write_bytes(data[:cut])
    parts = parse(tmp_path / "cut.json")
    kernels, _ = totals(parts)
    assert kernels.num_rows == 2_000 and dur(kernels) == truth["total"]
    assert sum(p.skipped["truncated_json"] for p in parts) == 1
    assert any(b.reason == "truncated_json" for p in parts for b in p.bad_rows)


def test_bad_records_are_counted(tmp_path):
    doc, _truth = build(100, copies=0)
    recs = doc["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"]
    del recs[0]["end_timestamp"]
    recs[1]["end_timestamp"] = recs[1]["start_timestamp"] - 1
    recs[2]["dispatch_info"]["kernel_id"] = 999
    parts = parse(write(tmp_path / "r.json", doc))
    kernels, _ = totals(parts)
    assert kernels.num_rows == 98
    skipped = sum((p.skipped for p in parts), start=type(parts[0].skipped)())
    assert skipped == {"missing_value": 1, "bad_time": 1, "unknown_kernel_id": 1}
    assert "kernel_id:999" in kernels["name"].to_pylist()


# --- the file's limits (limits) ------------------------------------------------------------


def direct(path: Path, limits: TraceLimits) -> list:
    tf = identify(path)
    ctx = context_for(tf, node="n", source="rocprofv3", clock=CLOCK)
    return list(rocprofv3_json.parse_rocprofv3_json(path, ctx, limits=limits))


def test_nesting_past_the_limit_is_json_too_deep_not_truncated(tmp_path):
    doc, _ = build(500, copies=0)
    recs = doc["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"]
    recs[300]["unknown"] = "@"  # a field nobody reads: here it nests 40 deep
    data = json.dumps(doc, indent=1).encode().replace(b'"@"', b"[" * 40 + b"]" * 40)
    path = tmp_path / "deep.json"
    path.write_bytes(data)
    whole = direct(path, TraceLimits(max_json_depth=64))
    assert totals(whole)[0].num_rows == 500 and not any(p.skipped for p in whole)
    parts = direct(path, TraceLimits(max_json_depth=32))
    kernels, _ = totals(parts)
    assert kernels.num_rows == 300  # the records before the deep one
    assert sum((p.skipped for p in parts), start=type(parts[0].skipped)()) == {"json_too_deep": 1}
    (bad,) = [b for p in parts for b in p.bad_rows]
    # a record is 6 deep ({"rocprofiler-sdk-tool": [{"buffer_records": {"kernel_dispatch": [{): its
    # field's 27th bracket is the 33rd level
    assert bad.offset == data.index(b"[" * 40) + 26
    assert bad.reason == "json_too_deep" and b"max_json_depth" in bad.line


def test_size_and_bomb_limits_are_the_files(tmp_path):
    doc, _ = build(2_000, copies=0)
    path = write(tmp_path / "r.json.gz", doc, gz=True)
    size = len(json.dumps(doc, indent=1).encode())
    assert totals(direct(path, TraceLimits(max_file_bytes=size)))[0].num_rows == 2_000
    with pytest.raises(TraceLimitError) as exc:
        direct(path, TraceLimits(max_file_bytes=size - 1))
    assert exc.value.limit == "max_file_bytes"
    with pytest.raises(TraceLimitError) as exc:
        direct(path, TraceLimits(max_gzip_ratio=2, gzip_grace_bytes=1 << 16))
    assert exc.value.limit == "max_gzip_ratio"
