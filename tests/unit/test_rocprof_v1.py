"""rocprof v1/v2: the real results.json (HIP trace, strings for numbers, DataFlow launches) and results.csv."""

from __future__ import annotations

import csv
import io
import json

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from aaco.agent.sources.traces.context import MAX_NAME_BYTES
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.clock import ClockOffset
from aaco.contract.schemas import conform

CLOCK = ClockOffset(1_000_000_000_000_000_000, 10, "test")


def parse(path):
    tf = identify(path)
    return tf, list(parse_any(tf, context_for(tf, node="n", source="rocprof", clock=CLOCK)))


def kernels_of(parts) -> pa.Table:
    return pa.Table.from_batches([conform("kernels", p.kernels) for p in parts])


def durations(t: pa.Table) -> list[int]:
    return pc.subtract(t["end_ns"], t["start_ns"]).to_pylist()


def test_results_json_sample(samples):
    path = samples / "rocprof-v1/hip_trace_results.json"
    doc = json.loads(path.read_text())
    tf, parts = parse(path)
    assert tf.format == "rocprof_v1_json"
    k = kernels_of(parts)
    copies = k.filter(pc.equal(k["kind"], "memcpy"))
    kernels = k.filter(pc.equal(k["kind"], "kernel"))
    assert copies.num_rows == 6 and kernels.num_rows == 1
    expected = [
        int(e["args"]["EndNs"]) - int(e["args"]["BeginNs"])
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and str(e.get("pid")) == "1"
    ]
    assert sorted(durations(copies)) == sorted(expected)
    assert sum(durations(copies)) == 686_681
    assert durations(kernels) == [5_280]
    assert kernels["name"].to_pylist() == ["elementwise_kernel"]
    assert set(k["device"].to_pylist()) == {"2"}  # dev-id 2 = lane GPU2
    assert parts[0].devices == {
        "2": {"type": "GPU", "name": "gfx90a", "product_name": "AMDInstinctMI210", "label": "GPU2"}
    }
    assert set(k["pid"].to_pylist()) == {517} and set(k["tid"].to_pylist()) == {517}
    assert k["start_ns"][0].as_py() == 773_902_396_463_126 + CLOCK.offset_ns


def test_results_json_launches_from_dataflow(samples):
    path = samples / "rocprof-v1/hip_trace_results.json"
    doc = json.loads(path.read_text())
    hip_calls = [e for e in doc["traceEvents"] if e.get("ph") == "X" and str(e.get("pid")) == "2"]
    assert len(hip_calls) == 135
    _, parts = parse(path)
    k = kernels_of(parts)
    by_name = {r["name"]: r for r in k.to_pylist()}
    kernel = by_name["elementwise_kernel"]
    assert kernel["launch_name"] == "hipLaunchKernel"
    assert kernel["correlation_id"] == 7  # the DataFlow id
    assert kernel["launch_start_ns"] == 773_902_396_887_930 + CLOCK.offset_ns
    assert kernel["launch_end_ns"] == 773_902_406_294_136 + CLOCK.offset_ns
    copies = [r for r in k.to_pylist() if r["kind"] == "memcpy"]
    assert [r["launch_name"] for r in copies] == ["hipMemcpyWithStream"] * 6
    assert sorted(r["correlation_id"] for r in copies) == [0, 1, 2, 3, 4, 5]
    assert [r["bytes"] for r in copies] == [24, 24, 8, 8, 8, 24]  # sizeBytes(...) of each launching call
    for r in k.to_pylist():
        assert r["launch_start_ns"] <= r["start_ns"]
        assert r["launch_end_ns"] >= r["launch_start_ns"]


