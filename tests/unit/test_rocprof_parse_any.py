"""parse_any: one entry point for every recognised format, chunked, exact on the real samples."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.parse import ITERATIONS_FIRST, TAILABLE, context_for, model_from_path, parse_any
from aaco.contract.clock import ClockOffset
from aaco.contract.errors import TraceFormatError
from aaco.contract.schemas import conform
from tests.support import tracegen

CLOCK = ClockOffset(1_700_000_000 * 10**9, 1, "test")  # an explicit offset: no re-anchoring


def run(path: Path):
    tf = identify(path)
    parts = list(parse_any(tf, context_for(tf, node="node-1", source="replay", clock=CLOCK)))
    kernels = pa.Table.from_batches([conform("kernels", p.kernels) for p in parts if p.kernels.num_rows])
    iterations = pa.Table.from_batches([conform("iterations", p.iterations) for p in parts])
    return tf, parts, kernels, iterations


def by_kind(k: pa.Table) -> dict[str, tuple[int, int]]:
    out = {}
    for kind in set(k["kind"].to_pylist()):
        t = k.filter(pc.equal(k["kind"], kind))
        out[kind] = (t.num_rows, pc.sum(pc.subtract(t["end_ns"], t["start_ns"])).as_py())
    return out


def kineto_truth(path: Path) -> dict[str, tuple[int, int]]:
    doc = json.loads(gzip.decompress(path.read_bytes()))
    cats = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
    out: dict[str, list[int]] = {}
    for ev in doc["traceEvents"]:
        if ev.get("ph") == "X" and ev.get("cat") in cats:
            out.setdefault(cats[ev["cat"]], [0, 0])
            out[cats[ev["cat"]]][0] += 1
            out[cats[ev["cat"]]][1] += round(ev["dur"] * 1000)
    return {k: (v[0], v[1]) for k, v in out.items()}


@pytest.mark.parametrize(
    ("name", "counts"),
    [
        ("kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz", {"kernel": 14, "memcpy": 2}),
        ("kineto/a100_alexnet_trace.json.gz", {"kernel": 79, "memcpy": 16, "memset": 3}),
    ],
)
def test_kineto_samples(samples, name, counts):
    tf, parts, k, _ = run(samples / name)
    assert tf.format == "kineto"
    got = by_kind(k)
    assert {kind: n for kind, (n, _) in got.items()} == counts
    truth = kineto_truth(samples / name)
    for kind, (_, total) in got.items():
        assert abs(total - truth[kind][1]) <= counts[kind]  # per-event rounding of float microseconds only
    assert parts[0].clock.method.startswith("kineto")  # Kineto keeps its own time anchor


def test_rocm_samples(samples):
    _, _, k, _ = run(samples / "rocprofv3/kernel_trace.csv")
    assert by_kind(k) == {"kernel": (9, 96_160)}
    _, parts, k, _ = run(samples / "rocprof-v1/hip_trace_results.json")
    assert by_kind(k) == {"memcpy": (6, 686_681), "kernel": (1, 5_280)}
    assert k.filter(pc.is_valid(k["launch_name"])).num_rows == 7
    assert parts[0].clock == CLOCK


def test_ort_profile(tmp_path):
    events = [
        {"cat": "Session", "name": "model_run", "ph": "X", "ts": 10, "dur": 100, "pid": 1, "tid": 1, "args": {}},
        {
            "cat": "Node",
            "name": "conv_kernel_time",
            "ph": "X",
            "ts": 20,
            "dur": 30,
            "pid": 1,
            "tid": 1,
            "args": {"op_name": "Conv", "provider": "CPUExecutionProvider"},
        },
    ]
    p = tmp_path / "onnxruntime_profile.json"
    p.write_text(json.dumps(events))
    tf, parts, k, its = run(p)
    assert tf.format == "ort_profile"
    assert k.num_rows == 1 and its.num_rows == 1
    assert parts[0].clock.method == "file-mtime"


def test_chunks_bounded(tmp_path, samples):
    header, _, body = (samples / "rocprofv3/kernel_trace.csv").read_bytes().partition(b"\n")
    line = body.split(b"\n")[0]
    p = tmp_path / "big_kernel_trace.csv"
    p.write_bytes(header + b"\n" + (line + b"\n") * 70_000)
    _, parts, k, _ = run(p)
    assert k.num_rows == 70_000
    assert all(part.kernels.num_rows <= 65_536 for part in parts)


def test_unreadable_and_unknown(tmp_path, samples):
    p = tmp_path / "gone_kernel_trace.csv"
    p.write_bytes((samples / "rocprofv3/kernel_trace.csv").read_bytes())
    tf = identify(p)
    p.unlink()  # vanished between recognition and reading
    with pytest.raises(TraceFormatError, match=r"gone_kernel_trace\.csv"):
        list(parse_any(tf, context_for(tf, node="n", source="s", clock=CLOCK)))
    odd = TraceFile(samples / "rocprofv3/kernel_trace.csv", "nope", "x" * 24, 0, 1)
    with pytest.raises(TraceFormatError, match="no parser"):
        list(parse_any(odd, context_for(odd, node="n", source="s", clock=CLOCK)))


def test_truncated_kineto_keeps_events_before_the_cut(samples, tmp_path):
    data = gzip.decompress((samples / "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz").read_bytes())
    p = tmp_path / "cut.json"
    p.write_bytes(data[: len(data) * 3 // 4])
    _, parts, k, _ = run(p)
    assert 0 < k.num_rows <= 16
    assert parts[0].skipped["truncated_json"] == 1


def test_helpers():
    assert model_from_path(Path("/x/1234_kernel_trace.csv.gz")) == "1234_kernel_trace"
    assert "rocprofv3_api_csv" in ITERATIONS_FIRST
    assert {"rocprofv3_kernel_csv", "rocprofv3_memcpy_csv"} == TAILABLE


def kernel_models(path: Path, **kw) -> set:
    tf = identify(path)
    parts = list(parse_any(tf, context_for(tf, node="n", source="s", **kw)))
    k = pa.Table.from_batches([conform("kernels", p.kernels) for p in parts if p.kernels.num_rows])
    return set(k["model"].to_pylist())


def test_files_without_iterations_name_their_model(tmp_path, samples):
    json_trace = tmp_path / "4242_results.json"
    info = tracegen.rocprofv3_json(json_trace, 30, 2)  # metadata command: python3 train_llm.py --steps 10
    assert info["kernels"] == 30
    assert kernel_models(json_trace) == {"train_llm"}
    assert kernel_models(json_trace, model="bert") == {"bert"}  # the user's name wins
    assert kernel_models(json_trace, model="4242_results") == {"4242_results"}  # even when it is the stem
    assert kernel_models(samples / "kineto/a100_alexnet_trace.json.gz") == {"a100_alexnet_trace"}  # the stem
    csv = tmp_path / "run_kernel_trace.csv"
    csv.write_bytes((samples / "rocprofv3/kernel_trace.csv").read_bytes())
    assert kernel_models(csv, clock=CLOCK) == {"run_kernel_trace"}


def test_context_for_says_whose_model_it_is(samples):
    tf = identify(samples / "kineto/a100_alexnet_trace.json.gz")
    default = context_for(tf, node="n", source="s")
    assert (default.model, default.model_given) == ("a100_alexnet_trace", False)
    named = context_for(tf, node="n", source="s", model="a100_alexnet_trace")
    assert (named.model, named.model_given) == ("a100_alexnet_trace", True)


def test_files_with_iterations_leave_the_model_to_them(tmp_path, samples):
    assert kernel_models(samples / "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz") == {None}
    csv = tmp_path / "run_kernel_trace.csv"
    csv.write_bytes((samples / "rocprofv3/kernel_trace.csv").read_bytes())
    (tmp_path / "run_marker_api_trace.csv").write_text('"Domain","Function","Start_Timestamp","End_Timestamp"\n')
    assert kernel_models(csv, clock=CLOCK) == {None}  # the marker trace beside it gives the iterations
