"""Kineto windows read by Arrow (``kineto_arrow``): exactly what the dict path gives, or refused and read as dicts."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest

from aaco.agent.sources.traces import kineto_arrow, kineto_stream
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.parse import context_for, parse_any

ROOT = Path(__file__).resolve().parents[2]
# Real captures of every kind the reader meets: CUDA and ROCm, PyTorch 1.8's old schema, collectives,
# critical paths (ranks of at most critical_path_max_events events), an MTIA trace of unknown categories.
REAL = (
    "examples/data/kineto/a100_alexnet_trace.json.gz",
    "examples/data/kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "examples/data/kineto-h100/h100_conv_attn_train_cu130_kineto.json.gz",
    "examples/data/kineto-hta/nccl_parser_config_nccl_data.json.gz",
    "examples/data/kineto-hta/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
    "examples/data/kineto-hta/mtia_inference_trace_mtia_inference_rank_0.json.gz",
    "examples/data/kineto-hta/cupti_profiler_trace.json.gz",
    "examples/data/kineto-multirank/trace_filter_sampled_rank-0.json.gz",
    "tests/data/kineto-multirank/critical_path_alexnet_benchmark_result_2869224_1695835535_trace.json.gz",
    "tests/data/kineto-tb/samples_resnet50_num_workers_0_worker0.1623143089861.pt.trace.json.gz",
)
# Those where Arrow must take windows (a path that is never taken tests nothing).
TAKEN = {0, 2, 3, 4, 5, 6, 7, 8, 9}
LONG_NAME = "k" * (64 * 1024 + 1)


@dataclasses.dataclass
class Read:
    """A file's parse, everything the parts carry, and how many windows Arrow folded and refused."""

    kernels: pa.Table
    iterations: pa.Table
    rest: dict
    taken: int
    refused: int


def parse(path: Path, monkeypatch: pytest.MonkeyPatch, *, arrow: bool) -> Read:
    counts: Counter[str] = Counter()
    real = kineto_arrow.WindowReader.fold_window

    def fold_window(self, raw, skipped, out):
        n = real(self, raw, skipped, out) if arrow else None
        counts["taken" if n is not None else "refused"] += 1
        return n

    with monkeypatch.context() as m:
        m.setattr(kineto_arrow.WindowReader, "fold_window", fold_window)
        tf = identify(path)
        parts = list(parse_any(tf, context_for(tf, node="n", source="kineto")))
    first = parts[0]
    rest = {
        "skipped": sum((p.skipped for p in parts), Counter()),
        "bad_rows": [r for p in parts for r in p.bad_rows],
        "clock": first.clock,
        "pids": first.pids,
        "devices": first.devices,
        "model": first.model,
        "unrecognised": first.unrecognised,
        "job": first.job,
        "span_ns": first.span_ns,
    }
    return Read(
        pa.concat_tables(p.kernels for p in parts),
        pa.concat_tables(p.iterations for p in parts),
        rest,
        counts["taken"],
        counts["refused"],
    )


def same(path: Path, monkeypatch: pytest.MonkeyPatch) -> Read:
    """The Arrow read of ``path``, checked equal to the dict read."""
    fast = parse(path, monkeypatch, arrow=True)
    slow = parse(path, monkeypatch, arrow=False)
    assert fast.kernels.equals(slow.kernels)
    assert fast.iterations.equals(slow.iterations)
    assert fast.rest == slow.rest
    return fast


@pytest.fixture(params=[1 << 12, 1 << 16], ids=["windows4K", "windows64K"])
def small_windows(request, monkeypatch):
    """Many windows, ending everywhere: at metadata, inside long names, between steps."""
    monkeypatch.setattr(kineto_stream, "BLOCK", request.param)
    monkeypatch.setattr(kineto_stream, "COLUMNS_BLOCK", request.param)


@pytest.mark.parametrize("i", range(len(REAL)), ids=[Path(p).name[:40] for p in REAL])
def test_real_captures_read_by_arrow_as_by_dicts(i, small_windows, monkeypatch):
    got = same(ROOT / REAL[i], monkeypatch)
    assert got.taken > 0 or i not in TAKEN


def test_the_critical_path_of_a_rank_is_found_from_the_windows_kept_as_bytes(small_windows, monkeypatch):
    got = same(ROOT / "tests/data/kineto-multirank/trace_filter_sampled_rank-0.json.gz", monkeypatch)
    assert got.taken > 0 and got.iterations.column("cp_length_ns").to_pylist() == [267_581_000, None]  # HTA's


# --- synthetic windows: one rule each -------------------------------------------------------------


# Strings with brackets, escaped newlines and quotes, and wide characters; one holding ``}, {`` (a comma
# the reader would take for one between events) sends its window to the dict path (``test_a_name_...``).
ODD = ["x},\n  {y", 'q\\"}, \\"{', "é中😀", "]}", "{[", "back\\", '\\"traceEvents\\": [', "{lambda()#1}::{lambda()#2}"]