V1_CSV = (
    "Index,KernelName,gpu-id,queue-id,queue-index,pid,tid,grd,wgr,lds,scr,arch_vgpr,accum_vgpr,sgpr,wave_size,"
    "sig,obj,DispatchNs,BeginNs,EndNs,CompleteNs\n"
    '0,"bodyForce(Body*, float, int) [clone .kd]",0,0,0,3673711,3673711,65536,256,0,0,20,4,16,64,0x0,'
    "0x7f2b4d282500,4556288436792544,4556288440165491,4556288440211571,4556288440226587\n"
    '1,"copy_kernel(float*, float*, int, int) [clone .kd]",1,0,1,3673711,3673712,16777216,1024,0,0,4,0,24,64,0x0,'
    "0x7f2b4d282600,4556288440300000,4556288440310000,4556288440476000,4556288440480000\n"
)
V2_CSV = (
    "Dispatch_ID,GPU_ID,Queue_ID,PID,TID,Grid_Size,Workgroup_Size,LDS_Per_Workgroup,Scratch_Per_Workitem,Arch_VGPR,"
    "Accum_VGPR,SGPR,Wave_Size,Kernel_Name,Start_Timestamp,End_Timestamp,Correlation_ID,SQ_WAVES\n"
    '1,0,0,900,901,1048576,256,0,0,8,0,16,64,"vector_add(float*, float*)",1000000,1003000,11,4096\n'
)


def test_results_csv_v1(tmp_path):
    (tmp_path / "results.csv").write_text(V1_CSV)
    tf, parts = parse(tmp_path / "results.csv")
    assert tf.format == "rocprof_v1_csv"
    k = kernels_of(parts)
    assert k.num_rows == 2
    assert durations(k) == [46_080, 166_000]
    assert k["device"].to_pylist() == ["0", "1"]
    assert k["name"].to_pylist()[0] == "bodyForce(Body*, float, int) [clone .kd]"
    assert k["pid"].to_pylist() == [3673711, 3673711] and k["tid"].to_pylist() == [3673711, 3673712]
    assert k["grid_x"].to_pylist() == [65536, 16777216] and k["workgroup_x"].to_pylist() == [256, 1024]
    assert parts[0].pids == (3673711,)


def test_results_csv_v2_file_plugin(tmp_path):
    (tmp_path / "out.csv").write_text(V2_CSV)
    tf, parts = parse(tmp_path / "out.csv")
    assert tf.format == "rocprof_v1_csv"
    k = kernels_of(parts)
    assert k["name"].to_pylist() == ["vector_add(float*, float*)"]
    assert durations(k) == [3_000] and k["correlation_id"].to_pylist() == [11]


def test_results_csv_bad_rows(tmp_path):
    lines = V1_CSV.splitlines()
    lines.insert(2, "2,broken")
    lines.append('3,"late",0,0,0,1,1,1,1,0,0,1,0,1,64,0x0,0x0,5,9,8,9')  # ends before it begins
    (tmp_path / "results.csv").write_text("\n".join(lines) + "\n")
    _, parts = parse(tmp_path / "results.csv")
    assert kernels_of(parts).num_rows == 2
    assert sorted(b.reason for b in parts[0].bad_rows) == ["bad_time", "column_count"]


def test_truncated_results_json_keeps_events_before_the_cut(samples, tmp_path):
    data = (samples / "rocprof-v1/hip_trace_results.json").read_bytes()
    cut = data.index(b'"name":"CopyDeviceToHost"')  # in the 3rd copy: the first two are complete
    (tmp_path / "cut.json").write_bytes(data[:cut])
    _, parts = parse(tmp_path / "cut.json")
    k = kernels_of(parts)
    assert k["name"].to_pylist() == ["CopyHostToDevice", "CopyHostToDevice"]
    assert parts[0].skipped["truncated_json"] == 1


def test_results_json_anchor_is_the_largest_raw_end(samples):
    path = samples / "rocprof-v1/hip_trace_results.json"
    doc = json.loads(path.read_text())
    ends = [int(e["args"]["EndNs"]) for e in doc["traceEvents"] if e.get("ph") == "X"]
    _, parts = parse(path)
    assert parts[0].anchor_raw_ns == max(ends)
    assert all(p.anchor_raw_ns is None for p in parts[1:])


# --- bad values: counted and left out, never raised --------------------------------------------

BEGIN = 773_902_396_463_126


