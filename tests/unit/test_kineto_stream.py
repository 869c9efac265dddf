"""Kineto's traceEvents streamed window by window: the same events as a whole-document parse, damage counted."""

from __future__ import annotations

import gzip
import io
import json
from itertools import chain
from pathlib import Path

import ijson
import orjson
import pyarrow as pa
import pytest

from aaco.agent.sources.traces import kineto_stream
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.kineto import parse_kineto
from aaco.agent.sources.traces.kineto_stream import EventStream
from aaco.agent.sources.traces.limits import JsonDepthError, TraceLimits
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.errors import TraceFormatError

BASE = 1_790_857_026_000_000_000
SAMPLES = (
    "kineto/a100_alexnet_trace.json.gz",
    "kineto/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "kineto-h100/h100_conv_attn_train_cu130_kineto.json.gz",
    "kineto-hta/critical_path_cuda_event_sync_multi_stream_event_sync_trace.json.gz",
    "kineto-hta/ns_resolution_trace_rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz",
)
# Strings a layout-based split would cut in the wrong place, escapes a naive quote count gets wrong.
AWKWARD = ["a}, {b", "x},\n  {y", 'q\\"}, {"', "back\\\\", "\u00e9\u4e2d\U0001f600", "]}", "{[", '\\"traceEvents\\": [']


def events(n: int = 40) -> list[dict]:
    """Launch + kernel pairs whose names and args hold the awkward strings, nested args, a ProfilerStep."""
    out: list[dict] = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 10, "tid": 10, "ts": 0.5, "dur": 9e3}
    ]
    for k in range(n):
        odd = AWKWARD[k % len(AWKWARD)]
        out.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 10,
                "tid": 11,
                "ts": 1.0 + 10 * k,
                "dur": 2.5,
                "args": {"correlation": k + 1, "External id": k, "note": odd},
            }
        )
        out.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": f"kernel {odd} {k}",
                "pid": 0,
                "tid": 7,
                "ts": 5.0 + 10 * k,
                "dur": 3.0,
                "args": {
                    "correlation": k + 1,
                    "device": 0,
                    "stream": 7,
                    "grid": [k + 1, 1, 1],
                    "block": [256, 1, 1],
                    "deep": {"a": [{"b": odd}, {"c": [[1, 2], {"d": None}]}]},
                },
            }
        )
    return out


def document(evs: list[dict], *, after: bool = True, indent: int | None = 2) -> bytes:
    """A Kineto document; with ``after`` the small keys follow the events (as some Kineto versions write)."""
    small = {"baseTimeNanoseconds": BASE, "deviceProperties": [{"id": 0, "name": "GPU X"}], "traceName": "t}, {"}
    doc = {"schemaVersion": 1, "traceEvents": evs, **small} if after else {**small, "traceEvents": evs}
    return json.dumps(doc, indent=indent, ensure_ascii=indent is None).encode()


def stream(path: Path, limits: TraceLimits | None = None) -> tuple[list, EventStream]:
    s = EventStream(path, limits or TraceLimits())
    return list(chain.from_iterable(s.batches())), s


def write(tmp_path: Path, data: bytes, name: str = "t.pt.trace.json") -> Path:
    p = tmp_path / name
    p.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    return p


def parse_file(path: Path):
    tf = identify(path)
    return list(parse_any(tf, context_for(tf, node="n", source="kineto")))


@pytest.fixture(params=[7, 64, 1 << 20], ids=["block7", "block64", "block1M"])
def block(request, monkeypatch):
    """Windows that end everywhere: inside strings, escapes, numbers and nested args."""
    monkeypatch.setattr(kineto_stream, "BLOCK", request.param)
    return request.param


@pytest.mark.parametrize("after", [True, False], ids=["keys_after", "keys_before"])
@pytest.mark.parametrize("indent", [2, None], ids=["kineto_layout", "one_line"])
@pytest.mark.parametrize("name", ["t.pt.trace.json", "t.pt.trace.json.gz"])
def test_the_events_and_keys_of_a_whole_parse(tmp_path, block, after, indent, name):
    evs = events()
    data = document(evs, after=after, indent=indent)
    got, s = stream(write(tmp_path, data, name))
    assert got == orjson.loads(data)["traceEvents"]
    assert s.rest == {k: v for k, v in orjson.loads(data).items() if k != "traceEvents"}
    assert not s.skipped and not s.bad_rows


def test_keys_after_the_events_set_the_clock_and_devices(tmp_path, block):
    data = document(events(), after=True)
    (part,) = parse_file(write(tmp_path, data))
    assert part.clock.method == "kineto-baseTimeNanoseconds" and part.clock.offset_ns == BASE
    assert part.devices["0"]["name"] == "GPU X"
    assert part.kernels.num_rows == 40 and part.iterations.num_rows == 1
    assert part.kernels.column("name").to_pylist()[1] == f"kernel {AWKWARD[1]} 1"


def _tables(parts) -> tuple[pa.Table, pa.Table]:
    return pa.concat_tables([p.kernels for p in parts]), pa.concat_tables([p.iterations for p in parts])


