"""Kineto (PyTorch profiler) traces: both real samples, and synthetic variants for the clock rules."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pyarrow.compute as pc
import pytest

from aaco.agent.sources.traces.context import MAX_NAME_BYTES
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.kineto import kineto_clock, parse_kineto
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.clock import in_epoch_range
from aaco.contract.ids import trace_id
from aaco.contract.schemas import conform

MI250 = "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
A100 = "kineto/a100_alexnet_trace.json.gz"
H100 = "kineto-h100/h100_conv_attn_train_cu130_kineto.json.gz"
GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
CPU_CATS = {"cpu_op", "cuda_runtime", "cuda_driver", "user_annotation"}
MTIME = 1_700_000_000_123_456_789
BASE = 1_735_632_360_000_000_000


def load(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def gpu_events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") in GPU_CATS]


def parse(doc, **kw):
    args = {"node": "n1", "identity": "ident", "run_id": "run", "model": "toy", "file_mtime_ns": MTIME}
    args.update(kw)
    return parse_kineto(doc, **args)


def check_durations(parsed, events):
    """Per kind: count and summed duration (ns), within 1 ns of rounding per event."""
    kinds = parsed.kernels.column("kind").to_pylist()
    durs = pc.subtract(parsed.kernels["end_ns"], parsed.kernels["start_ns"]).to_pylist()
    for cat, kind in GPU_CATS.items():
        evs = [e for e in events if e["cat"] == cat]
        got = [d for k, d in zip(kinds, durs, strict=True) if k == kind]
        assert len(got) == len(evs), kind
        expected_ns = sum(e["dur"] for e in evs) * 1000
        assert abs(sum(got) - expected_ns) <= len(evs), kind


def test_mi250_sample(samples):
    doc = load(samples / MI250)
    events = gpu_events(doc)
    p = parse(doc)
    assert p.format == "kineto"
    assert Counter(p.kernels.column("kind").to_pylist()) == {"kernel": 14, "memcpy": 2}
    check_durations(p, events)
    base = doc["baseTimeNanoseconds"]
    assert p.clock.method == "kineto-baseTimeNanoseconds"
    assert p.clock.offset_ns == base
    first_ts = min(e["ts"] for e in events)
    assert abs(p.kernels.column("start_ns")[0].as_py() - (base + round(first_ts * 1000))) <= 1
    # every GPU event was launched by the one training process, on device 2
    hip_pids = {e["pid"] for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime"}
    assert hip_pids == {597913}
    assert set(p.kernels.column("pid").to_pylist()) == hip_pids
    assert set(p.kernels.column("device").to_pylist()) == {"2"}
    assert p.pids == (597913,)
    assert p.kernels.column("launch_start_ns").null_count == 0
    starts = p.kernels.column("start_ns").to_pylist()
    assert starts == sorted(starts)
    assert sorted(p.kernels.column("correlation_id").to_pylist()) == sorted(e["args"]["correlation"] for e in events)
    conform("kernels", p.kernels)


def test_mi250_iterations(samples):
    doc = load(samples / MI250)
    steps = [
        e
        for e in doc["traceEvents"]
        if e.get("cat") == "user_annotation" and e.get("name", "").startswith("ProfilerStep#")
    ]
    assert len(steps) == 2
    p = parse(doc)
    it = p.iterations.to_pylist()
    assert [r["iteration"] for r in it] == [1, 2]
    assert [r["name"] for r in it] == ["ProfilerStep#1", "ProfilerStep#2"]
    base = doc["baseTimeNanoseconds"]
    for r, e in zip(it, sorted(steps, key=lambda e: e["ts"]), strict=True):
        assert abs(r["start_ns"] - (base + round(e["ts"] * 1000))) <= 1
        assert abs((r["end_ns"] - r["start_ns"]) - e["dur"] * 1000) <= 1
        assert r["pid"] == 597913
        assert (r["model"], r["run_id"], r["node"], r["source"]) == ("toy", "run", "n1", "kineto")
    assert it[0]["trace_id"] == trace_id("n1", "ident", "ProfilerStep#1")
    assert it[0]["trace_id"] != it[1]["trace_id"]
    conform("iterations", p.iterations)


def test_mi250_op_names_from_cpu_ops(samples):
    doc = load(samples / MI250)
    ops: dict[int, str] = {}
    for e in doc["traceEvents"]:
        if e.get("cat") == "cpu_op" and "External id" in e.get("args", {}):
            ops.setdefault(e["args"]["External id"], e["name"])
    ext_by_corr = {e["args"]["correlation"]: e["args"].get("External id") for e in gpu_events(doc)}
    p = parse(doc)
    for corr, op in zip(
        p.kernels.column("correlation_id").to_pylist(), p.kernels.column("op_name").to_pylist(), strict=True
    ):
        assert op == ops.get(ext_by_corr[corr])
    assert p.kernels.column("op_name").null_count < p.kernels.num_rows


def test_a100_sample(samples):
    doc = load(samples / A100)
    assert "baseTimeNanoseconds" not in doc
    events = gpu_events(doc)
    p = parse(doc, source="replay-a100")
    assert Counter(p.kernels.column("kind").to_pylist()) == {"kernel": 79, "memcpy": 16, "memset": 3}
    check_durations(p, events)
    # integer microseconds: durations are exact
    total = sum(
        e - s
        for s, e in zip(p.kernels.column("start_ns").to_pylist(), p.kernels.column("end_ns").to_pylist(), strict=True)
    )
    assert total == sum(e["dur"] for e in events) * 1000
    assert p.clock.method == "kineto-epoch-us"
    assert p.clock.offset_ns == 0
    props = doc["deviceProperties"][0]
    assert p.devices == {
        "0": {
            "type": "GPU",
            "name": props["name"],
            "product_name": props["name"],
            "compute_capability": "8.0",
            "total_memory_bytes": props["totalGlobalMem"],
        }
    }
    assert p.kernels.column("start_ns")[0].as_py() == min(e["ts"] for e in events) * 1000
    assert p.iterations.num_rows == 0
    assert set(p.kernels.column("pid").to_pylist()) == {2869224}
    assert p.kernels.column("launch_start_ns").null_count == 0
    assert set(p.kernels.column("source").to_pylist()) == {"replay-a100"}
    assert sorted(p.kernels.column("correlation_id").to_pylist()) == sorted(e["args"]["correlation"] for e in events)
    # each launch precedes or overlaps its GPU work
    for ls, s in zip(
        p.kernels.column("launch_start_ns").to_pylist(), p.kernels.column("start_ns").to_pylist(), strict=True
    ):
        assert ls <= s
    conform("kernels", p.kernels)
    conform("iterations", p.iterations)


def test_h100_sample(samples):
    """A capture of our own on an H100 (PyTorch 2.11, CUDA 13, CUPTI 13): fractional-microsecond times
    relative to baseTimeNanoseconds, a compute capability 9.0 device, and user annotations that are
    not profiler steps (so no iterations)."""
    doc = load(samples / H100)
    events = gpu_events(doc)
    p = parse(doc, source="replay-h100")
    assert Counter(p.kernels.column("kind").to_pylist()) == {"kernel": 292, "memcpy": 8, "memset": 16}
    check_durations(p, events)
    assert p.clock.method == "kineto-baseTimeNanoseconds"
    assert p.clock.offset_ns == doc["baseTimeNanoseconds"]
    starts = p.kernels.column("start_ns").to_pylist()
    assert min(starts) == round(min(e["ts"] for e in events) * 1000) + doc["baseTimeNanoseconds"]
    assert p.devices["0"]["compute_capability"] == "9.0"
    assert p.devices["0"]["name"] == "NVIDIA H100 80GB HBM3"
    assert p.iterations.num_rows == 0  # record_function("ProfilerStep#model") is an annotation, not a step
    assert p.kernels.column("launch_start_ns").null_count == 0
    assert sorted(p.kernels.column("correlation_id").to_pylist()) == sorted(e["args"]["correlation"] for e in events)
    conform("kernels", p.kernels)


def test_a100_memcpy_bytes_streams_and_grids(samples):
    doc = load(samples / A100)
    by_corr = {e["args"]["correlation"]: e for e in gpu_events(doc)}
    p = parse(doc)
    for r in p.kernels.to_pylist():
        e = by_corr[r["correlation_id"]]
        assert r["stream"] == e["args"]["stream"]
        assert r["device"] == str(e["args"]["device"])
        assert r["name"] == e["name"]
        if r["kind"] in ("memcpy", "memset"):
            assert r["bytes"] == e["args"]["bytes"]
        if "grid" in e["args"]:
            assert [r["grid_x"], r["grid_y"], r["grid_z"]] == e["args"]["grid"]
            assert [r["workgroup_x"], r["workgroup_y"], r["workgroup_z"]] == e["args"]["block"]
    launch_names = {e["name"] for e in doc["traceEvents"] if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    assert set(p.kernels.column("launch_name").to_pylist()) <= launch_names
    assert "cudaLaunchKernel" in set(p.kernels.column("launch_name").to_pylist())


def synthetic(base: int | None = None, offset_us: float = 0.0) -> dict:
    def ev(cat, name, ts, dur, pid=100, tid=101, **args):
        out = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts + offset_us, "dur": dur}
        return {**out, "args": args}

    events = [
        ev("user_annotation", "ProfilerStep#5", 10, 200),
        ev("user_annotation", "not a step", 10, 5),
        ev("cpu_op", "aten::mm", 20, 30, **{"External id": 7}),
        ev("cuda_runtime", "cudaLaunchKernel", 25, 5, correlation=1, **{"External id": 7}),
        ev(
            "kernel",
            "gemm",
            40,
            100,
            pid=0,
            tid=7,
            correlation=1,
            device=0,
            stream=7,
            grid=[4, 2, 1],
            block=[256, 1, 1],
            **{"External id": 7},
        ),
        ev("kernel", "no_launch", 150, 10, pid=3, tid=9),  # no correlation: device/stream from pid/tid
        ev("gpu_memset", "Memset", 170, 2.5, pid=0, tid=7, correlation=99, bytes="64"),  # launch missing
        ev("kernel", 12345, 100, 1),  # bad name
        ev("kernel", "neg", 100, -1),  # bad time
        {"ph": "X", "cat": "kernel", "name": "no_ts", "dur": 1},
        {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1},  # not a complete event: ignored
        "garbage",
    ]
    doc: dict = {"schemaVersion": 1, "traceEvents": events}
    if base is not None:
        doc["baseTimeNanoseconds"] = base
    return doc


def test_synthetic_mtime_anchored():
    p = parse(synthetic())
    assert p.clock.method == "file-mtime"
    # the last event (the 200 us step ending at 210 us) ends at the file's modification time
    assert p.clock.offset_ns == MTIME - 210_000
    assert p.iterations.column("end_ns").to_pylist() == [MTIME]
    assert p.iterations.column("iteration").to_pylist() == [5]
    k = {r["name"]: r for r in p.kernels.to_pylist()}
    assert set(k) == {"gemm", "no_launch", "Memset"}
    g = k["gemm"]
    assert g["start_ns"] == MTIME - 210_000 + 40_000
    assert g["end_ns"] == g["start_ns"] + 100_000
    assert (g["pid"], g["tid"]) == (100, 101)
    assert g["launch_start_ns"] == MTIME - 210_000 + 25_000
    assert g["launch_end_ns"] == MTIME - 210_000 + 30_000
    assert g["launch_name"] == "cudaLaunchKernel"
    assert g["op_name"] == "aten::mm"
    assert (g["device"], g["stream"], g["correlation_id"]) == ("0", 7, 1)
    assert (g["grid_x"], g["grid_y"], g["grid_z"], g["workgroup_x"]) == (4, 2, 1, 256)
    n = k["no_launch"]
    assert (n["device"], n["stream"]) == ("3", 9)
    assert n["pid"] == 100  # the only launching process
    assert n["tid"] is None
    assert n["launch_start_ns"] is None
    m = k["Memset"]
    assert m["kind"] == "memset"
    assert m["bytes"] == 64
    assert m["end_ns"] - m["start_ns"] == 2500
    assert dict(p.skipped) == {"bad_name": 1, "bad_time": 2, "not_an_event": 1}
    assert p.kernels.column("start_ns").to_pylist() == sorted(p.kernels.column("start_ns").to_pylist())
    conform("kernels", p.kernels)
    conform("iterations", p.iterations)


def test_synthetic_base_time():
    base = 1_735_632_360_000_000_000
    p = parse(synthetic(base=base, offset_us=0.5))
    assert p.clock.method == "kineto-baseTimeNanoseconds"
    assert p.clock.offset_ns == base
    assert p.iterations.column("start_ns").to_pylist() == [base + 10_500]


def test_synthetic_epoch_microseconds():
    p = parse(synthetic(offset_us=1_695_835_572_000_000))
    assert p.clock.method == "kineto-epoch-us"
    assert p.iterations.column("start_ns").to_pylist() == [(1_695_835_572_000_000 + 10) * 1000]


def test_no_launching_process_or_several_leaves_pid_null():
    doc = synthetic()
    launch = {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemset", "pid": 200, "tid": 1, "ts": 1, "dur": 1}
    doc["traceEvents"].append({**launch, "args": {"correlation": 50}})
    p = parse(doc)
    k = {r["name"]: r for r in p.kernels.to_pylist()}
    assert k["no_launch"]["pid"] is None
    assert k["gemm"]["pid"] == 100
    assert p.pids == (100, 200)


def test_kineto_clock_rules():
    ends = np.array([10.0])
    assert kineto_clock({"baseTimeNanoseconds": BASE}, ends, MTIME).method == "kineto-baseTimeNanoseconds"
    assert kineto_clock({"baseTimeNanoseconds": 0}, ends, MTIME).method == "file-mtime"
    assert kineto_clock({"baseTimeNanoseconds": "junk"}, np.array([2e15]), MTIME).method == "kineto-epoch-us"
    c = kineto_clock({}, ends, MTIME)
    assert c.offset_ns == MTIME - 10_000
    # one stray epoch-sized end neither makes a relative trace epoch-based nor moves its anchor
    c = kineto_clock({}, np.array([5.0, 10.0, 20.0, 1e24]), MTIME)
    assert (c.method, c.offset_ns) == ("file-mtime", MTIME - 20_000)


@pytest.mark.parametrize(
    ("base", "reason"),
    [
        (2**70, "int_out_of_range"),
        (2**63, "int_out_of_range"),
        (5, "time_out_of_range"),
        (-(2**62), "time_out_of_range"),
    ],
)
def test_absurd_base_time_is_not_used(base, reason):
    skipped = Counter()
    c = kineto_clock({"baseTimeNanoseconds": base}, np.array([10.0, 210.0]), MTIME, skipped)
    assert c.method == "file-mtime"
    assert skipped == {reason: 1}
    # through orjson, as parse_any loads it (2**70 arrives as a float), and the events still land
    doc = orjson.loads(json.dumps(synthetic(base=base)))
    p = parse(doc)
    assert p.clock.method == "file-mtime"
    assert p.skipped[reason] == 1
    assert p.iterations.column("end_ns").to_pylist() == [MTIME]
    assert p.kernels.num_rows == 3


def test_base_time_of_an_epoch_microsecond_trace_falls_back_to_epoch_us():
    p = parse(synthetic(base=3 * 10**18, offset_us=1_695_835_572_000_000))  # together past 2100
    assert p.clock.method == "kineto-epoch-us"
    assert p.skipped["time_out_of_range"] == 1
    assert p.iterations.column("start_ns").to_pylist() == [(1_695_835_572_000_000 + 10) * 1000]


@pytest.mark.parametrize("doc", [[], {"traceEvents": "x"}, {"other": []}, None])
def test_not_a_kineto_document(doc):
    with pytest.raises(ValueError):
        parse(doc)


def test_empty_trace_events():
    p = parse({"traceEvents": []})
    assert p.kernels.num_rows == 0
    assert p.iterations.num_rows == 0
    conform("kernels", p.kernels)
    conform("iterations", p.iterations)


# --- bad values: counted and left out, never raised --------------------------------------------

EXPECTED_SKIPS = {"bad_name": 1, "bad_time": 2, "not_an_event": 1}  # the bad events synthetic() holds


def corrupt(doc: dict, event: str, args: dict | None = None, **fields) -> dict:
    """``doc`` with the event named ``event`` changed, loaded by orjson as parse_any loads it: integers
    beyond 64 bits arrive as floats, those in [2**63, 2**64) as ints."""
    for ev in doc["traceEvents"]:
        if isinstance(ev, dict) and ev.get("name") == event:
            ev.update(fields)
            ev["args"].update(args or {})
    return orjson.loads(json.dumps(doc))


@pytest.mark.parametrize(
    ("args", "fields"),
    [
        ({"correlation": 2**80}, {}),
        ({"correlation": 2**63}, {}),
        ({"device": -(2**64)}, {}),
        ({"stream": 2**70}, {}),
        ({}, {"pid": 2**64 - 1}),
        ({}, {"tid": 2**90}),
    ],
)
def test_an_id_beyond_int64_drops_its_event(args, fields):
    p = parse(corrupt(synthetic(), "gemm", args, **fields))
    assert dict(p.skipped) == {"int_out_of_range": 1, **EXPECTED_SKIPS}
    assert sorted(p.kernels.column("name").to_pylist()) == ["Memset", "no_launch"]
    assert p.iterations.num_rows == 1
    conform("kernels", p.kernels)


def test_a_field_beyond_int64_is_null_and_the_event_kept():
    doc = corrupt(synthetic(), "gemm", {"External id": 2**80, "grid": [2**70, 2, 1], "block": [256, 2**64, 1]})
    p = parse(corrupt(doc, "Memset", {"bytes": 2**66}))
    k = {r["name"]: r for r in p.kernels.to_pylist()}
    assert p.skipped["int_out_of_range"] == 4
    assert k["gemm"]["op_name"] is None
    assert (k["gemm"]["grid_x"], k["gemm"]["grid_y"], k["gemm"]["workgroup_y"]) == (None, 2, None)
    assert k["gemm"]["correlation_id"] == 1 and k["gemm"]["launch_name"] == "cudaLaunchKernel"
    assert k["Memset"]["bytes"] is None
    conform("kernels", p.kernels)


def test_launch_and_op_ids_beyond_int64_drop_the_link_only():
    doc = corrupt(synthetic(), "cudaLaunchKernel", {"correlation": 2**80})
    p = parse(corrupt(doc, "aten::mm", {"External id": 2**90}))
    g = {r["name"]: r for r in p.kernels.to_pylist()}["gemm"]
    assert p.skipped["int_out_of_range"] == 2
    assert (g["launch_start_ns"], g["launch_name"], g["tid"], g["op_name"]) == (None, None, None, None)
    assert g["pid"] == 100  # the trace's process: the one that ran its operators


@pytest.mark.parametrize(
    ("ts", "reason"),
    [(1e24, "time_out_of_range"), (2**64 + 1, "time_out_of_range"), (-2e15, "time_out_of_range"), ("nan", "bad_time")],
)
def test_times_out_of_range_or_not_finite(ts, reason):
    p = parse(corrupt(synthetic(base=BASE), "gemm", ts=ts))
    assert dict(p.skipped) == {**EXPECTED_SKIPS, reason: EXPECTED_SKIPS.get(reason, 0) + 1}
    assert sorted(p.kernels.column("name").to_pylist()) == ["Memset", "no_launch"]
    assert in_epoch_range(np.array(p.kernels.column("start_ns").to_pylist())).all()


def test_steps_and_launches_out_of_range():
    doc = corrupt(synthetic(base=BASE), "ProfilerStep#5", name="ProfilerStep#" + "9" * 30)
    p = parse(corrupt(doc, "cudaLaunchKernel", ts=1e30))
    assert p.iterations.num_rows == 0
    assert dict(p.skipped) == {"int_out_of_range": 1, "time_out_of_range": 1, **EXPECTED_SKIPS}
    g = {r["name"]: r for r in p.kernels.to_pylist()}["gemm"]
    assert g["launch_start_ns"] is None and g["pid"] == 100


def test_names_too_long():
    long = "k" * (MAX_NAME_BYTES + 1)
    doc = corrupt(synthetic(), "gemm", name=long)
    doc = corrupt(doc, "no_launch", name="é" * (MAX_NAME_BYTES // 2 + 1))  # short in characters, long in bytes
    p = parse(doc)
    assert p.skipped["name_too_long"] == 2
    assert p.kernels.column("name").to_pylist() == ["Memset"]
    # an operator or launch name too long is dropped; the kernel keeps its launch
    p = parse(corrupt(corrupt(synthetic(), "aten::mm", name=long), "cudaLaunchKernel", name=long))
    assert p.skipped["name_too_long"] == 2
    g = {r["name"]: r for r in p.kernels.to_pylist()}["gemm"]
    assert (g["op_name"], g["launch_name"]) == (None, None)
    assert g["launch_start_ns"] is not None and g["tid"] == 101


def test_correlation_beyond_64_bits_through_parse_any(tmp_path):
    """The user's report: one such trace raised OverflowError out of the parser."""
    doc = synthetic(base=BASE)
    text = json.dumps(doc).replace('"correlation": 1,', f'"correlation": {2**80},', 1)
    text = text.replace(f'"baseTimeNanoseconds": {BASE}', f'"baseTimeNanoseconds": {2**70}')
    path = tmp_path / "bad.pt.trace.json"
    path.write_text(text)
    tf = identify(path)
    parts = list(parse_any(tf, context_for(tf, node="n", source="kineto")))
    assert parts[0].skipped["int_out_of_range"] == 2
    assert parts[0].clock.method == "file-mtime"
    k = {r["name"]: r for p in parts for r in p.kernels.to_pylist()}
    assert set(k) == {"gemm", "no_launch", "Memset"}
    assert k["gemm"]["launch_start_ns"] is None  # its launch held the correlation beyond 64 bits
    conform("kernels", parts[0].kernels)