def events(n: int = 30, **kernel_args) -> list[dict]:
    """Metadata, a ProfilerStep, operators, launches and kernels, with names that hold brackets and escapes."""
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": 10, "tid": 0, "args": {"name": "train.py"}},
        {"ph": "M", "name": "process_labels", "pid": 10, "tid": 0, "args": {"labels": "CPU"}},
        {"ph": "M", "name": "process_labels", "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "pid": 10, "tid": 10, "ts": 0.5, "dur": 9e3},
    ]
    for k in range(n):
        t = 10.0 * k + 1
        odd = ODD[k % len(ODD)]
        common = {"pid": 10, "tid": 11, "ph": "X"}
        out += [
            {**common, "cat": "cpu_op", "name": f"aten::op {odd}", "ts": t, "dur": 5, "args": {"External id": k}},
            {
                **common,
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "ts": t + 1,
                "dur": 2.5,
                "args": {"External id": k, "correlation": k + 1, "cbid": 211},
            },
            {"ph": "s", "id": k + 1, "pid": 10, "tid": 11, "ts": t + 1, "cat": "ac2g", "name": "ac2g"},
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"void kernel<{odd}>",
                "pid": 0,
                "tid": 7,
                "ts": t + 3,
                "dur": 3.0,
                "args": {
                    "External id": k,
                    "correlation": k + 1,
                    "device": 0,
                    "stream": 7,
                    "grid": [k + 1, 1, 1],
                    "block": [256, 1, 1],
                    "Input Dims": [[64, 3], []],
                    "deep": {"a": [[odd], {"c": [[1, 2], {"d": 1.5}]}]},
                    **kernel_args,
                },
            },
        ]
    return out