@pytest.mark.parametrize("sample", SAMPLES)
def test_real_samples_convert_as_the_whole_document_does(tmp_path, samples, sample, monkeypatch):
    monkeypatch.setattr(kineto_stream, "BLOCK", 4096)
    path = samples / sample
    tf = identify(path)
    ctx = context_for(tf, node="n", source="kineto")
    whole = parse_kineto(
        orjson.loads(gzip.decompress(path.read_bytes())),
        node=ctx.node,
        identity=ctx.identity,
        run_id=ctx.run_id,
        model=ctx.model,
        file_mtime_ns=tf.mtime_ns,
        source=ctx.source,
    )
    parts = list(parse_any(tf, ctx))
    kernels, iterations = _tables(parts)
    # parse_any may add a model (kernels) and the job columns (docs/jobs.md)
    assert kernels.select(whole.kernels.column_names).equals(whole.kernels)
    assert iterations.select(whole.iterations.column_names).equals(whole.iterations)
    assert parts[0].clock == whole.clock and parts[0].devices == whole.devices
    assert sum((p.skipped for p in parts), type(whole.skipped)()) == whole.skipped


def reference(data: bytes) -> list:
    """The events wholly inside ``data``, read by ijson (independent of the code under test)."""
    out = []
    try:
        for ev in ijson.items(io.BytesIO(data), "traceEvents.item"):
            out.append(ev)
    except ijson.JSONError:
        pass
    return json.loads(json.dumps(out, default=float))


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.77, 0.999])
def test_a_cut_keeps_the_events_before_it(tmp_path, block, fraction):
    data = document(events(), after=True)
    cut = data[: int(len(data) * fraction)]
    got, s = stream(write(tmp_path, cut))
    assert got and got == reference(cut)
    # cut in the keys after the events: those are invalid too, as json_salvage says of a whole document
    after_events = len(cut) > data.index(b'],\n  "baseTimeNanoseconds"')
    assert dict(s.skipped) == {"truncated_json": 1, **({"invalid_json": 1} if after_events else {})}
    (row,) = [r for r in s.bad_rows if r.reason == "truncated_json"]
    assert row.offset == len(cut) and row.line == cut[-200:]


def test_a_cut_gzip_stream_keeps_what_came_before(tmp_path, block):
    data = document(events(400), after=True)
    packed = gzip.compress(data)
    got, s = stream(write(tmp_path, packed[: len(packed) // 2], "cut.json"))
    assert got and len(got) < 801
    assert got == orjson.loads(data)["traceEvents"][: len(got)]
    assert s.skipped["damaged_gzip"] == 1 and s.skipped["truncated_json"] == 1


def test_a_cut_file_through_the_source_is_counted(tmp_path):
    data = document(events(), after=True)
    parts = parse_file(write(tmp_path, data[: len(data) // 2]))
    assert parts[0].skipped["truncated_json"] == 1
    assert 0 < parts[0].kernels.num_rows < 40
    assert parts[0].clock.method == "file-mtime"  # the base time came after the cut


def test_junk_between_events_and_a_broken_event_lose_that_event_only(tmp_path, block):
    evs = events()
    data = document(evs, after=True)
    at = data.index(b"},\n    {", data.index(b'"kernel kernel'.replace(b"kernel kernel", b"kernel "))) + 1
    junk = data[:at] + b" @@ " + data[at:]
    got, s = stream(write(tmp_path, junk))
    assert got == evs
    assert s.skipped == {"invalid_json": 1} and s.bad_rows[0].offset == at
    broken = data.replace(b'"dur": 3.0,\n      "args"', b'"dur": 3.0\n      "args"', 1)
    got, s = stream(write(tmp_path, broken))
    assert len(got) == len(evs) - 1 and s.skipped == {"invalid_json": 1}


def test_nesting_past_the_limit_ends_the_events_there(tmp_path, block):
    data = document(events(), after=True)
    at = data.index(b'"kernel', len(data) // 2)
    deep = data[:at] + b'"x": ' + b"[" * 300 + data[at:]
    got, s = stream(write(tmp_path, deep))
    assert got == reference(data[:at])
    assert dict(s.skipped) == {"json_too_deep": 1}
    with pytest.raises(JsonDepthError):
        stream(write(tmp_path, b'{"traceEvents": [' + b"[" * 300))


def test_an_event_past_the_size_bound_ends_the_events(tmp_path, monkeypatch):
    monkeypatch.setattr(kineto_stream, "MAX_EVENT", 4096)
    monkeypatch.setattr(kineto_stream, "BLOCK", 1024)
    evs = events(10)
    evs.insert(5, {"ph": "X", "cat": "cpu_op", "name": "big", "args": {"blob": "z" * 10_000}})
    got, s = stream(write(tmp_path, document(evs)))
    assert got == evs[:5]
    assert s.skipped == {"invalid_json": 1}


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b'{"schemaVersion": 1, "traceEvents": {"a": 1}}', ValueError),
        (b'[{"ph": "X"}]', ValueError),
        (b'{"schemaVersion": 1, "traceEvents": [' + b"x" * 50 + b"]}", TraceFormatError),
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "na', TraceFormatError),
    ],
    ids=["not_a_list", "not_an_object", "not_json", "cut_before_any_event"],
)
def test_documents_with_no_events_to_keep_are_refused(tmp_path, data, error):
    with pytest.raises(error) as exc:
        stream(write(tmp_path, data))
    if data.endswith(b"]}"):
        assert str(exc.value.message).startswith("invalid JSON at byte 37:")  # type: ignore[attr-defined]


def test_an_empty_events_array_is_an_empty_trace(tmp_path):
    got, s = stream(write(tmp_path, b'{"schemaVersion": 1, "traceEvents": [ ], "traceName": "x"}'))
    assert got == [] and s.rest == {"schemaVersion": 1, "traceName": "x"} and not s.skipped