# --- the trace's process: its pid for unlaunched work, and the model its name gives ------------


def meta(pid: int, name: str | None = None, label: str | None = None) -> list[dict]:
    out = []
    if name is not None:
        out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": name}})
    if label is not None:
        out.append({"ph": "M", "name": "process_labels", "pid": pid, "tid": 0, "args": {"labels": label}})
    return out


@pytest.mark.parametrize(
    ("name", "model"),
    [
        ("python3.10", None),
        ("python", None),
        ("pt_main_thread", None),
        ("penv#native-main#platform-runtime#python#py_version_3_10", None),
        ("pyper:trainer:0:0", "pyper:trainer"),
        ("llama_server", "llama_server"),
        ("x" * 300, None),
    ],
)
def test_model_from_the_host_process_name(name, model):
    doc = synthetic()
    doc["traceEvents"] += meta(100, name, "CPU") + meta(0, "python3.10", "GPU 0") + meta(3, "llama_server", "GPU 3")
    p = parse(doc)
    assert p.model == model
    assert p.skipped["name_too_long"] == (len(name) > 256)


def test_unlaunched_gpu_work_of_a_gpu_only_trace_belongs_to_the_process_labelled_cpu():
    doc = synthetic()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not isinstance(e, dict) or e.get("cat") not in CPU_CATS]
    assert parse(doc).kernels.column("pid").to_pylist() == [None] * 3
    doc["traceEvents"] += meta(0, "svc", "GPU 0") + meta(3, "svc", "GPU 3") + meta(4242, "svc", "CPU")
    p = parse(doc)
    assert p.kernels.column("pid").to_pylist() == [4242] * 3
    assert (p.pids, p.model) == ((4242,), "svc")
    # without labels: the one named process that is not a device lane (pids 0 and 3 ran GPU work)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not isinstance(e, dict) or e.get("name") != "process_labels"]
    assert parse(doc).kernels.column("pid").to_pylist() == [4242] * 3


def test_several_cpu_processes_the_one_labelled_cpu_is_the_host():
    doc = synthetic()
    doc["traceEvents"].append(
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 200, "tid": 1, "ts": 1, "dur": 1, "args": {}}
    )
    assert {r["name"]: r["pid"] for r in parse(doc).kernels.to_pylist()}["no_launch"] is None
    doc["traceEvents"] += meta(100, "trainer", "CPU") + meta(200, "dataloader", "Data")
    p = parse(doc)
    assert {r["name"]: r["pid"] for r in p.kernels.to_pylist()}["no_launch"] == 100
    assert p.model == "trainer"