def kineto_layout(ev: dict) -> str:
    """An event as Kineto writes it: a key a line, each argument a line, values on one line."""
    keys = [f"    {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in ev.items() if k != "args"]
    if "args" in ev and isinstance(ev["args"], dict):
        args = ",\n".join(f"      {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}" for k, v in ev["args"].items())
        keys.append('    "args": {\n' + args + "\n    }")
    elif "args" in ev:
        keys.append(f'    "args": {json.dumps(ev["args"])}')
    return "  {\n" + ",\n".join(keys) + "\n  }"


def write(tmp_path: Path, evs: list[dict], *, one_line: bool = False, text: bytes | None = None) -> Path:
    path = tmp_path / "t.pt.trace.json"
    if text is None:
        body = json.dumps(evs, ensure_ascii=False)[1:-1] if one_line else ",\n".join(map(kineto_layout, evs))
        text = (
            '{"schemaVersion": 1, "traceEvents": [\n' + body + '\n], "baseTimeNanoseconds": 1790857026000000000}'
        ).encode()
    path.write_bytes(text)
    return path


@pytest.mark.parametrize("one_line", [False, True], ids=["kineto_layout", "one_line"])
def test_awkward_names_and_nested_args_are_read_by_arrow(tmp_path, small_windows, monkeypatch, one_line):
    got = same(write(tmp_path, events(), one_line=one_line), monkeypatch)
    assert got.taken > 0 and got.refused == 0
    assert got.kernels.num_rows == 30 and got.iterations.num_rows == 1
    assert got.kernels.column("op_name").to_pylist()[0] == "aten::op x},\n  {y"


def test_a_name_holding_a_comma_between_brackets_sends_its_window_to_the_dicts(tmp_path, monkeypatch):
    evs = _with(events(), K, name="void k<{lambda()#1}, {lambda()#2}>")
    got = same(write(tmp_path, evs), monkeypatch)
    assert got.taken == 0 and got.kernels.column("name").to_pylist()[5] == "void k<{lambda()#1}, {lambda()#2}>"


def test_an_argument_holding_objects_in_a_list_sends_its_window_to_the_dicts(tmp_path, monkeypatch):
    evs = _with(events(), K, args={"streams": [{"id": 7}, {"id": 8}]})
    got = same(write(tmp_path, evs, one_line=True), monkeypatch)
    assert got.taken == 0 and got.kernels.num_rows == 30


def _with(evs: list[dict], at: int, **changes) -> list[dict]:
    """``evs`` with event ``at`` changed (a dict of ``args``: merged into them)."""
    ev = dict(evs[at])
    if isinstance(changes.get("args"), dict):
        ev["args"] = {**ev.get("args", {}), **changes.pop("args")}
    ev.update(changes)
    evs[at] = ev
    return evs


K = 4 + 4 * 5 + 3  # the sixth kernel
OP = 4 + 4 * 5  # the sixth operator
REFUSED = {
    "time_null": lambda e: _with(e, K, ts=None),
    "time_text": lambda e: _with(e, K - 2, ts="12.5"),
    "duration_negative": lambda e: _with(e, K, dur=-1.0),
    "name_null": lambda e: _with(e, K, name=None),
    "name_too_long": lambda e: _with(e, K, name=LONG_NAME),
    "launch_name_too_long": lambda e: _with(e, K - 2, name=LONG_NAME),
    "op_name_too_long": lambda e: _with(e, OP, name=LONG_NAME),
    "grid_of_two": lambda e: _with(e, K, args={"grid": [1, 2]}),
    "grid_float": lambda e: _with(e, K, args={"grid": [1.5, 1, 1]}),
    "pid_text": lambda e: _with(e, K, pid="GPU 0"),
    "tid_stream_text": lambda e: _with(e, K, tid="stream 7"),
    "correlation_float": lambda e: _with(e, K, args={"correlation": 6.0}),
    "correlation_past_int64": lambda e: _with(e, K, args={"correlation": 1 << 63}),
    "unknown_category": lambda e: _with(e, K, cat="mtia_kernel"),
    "args_not_an_object": lambda e: _with(e, K, args="x"),
    "ext_null_beside_old_key": lambda e: _with(e, K, args={"External id": None, "external id": 99}),
    "collective_name_null": lambda e: _with(
        e, K, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL", args={"Collective name": None, "In msg nelems": 4}
    ),
    "step_past_int64": lambda e: _with(e, 3, name="ProfilerStep#" + "9" * 25),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_the_per_event_rules_count_or_convert_is_left_to_them(tmp_path, monkeypatch, case):
    """Each of these is read as dicts (or, where Arrow reads it the same, by Arrow): the same result."""
    monkeypatch.setattr(kineto_stream, "COLUMNS_BLOCK", 1 << 20)
    same(write(tmp_path, REFUSED[case](events())), monkeypatch)


def test_bytes_that_are_not_utf8_are_left_to_the_salvage(tmp_path, monkeypatch):
    data = write(tmp_path, events()).read_bytes().replace(b'"cbid": 211', b'"cbid": "\xff\xfe"', 1)
    got = same(write(tmp_path, [], text=data), monkeypatch)
    assert got.refused == 1 and got.taken == 0 and got.kernels.num_rows == 30  # the salvage keeps the event


def test_a_window_without_a_null_reads_its_collectives_by_arrow(tmp_path, monkeypatch):
    evs = events()
    for k in (K, K + 4):
        _with(evs, k, name="ncclDevKernel_Generic", args={"Collective name": "all_to_all", "In msg nelems": 8})
        _with(evs, k, args={"dtype": "Float", "Group size": 4, "Process Group Name": "0", "Out msg nelems": 8})
    _with(evs, OP, name="record_param_comms", args={"Collective name": "allreduce", "dtype": "BFloat16"})
    got = same(write(tmp_path, evs), monkeypatch)
    assert got.taken > 0 and got.refused == 0
    assert got.kernels.column("collective").drop_null().to_pylist() == ["all_to_all", "all_to_all"]


def test_an_old_external_id_is_read_by_arrow_when_nothing_is_null(tmp_path, monkeypatch):
    evs = events()
    for ev in evs:
        if ev.get("cat") == "kernel":
            ev["args"]["external id"] = ev["args"].pop("External id")
    got = same(write(tmp_path, evs), monkeypatch)
    assert got.taken > 0 and got.kernels.column("op_name").null_count == 0


def test_nan_in_a_field_not_read_keeps_the_event_either_way(tmp_path, monkeypatch):
    data = write(tmp_path, events()).read_bytes().replace(b'"cbid": 211', b'"cbid": NaN', 1)
    got = same(write(tmp_path, [], text=data), monkeypatch)
    assert got.kernels.num_rows == 30 and not got.rest["skipped"]


def test_whitespace_before_a_comma_is_a_layout_left_to_orjson(tmp_path, monkeypatch):
    data = write(tmp_path, events()).read_bytes().replace(b"},\n  {", b"}\n  ,\n  {")
    got = same(write(tmp_path, [], text=data), monkeypatch)
    assert got.taken == 0 and got.kernels.num_rows == 30


def test_the_first_operator_of_an_external_id_names_its_kernels(tmp_path, monkeypatch):
    evs = events()
    _with(evs, OP + 4, args={"External id": 5})  # a second operator of External id 5, later in the file
    got = same(write(tmp_path, evs), monkeypatch)
    assert got.taken > 0 and got.kernels.column("op_name").to_pylist()[5] == "aten::op " + ODD[5]


def test_nesting_deeper_than_orjson_reads_in_a_field_not_read_is_kept(tmp_path, monkeypatch):
    """The one documented difference: Arrow's iterative parser reads it; the window is bounded by MAX_EVENT.

    (The first ``BLOCK``, read before the events, is scanned with the depth limit on either path.)
    """
    monkeypatch.setattr(kineto_stream, "BLOCK", 1024)
    deep = b'"deep": ' + b"[" * 1100 + b"]" * 1100
    data = write(tmp_path, events()).read_bytes().replace(b'"cbid": 211', b'"cbid": 211, ' + deep, 1)
    got = parse(write(tmp_path, [], text=data), monkeypatch, arrow=True)
    assert got.kernels.num_rows == 30 and not got.rest["skipped"] and got.taken > 0


def test_a_comma_twice_between_events_is_counted_as_the_dict_path_counts_it(tmp_path, monkeypatch):
    data = write(tmp_path, events()).read_bytes()
    at = data.index(b"},\n  {", len(data) // 2) + 1
    got = same(write(tmp_path, [], text=data[:at] + b"," + data[at:]), monkeypatch)
    assert got.rest["skipped"] == {"invalid_json": 1} and got.kernels.num_rows == 30
