"""ONNX Runtime profile parsing on synthetic profiles (CPU and GPU provider variants)."""

from __future__ import annotations

import json

import orjson
import pytest

from aaco.agent.sources.traces.context import MAX_NAME_BYTES
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.ort_profile import MAX_PROFILE_US, parse_ort_profile, profile_extent_us
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.clock import ClockOffset
from aaco.contract.ids import span_id, trace_id
from aaco.contract.schemas import conform

OFF = 1_700_000_000_000_000_000
CLOCK = ClockOffset(OFF, 1000, "ort-profiling-start")
PID, TID = 4242, 4243


def session(name, ts, dur):
    return {"cat": "Session", "pid": PID, "tid": TID, "dur": dur, "ts": ts, "ph": "X", "name": name, "args": {}}


def node(name, ts, dur, op, provider="CPUExecutionProvider"):
    return {
        "cat": "Node",
        "pid": PID,
        "tid": TID,
        "dur": dur,
        "ts": ts,
        "ph": "X",
        "name": f"{name}_kernel_time",
        "args": {"op_name": op, "provider": provider, "thread_scheduling_stats": {}},
    }


def fence(name, ts):
    return {
        "cat": "Node",
        "pid": PID,
        "tid": TID,
        "dur": 0,
        "ts": ts,
        "ph": "X",
        "name": f"{name}_fence_before",
        "args": {"op_name": "Conv"},
    }


def gpu_kernel(name, ts, dur, parent, **args):
    a = {
        "parent_name": parent,
        "op_name": "Conv",
        "stream": 7,
        "grid_x": 64,
        "grid_y": 2,
        "grid_z": 1,
        "block_x": 128,
        "block_y": 1,
        "block_z": 1,
    }
    a.update(args)
    return {"cat": "Kernel", "pid": PID, "tid": 9, "dur": dur, "ts": ts, "ph": "X", "name": name, "args": a}


def cpu_profile():
    return [
        session("model_loading_uri", 0, 40),
        session("session_initialization", 45, 30),
        # warmup run
        session("model_run", 100, 50),
        fence("conv", 109),
        node("conv", 110, 10, "Conv"),
        # timed run 0
        node("relu", 225, 5, "Relu"),  # out of order on purpose
        session("model_run", 200, 50),
        node("conv", 210, 10, "Conv"),
        # timed run 1
        session("model_run", 300, 60),
        node("conv", 310, 12, "Conv"),
        node("relu", 325, 3, "Relu"),
        # bad events, counted
        "not an event",
        {"cat": "Node", "name": "x_kernel_time", "pid": PID, "dur": 1},  # no ts
        {"cat": "Node", "name": "y_kernel_time", "pid": PID, "ts": 330, "dur": -1},
        {"cat": "Node", "name": 17, "pid": PID, "ts": 330, "dur": 1},
        {"cat": "Session", "name": "model_run", "ts": "later", "dur": 1},
        # other categories are not ours, and not errors
        {"cat": "Api", "name": "whatever", "ts": 1, "dur": 1},
    ]


def parse(events, **kw):
    args = {"clock": CLOCK, "node": "n1", "identity": "ident", "run_id": "run", "model": "resnet"}
    args.update(kw)
    return parse_ort_profile(events, **args)


def test_cpu_profile_iterations_skip_warmup():
    p = parse(cpu_profile(), skip_runs=1, graph_nodes=415, graph_nodes_optimized=200, provider="cpu", source="ort-a")
    assert p.format == "ort_profile"
    it = p.iterations.to_pylist()
    assert [r["start_ns"] for r in it] == [OFF + 200_000, OFF + 300_000]
    assert [r["end_ns"] for r in it] == [OFF + 250_000, OFF + 360_000]
    assert [r["iteration"] for r in it] == [0, 1]
    assert [r["trace_id"] for r in it] == [trace_id("n1", "ident", 0), trace_id("n1", "ident", 1)]
    assert [r["span_id"] for r in it] == [span_id("n1", "ident", 0), span_id("n1", "ident", 1)]
    for r in it:
        assert (r["pid"], r["tid"], r["node"], r["model"], r["run_id"]) == (PID, TID, "n1", "resnet", "run")
        assert (r["source"], r["name"], r["provider"]) == ("ort-a", "model_run", "cpu")
        assert (r["graph_nodes"], r["graph_nodes_optimized"]) == (415, 200)
    assert p.pids == (PID,)
    conform("iterations", p.iterations)  # publishable as is


