"""Damaged Chrome-trace JSON: every good event around the damage kept, the damage named for what it is."""

from __future__ import annotations

import gzip
import io
import json
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import ijson
import pytest

from aaco.agent.errors import TraceFormatError
from aaco.agent.sources.formats import identify
from aaco.agent.sources.json_salvage import load_json
from aaco.agent.sources.parsers import context_for, parse_any
from aaco.agent.sources.trace_limits import Document, JsonDepthError, TraceLimits

SAMPLE = "kineto/a100_alexnet_trace.json.gz"
GPU = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def parse(path: Path):
    tf = identify(path)
    parts = list(parse_any(tf, context_for(tf, node="n", source="s")))
    kinds: Counter[str] = Counter()
    for p in parts:
        kinds.update(p.kernels["kind"].to_pylist() if p.kernels.num_rows else [])
    return parts, kinds


def gpu_events(events) -> Counter[str]:
    """GPU events by kind, counted from the JSON itself (the reference)."""
    return Counter(GPU[e["cat"]] for e in events if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in GPU)


@pytest.fixture(scope="module")
def content(samples) -> bytes:
    return gzip.decompress((samples / SAMPLE).read_bytes())


def kernel_event(data: bytes, k: int) -> tuple[int, int]:
    """Byte range of the ``k``-th kernel event object of the sample (one event spans several lines)."""
    at = -1
    for _ in range(k + 1):
        at = data.index(b'"cat": "kernel"', at + 1)
    start = data.rindex(b"{", 0, at)
    return start, data.index(b"\n  }", at) + 4


def write(tmp_path: Path, data: bytes, name: str = "trace.json") -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_values_orjson_refuses_keep_every_event(tmp_path, content):
    want = gpu_events(json.loads(content)["traceEvents"])
    start, _ = kernel_event(content, 5)
    cut = content.index(b'"cat"', start)
    for value in (b"1e999", b"NaN", b"-Infinity", b'"\\ud800 lone"', b'"bad \xff byte"'):
        damaged = content[:cut] + b'"extra": ' + value + b", " + content[cut:]
        parts, got = parse(write(tmp_path, damaged))
        assert got == want, value
        skipped = sum((p.skipped for p in parts), Counter())
        assert not {"invalid_json", "truncated_json"} & set(skipped), (value, skipped)


def test_a_broken_event_is_invalid_json_at_its_offset_and_the_others_stay(tmp_path, content):
    want = gpu_events(json.loads(content)["traceEvents"])
    start, end = kernel_event(content, 40)
    event = content[start:end].replace(b'"ph": "X", "cat"', b'"ph": "X" "cat"')  # a comma lost
    parts, got = parse(write(tmp_path, content[:start] + event + content[end:]))
    assert got == want - Counter({"kernel": 1})
    first = parts[0]
    assert first.skipped["invalid_json"] == 1 and "truncated_json" not in first.skipped
    assert [b.offset for b in first.bad_rows if b.reason == "invalid_json"] == [start]


def test_junk_between_events_loses_nothing(tmp_path, content):
    want = gpu_events(json.loads(content)["traceEvents"])
    _, end = kernel_event(content, 12)
    parts, got = parse(write(tmp_path, content[:end] + b" @@junk@@ " + content[end:]))
    assert got == want
    assert parts[0].skipped["invalid_json"] == 1
    assert [b.offset for b in parts[0].bad_rows if b.reason == "invalid_json"] == [end]


def test_not_json_is_named_invalid_with_its_offset(tmp_path):
    head = b'{"schemaVersion": 1, "traceEvents": ['
    with pytest.raises(TraceFormatError) as exc:
        parse(write(tmp_path, head + b"x" * 100 + b"]}"))
    assert exc.value.message.startswith(f"invalid JSON at byte {len(head)}:")
    assert "truncated" not in exc.value.message


def test_a_cut_is_truncated_json_not_invalid(tmp_path, content):
    data = content[: len(content) * 2 // 3]
    parts, got = parse(write(tmp_path, data))
    assert got == gpu_events(salvage_reference(data))
    assert parts[0].skipped["truncated_json"] == 1 and "invalid_json" not in parts[0].skipped


def salvage_reference(data: bytes) -> list:
    """The events wholly inside ``data``, read by ijson (independent of the code under test)."""
    events = []
    try:
        for ev in ijson.items(io.BytesIO(data), "traceEvents.item"):
            events.append(ev)
    except ijson.JSONError:
        pass
    return events


def test_damaged_gzip_keeps_the_events_decompressed_before_the_damage(tmp_path, samples):
    packed = (samples / SAMPLE).read_bytes()
    cut = packed[: len(packed) // 2]
    d = zlib.decompressobj(31)
    prefix = b"".join(d.decompress(cut[i : i + 1]) for i in range(len(cut)))
    parts, got = parse(write(tmp_path, cut, "trace.json.gz"))
    assert sum(got.values()) > 0
    assert got == gpu_events(salvage_reference(prefix))
    assert parts[0].skipped["damaged_gzip"] == 1 and parts[0].skipped["truncated_json"] == 1


def test_nesting_past_the_limit_ends_the_document_there(tmp_path, content):
    _, end = kernel_event(content, 30)
    data = content[:end] + b", " + b"[" * 200_000
    parts, got = parse(write(tmp_path, data))
    assert got == gpu_events(salvage_reference(content[:end] + b"]}"))
    assert parts[0].skipped["json_too_deep"] == 1
    assert "truncated_json" not in parts[0].skipped


def test_the_rest_of_the_document_is_kept_around_the_events():
    doc = (
        b'{"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X" "name": "b"}, {"ph": "X", "name": "c"}],'
        b' "otherData": {"agents": [1, 2]}, "late": 1e999}'
    )
    out = load_json(Document(bytearray(doc)), Path("r.json"), TraceLimits())
    assert out.doc == {"traceEvents": [{"ph": "X", "name": "a", "ts": 1}, {"ph": "X", "name": "c"}],
                       "otherData": {"agents": [1, 2]}, "late": None}  # fmt: skip
    assert dict(out.skipped) == {"invalid_json": 1}
    cut = load_json(Document(bytearray(doc[:60])), Path("r.json"), TraceLimits())
    assert cut.doc == {"traceEvents": [{"ph": "X", "name": "a", "ts": 1}]}
    assert dict(cut.skipped) == {"truncated_json": 1}


def test_the_files_own_limits_apply(tmp_path, content):
    tf = replace(identify(write(tmp_path, content[: len(content) // 2])), limits=TraceLimits(max_json_depth=2))
    with pytest.raises(JsonDepthError, match=r"nested deeper than 2 levels \(max_json_depth\)"):
        list(parse_any(tf, context_for(tf, node="n", source="s")))