def mini_json(**changes) -> dict:
    """A results.json of one HIP launch (flow 0) of one kernel on GPU0, one copy; ``changes`` edit it."""
    calls = {"BeginNs": str(BEGIN - 20_000), "EndNs": str(BEGIN - 10_000), "pid": "9", "tid": "9"}
    kernel = {"BeginNs": str(BEGIN), "EndNs": str(BEGIN + 5_000), "dev-id": "0", "queue-id": "0", "pid": "9"}
    events = [
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "CPU HIP API"}},
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "COPY"}},
        {"ph": "M", "pid": 6, "name": "process_name", "args": {"name": "GPU0"}},
        {
            "ph": "X",
            "name": "hipMemcpy",
            "pid": "2",
            "tid": "9",
            "ts": str((BEGIN - 40_000) // 1000),
            "dur": "10",
            "args": {**calls, "BeginNs": str(BEGIN - 40_000), "args": "( sizeBytes(64))"},
        },
        {
            "ph": "X",
            "name": "hipLaunchKernel",
            "pid": "2",
            "tid": "9",
            "ts": str((BEGIN - 20_000) // 1000),
            "dur": "10",
            "args": calls,
        },
        {"ph": "X", "name": "gemm", "pid": "6", "tid": "1", "ts": str(BEGIN // 1000), "dur": "5", "args": kernel},
        {
            "ph": "X",
            "name": "CopyHostToDevice",
            "pid": "1",
            "tid": "1",
            "ts": str((BEGIN + 10_000) // 1000),
            "dur": "1",
            "args": {**kernel, "BeginNs": str(BEGIN + 10_000), "EndNs": str(BEGIN + 11_000)},
        },
        {"ph": "s", "id": 1, "pid": 2, "tid": 9, "ts": (BEGIN - 35_000) // 1000},
        {"ph": "t", "id": 1, "pid": 1, "tid": 1, "ts": (BEGIN + 10_000) // 1000},
        {"ph": "s", "id": 0, "pid": 2, "tid": 9, "ts": (BEGIN - 15_000) // 1000},
        {"ph": "t", "id": 0, "pid": 6, "tid": 1, "ts": BEGIN // 1000},
    ]
    for where, value in changes.items():  # "event name|key" or "flow id|key"; "args.x" is args["x"]
        name, key = where.split("|")
        ev = next(e for e in events if e.get("name") == name or (str(e.get("id")) == name and e["ph"] == "s"))
        (ev["args"] if key.startswith("args.") else ev)[key.removeprefix("args.")] = value
    return {"traceEvents": events}


def parse_doc(tmp_path, doc):
    path = tmp_path / "results.json"
    path.write_bytes(json.dumps(doc).encode())
    _, parts = parse(path)
    return parts, {r["name"]: r for r in kernels_of(parts).to_pylist()}


def test_mini_results_json(tmp_path):
    parts, k = parse_doc(tmp_path, mini_json())
    assert k["gemm"]["launch_name"] == "hipLaunchKernel" and k["gemm"]["correlation_id"] == 0
    assert k["CopyHostToDevice"]["bytes"] == 64 and k["CopyHostToDevice"]["correlation_id"] == 1
    assert dict(parts[0].skipped) == {}
    assert parts[0].anchor_raw_ns == BEGIN + 11_000


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({("gemm", "args.BeginNs"): str(2**70)}, "int_out_of_range"),
        ({("gemm", "args.EndNs"): str(2**64)}, "int_out_of_range"),
        ({("gemm", "args.dev-id"): str(2**63)}, "int_out_of_range"),
        ({("gemm", "args.pid"): "-" + str(2**66)}, "int_out_of_range"),
        ({("gemm", "args.stream-id"): 2.5e30}, "int_out_of_range"),
        ({("gemm", "pid"): str(2**80)}, "int_out_of_range"),
        ({("gemm", "args.EndNs"): str(BEGIN - 1)}, "bad_time"),
        ({("gemm", "name"): "g" * (MAX_NAME_BYTES + 1)}, "name_too_long"),
    ],
)
def test_results_json_bad_kernel_is_counted_and_the_rest_kept(tmp_path, change, reason):
    parts, k = parse_doc(tmp_path, mini_json(**{"|".join(key): v for key, v in change.items()}))
    assert set(k) == {"CopyHostToDevice"}
    assert dict(parts[0].skipped) == {reason: 1}
    assert k["CopyHostToDevice"]["launch_name"] == "hipMemcpy"


def test_results_json_bad_auxiliary_values_leave_a_null(tmp_path):
    parts, k = parse_doc(
        tmp_path,
        mini_json(
            **{"hipMemcpy|args.args": f"( sizeBytes({2**70}))", "hipLaunchKernel|name": "h" * (MAX_NAME_BYTES + 1)}
        ),
    )
    assert set(k) == {"gemm", "CopyHostToDevice"}
    assert k["CopyHostToDevice"]["bytes"] is None and k["CopyHostToDevice"]["launch_name"] == "hipMemcpy"
    assert k["gemm"]["launch_name"] is None and k["gemm"]["launch_start_ns"] == BEGIN - 20_000 + CLOCK.offset_ns
    assert dict(parts[0].skipped) == {"int_out_of_range": 1, "name_too_long": 1}
    # a flow id beyond int64 loses that link only
    parts, k = parse_doc(tmp_path, mini_json(**{"0|id": 2**80}))
    assert k["gemm"]["launch_name"] is None and k["CopyHostToDevice"]["launch_name"] == "hipMemcpy"
    assert parts[0].skipped["int_out_of_range"] == 1


def test_times_converted_outside_1990_2100_are_left_out(tmp_path):
    path = tmp_path / "results.json"
    path.write_bytes(json.dumps(mini_json()).encode())
    tf = identify(path)
    parts = list(parse_any(tf, context_for(tf, node="n", source="s", clock=ClockOffset(7_000_000_000, 1, "t"))))
    assert sum(p.kernels.num_rows for p in parts) == 0
    assert dict(parts[0].skipped) == {"time_out_of_range": 2}
    assert parts[0].anchor_raw_ns == BEGIN + 11_000  # still known: it anchors the file on another boot
    conform("kernels", parts[0].kernels)


def test_results_csv_values_beyond_int64(tmp_path):
    header, *rows = list(csv.reader(io.StringIO(V1_CSV)))
    col = {name: i for i, name in enumerate(header)}
    for name, value in (("pid", str(2**70)), ("BeginNs", str(2**64)), ("EndNs", "x"), ("BeginNs", "")):
        bad = list(rows[1])
        bad[col[name]] = value
        rows.append(bad)
    sizes = list(rows[1])
    sizes[col["grd"]], sizes[col["wgr"]] = str(2**63), "-" + str(2**65)  # sizes the kernel can do without
    rows.append(sizes)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([header, *rows])
    (tmp_path / "results.csv").write_text(out.getvalue())
    _, parts = parse(tmp_path / "results.csv")
    k = kernels_of(parts)
    assert k.num_rows == 3
    assert dict(parts[0].skipped) == {"int_out_of_range": 4, "bad_time": 1, "missing_value": 1}
    reasons = sorted(b.reason for b in parts[0].bad_rows)
    assert reasons == ["bad_time", "int_out_of_range", "int_out_of_range", "missing_value"]
    assert k["grid_x"].to_pylist() == [65536, 16777216, None] and k["workgroup_x"].to_pylist() == [256, 1024, None]
    assert parts[0].anchor_raw_ns == 4556288440476000


def test_results_csv_out_of_epoch_range(tmp_path):
    (tmp_path / "results.csv").write_text(V1_CSV)
    tf = identify(tmp_path / "results.csv")
    parts = list(parse_any(tf, context_for(tf, node="n", source="s", clock=ClockOffset(-(10**18), 1, "t"))))
    assert sum(p.kernels.num_rows for p in parts) == 0
    assert dict(parts[0].skipped) == {"time_out_of_range": 2}
    conform("kernels", parts[0].kernels)