def test_cpu_profile_kernels_after_first_kept_run():
    p = parse(cpu_profile(), skip_runs=1)
    k = p.kernels.to_pylist()
    # the warmup conv (ts 110) is dropped; the rest sorted by start
    assert [r["start_ns"] for r in k] == [OFF + 210_000, OFF + 225_000, OFF + 310_000, OFF + 325_000]
    assert [r["end_ns"] - r["start_ns"] for r in k] == [10_000, 5_000, 12_000, 3_000]
    assert [r["name"] for r in k] == ["Conv", "Relu", "Conv", "Relu"]
    assert [r["graph_node"] for r in k] == ["conv", "relu", "conv", "relu"]
    assert [r["op_name"] for r in k] == ["Conv", "Relu", "Conv", "Relu"]
    for r in k:
        assert r["device"] == "cpu"
        assert r["kind"] == "kernel"
        assert r["launch_start_ns"] is None
        assert r["correlation_id"] is None
        assert r["stream"] is None
        assert (r["pid"], r["tid"], r["node"], r["run_id"], r["source"]) == (PID, TID, "n1", "run", "ort")
    conform("kernels", p.kernels)


def test_no_skip_keeps_warmup_run():
    p = parse(cpu_profile())
    assert p.iterations.num_rows == 3
    assert p.kernels.num_rows == 5
    assert p.iterations.column("iteration").to_pylist() == [0, 1, 2]


def test_bad_events_are_counted():
    p = parse(cpu_profile(), skip_runs=1)
    assert dict(p.skipped) == {"not_an_event": 1, "bad_time": 3, "bad_name": 1}


def test_string_and_float_times_are_accepted():
    events = [
        {"cat": "Session", "name": "model_run", "ts": "100", "dur": 50.4, "pid": PID, "tid": TID},
        {
            "cat": "Node",
            "name": "a_kernel_time",
            "ts": 110.6,
            "dur": "5",
            "pid": PID,
            "tid": TID,
            "args": {"op_name": "Add", "provider": "CPUExecutionProvider"},
        },
        {"cat": "Node", "name": "b_kernel_time", "ts": True, "dur": 1, "pid": PID},  # a bool is not a time
    ]
    p = parse(events)
    assert p.iterations.column("start_ns").to_pylist() == [OFF + 100_000]
    assert p.iterations.column("end_ns").to_pylist() == [OFF + 150_000]
    assert p.kernels.column("start_ns").to_pylist() == [OFF + 111_000]
    assert p.kernels.column("end_ns").to_pylist() == [OFF + 116_000]
    assert p.skipped["bad_time"] == 1


def test_not_a_list_is_an_error():
    with pytest.raises(ValueError):
        parse({"traceEvents": []})


def test_empty_profile():
    p = parse([])
    assert p.kernels.num_rows == 0
    assert p.iterations.num_rows == 0
    conform("kernels", p.kernels)
    conform("iterations", p.iterations)


def gpu_profile():
    return [
        session("model_run", 100, 50),  # warmup
        node("conv", 105, 5, "Conv", "CUDAExecutionProvider"),
        gpu_kernel("warm_sgemm", 112, 10, "conv"),
        session("model_run", 200, 80),
        node("shape", 202, 1, "Shape", "CPUExecutionProvider"),
        node("conv", 210, 5, "Conv", "CUDAExecutionProvider"),
        gpu_kernel("sgemm", 216, 20, "conv", device=1),
        gpu_kernel("MemcpyHostToDevice", 240, 4, "copy_in", stream_id=3, stream=None),
        gpu_kernel("orphan", 250, 2, "no_such_node", grid_x="8"),
    ]


def test_gpu_profile_kernels_with_launch():
    p = parse(gpu_profile(), skip_runs=1)
    k = {r["name"]: r for r in p.kernels.to_pylist()}
    assert set(k) == {"Shape", "sgemm", "MemcpyHostToDevice", "orphan"}
    # a CPU-provider node in a GPU profile is a CPU kernel
    assert k["Shape"]["device"] == "cpu"
    assert k["Shape"]["launch_start_ns"] is None
    # the GPU kernel takes its launch from its parent node
    s = k["sgemm"]
    assert s["start_ns"] == OFF + 216_000
    assert s["end_ns"] == OFF + 236_000
    assert s["launch_start_ns"] == OFF + 210_000
    assert s["launch_end_ns"] == OFF + 215_000
    assert s["graph_node"] == "conv"
    assert s["op_name"] == "Conv"
    assert s["device"] == "1"
    assert s["stream"] == 7
    assert s["kind"] == "kernel"
    assert (s["grid_x"], s["grid_y"], s["grid_z"]) == (64, 2, 1)
    assert (s["workgroup_x"], s["workgroup_y"], s["workgroup_z"]) == (128, 1, 1)
    assert s["tid"] == 9
    m = k["MemcpyHostToDevice"]
    assert m["kind"] == "memcpy"
    assert m["device"] == "0"
    assert m["launch_start_ns"] is None
    o = k["orphan"]
    assert o["launch_start_ns"] is None
    assert o["graph_node"] == "no_such_node"
    assert o["grid_x"] == 8
    # the CUDA-provider node itself is not a kernel row
    assert "Conv" not in k
    assert p.kernels.column("start_ns").to_pylist() == sorted(p.kernels.column("start_ns").to_pylist())
    conform("kernels", p.kernels)


def test_gpu_provider_node_without_kernel_events_is_gpu_device():
    events = [session("model_run", 100, 50), node("conv", 110, 5, "Conv", "ROCMExecutionProvider")]
    k = parse(events).kernels.to_pylist()
    assert len(k) == 1
    assert k[0]["device"] == "gpu"
    assert k[0]["name"] == "Conv"


def test_gpu_kernels_of_every_run_get_their_own_launch():
    events = [
        session("model_run", 100, 80),
        node("conv", 110, 5, "Conv", "CUDAExecutionProvider"),
        gpu_kernel("sgemm", 120, 10, "conv"),
        session("model_run", 300, 80),
        node("conv", 310, 5, "Conv", "CUDAExecutionProvider"),
        gpu_kernel("sgemm", 320, 10, "conv"),
    ]
    k = parse(events).kernels.to_pylist()
    assert [r["launch_start_ns"] for r in k] == [OFF + 110_000, OFF + 310_000]


def test_all_runs_skipped_publishes_no_warmup_kernels():
    events = [session("model_run", 100, 50), node("conv", 110, 10, "Conv")]
    p = parse(events, skip_runs=1)
    assert p.iterations.num_rows == 0
    assert p.kernels.num_rows == 0


def test_profile_extent_us():
    assert profile_extent_us(cpu_profile()) == 360
    assert profile_extent_us([]) == 0
    assert profile_extent_us(["x", {"ts": 5}, {"ts": "7", "dur": 3}]) == 10


# --- bad values: counted and left out, never raised --------------------------------------------


def loaded(events):
    """``events`` as orjson loads them (integers beyond 64 bits arrive as floats)."""
    return orjson.loads(json.dumps(events))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"pid": 2**70}, "int_out_of_range"),
        ({"tid": 2**63}, "int_out_of_range"),
        ({"args": {"parent_name": "conv", "device": 2**64}}, "int_out_of_range"),
        ({"args": {"parent_name": "conv", "stream_id": -(2**65)}}, "int_out_of_range"),
        ({"ts": 1e24}, "time_out_of_range"),
        ({"ts": 2**64}, "time_out_of_range"),
        ({"dur": MAX_PROFILE_US}, "time_out_of_range"),
        ({"ts": "NaN"}, "bad_time"),
        ({"ts": -1}, "bad_time"),
        ({"name": "k" * (MAX_NAME_BYTES + 1)}, "name_too_long"),
    ],
)
def test_a_bad_kernel_is_counted_and_the_rest_kept(change, reason):
    events = gpu_profile()
    events[6].update(change)  # the sgemm kernel
    p = parse(loaded(events), skip_runs=1)
    assert dict(p.skipped) == {reason: 1}
    assert {r["name"] for r in p.kernels.to_pylist()} == {"Shape", "MemcpyHostToDevice", "orphan"}
    conform("kernels", p.kernels)


@pytest.mark.parametrize("skip_runs", [0, 1])
def test_work_before_every_run_is_counted_warmup_is_not(skip_runs):
    events = gpu_profile()
    events[4]["ts"] = 50  # the Shape node, before the first (warmup) run
    events.append(gpu_kernel("early", 60, 5, "conv"))
    p = parse(events, skip_runs=skip_runs)
    names = {r["name"] for r in p.kernels.to_pylist()}
    assert names == {"sgemm", "MemcpyHostToDevice", "orphan"} | ({"warm_sgemm"} if skip_runs == 0 else set())
    assert dict(p.skipped) == {"before_first_run": 2}


def test_auxiliary_values_beyond_range_leave_a_null():
    events = gpu_profile()
    events[6]["args"].update(grid_x=str(2**70), block_z=2**64, op_name="o" * (MAX_NAME_BYTES + 1))
    events[7]["args"]["parent_name"] = "p" * (MAX_NAME_BYTES + 1)
    p = parse(loaded(events), skip_runs=1)
    k = {r["name"]: r for r in p.kernels.to_pylist()}
    assert dict(p.skipped) == {"int_out_of_range": 2, "name_too_long": 2}
    assert (k["sgemm"]["grid_x"], k["sgemm"]["grid_y"], k["sgemm"]["workgroup_z"]) == (None, 2, None)
    assert k["sgemm"]["op_name"] is None and k["sgemm"]["launch_start_ns"] == OFF + 210_000
    assert k["MemcpyHostToDevice"]["graph_node"] is None


def test_an_absurd_time_neither_anchors_the_file_nor_lands():
    events = [*cpu_profile(), {"cat": "Node", "name": "z_kernel_time", "pid": PID, "ts": 1e24, "dur": 1}]
    events = loaded(events)
    assert profile_extent_us(events) == 360
    p = parse(events, clock=ClockOffset(-(10**15), 1, "t"))  # every time converts before 1990
    assert p.kernels.num_rows == 0 and p.iterations.num_rows == 0
    assert dict(p.skipped) == {"time_out_of_range": 13, "bad_time": 3, "not_an_event": 1}
    assert p.pids == ()


def test_profile_with_a_correlation_beyond_64_bits_through_parse_any(tmp_path):
    events = [*cpu_profile()[2:11], {"cat": "Session", "name": "model_run", "ts": 2**80, "dur": 1, "pid": 2**80}]
    path = tmp_path / "onnxruntime_profile_x.json"
    path.write_text(json.dumps(events))
    tf = identify(path)
    parts = list(parse_any(tf, context_for(tf, node="n", source="s")))
    assert parts[0].skipped == {"time_out_of_range": 1}
    assert parts[0].iterations.num_rows == 3 and sum(p.kernels.num_rows for p in parts) == 5
    assert parts[0].iterations.column("end_ns")[2].as_py() == tf.mtime_ns
