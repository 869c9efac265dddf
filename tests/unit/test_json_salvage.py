"""Damaged Chrome-trace JSON: every good event around the damage kept, the damage named for what it is."""

from __future__ import annotations

import ast
import gzip
import io
import json
import subprocess
import sys
import zlib
from collections import Counter
from dataclasses import replace
from pathlib import Path

import ijson
import pytest

from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.json_salvage import load_json
from aaco.agent.sources.traces.limits import Document, JsonDepthError, TraceLimits
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.agent.sources.traces.u64 import NumberGuard
from aaco.contract.errors import TraceFormatError
from tests.support import tracegen
from tests.unit import test_ort_profile

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


# --- numbers ijson's C backend cannot convert (issue 13: it segfaults without use_float) ---------

HUGE_INT = b"1" + b"0" * 5000  # past Python's 4300-digit int limit: ijson's yajl2_c backend segfaults on it
HUGE_EXPONENT = b"-2e99999999999999999999"
IJSON_ENTRIES = ("parse", "basic_parse", "items", "kvitems")


def test_the_agent_calls_ijson_in_one_module_only():
    """Every ijson call in the agent's code: only the rocprofv3 JSON walker (guarded, test below)."""
    root = Path(__file__).resolve().parents[2]
    callers = set()
    for path in sorted((root / "agent").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ijson"):
                callers.add(f"{path.relative_to(root)} imports from ijson")
            is_ijson = isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "ijson"
            if is_ijson and node.attr != "JSONError":
                callers.add(f"{path.relative_to(root)}: ijson.{node.attr}")
    assert callers == {"agent/sources/traces/rocprofv3_json_meta.py: ijson.parse"}


def test_every_ijson_read_goes_through_the_number_guard(tmp_path, monkeypatch, content, samples):
    """Whatever reads JSON through ijson, over every JSON format, whole and damaged: behind NumberGuard or use_float."""
    calls: list[tuple[str, bool]] = []

    def spy_on(name):
        real = getattr(ijson, name)

        def spy(source, *args, **kw):
            calls.append((name, isinstance(source, NumberGuard) or kw.get("use_float") is True))
            return real(source, *args, **kw)

        return spy

    for name in IJSON_ENTRIES:
        monkeypatch.setattr(ijson, name, spy_on(name))
    v3 = tmp_path / "v3" / "r.json"
    v3.parent.mkdir()
    tracegen.rocprofv3_json(v3, 50, 5, big_ids=True, odd_values=True)
    files = {
        "r.json": v3.read_bytes(),
        "cut.json": v3.read_bytes()[: v3.stat().st_size // 2],
        "kineto.json": content,
        "kineto_cut.json": content[: len(content) // 2],
        "results.json": (samples / "rocprof-v1/hip_trace_results.json").read_bytes(),
        "onnxruntime_profile_x.json": json.dumps(test_ort_profile.cpu_profile()).encode(),
    }
    for name, data in files.items():
        parse(write(tmp_path, data, name))
    assert calls and {name for name, _ in calls} == {"parse"}  # the rocprofv3 walker (two passes a file)
    assert all(ok for _, ok in calls), calls


CHILD = """
import sys
from collections import Counter
from pathlib import Path
from tests.unit.test_json_salvage import parse
for name in sys.argv[1:]:
    parts, kinds = parse(Path(name))
    skipped = sum((p.skipped for p in parts), Counter())
    print(name, sum(p.kernels.num_rows for p in parts), sum(kinds.values()), dict(skipped))
"""


def test_numbers_ijson_cannot_convert_in_every_whole_document_format(tmp_path, content, samples):
    """A 5000-digit integer or a 20-digit exponent in a Kineto, ONNX Runtime or rocprof v1 event: no crash
    (in a child, where a segfault would show as its exit status), that event alone lost or kept."""
    v1 = (samples / "rocprof-v1/hip_trace_results.json").read_bytes()
    start, _ = kernel_event(content, 5)
    at = content.index(b'"cat"', start)
    ort = json.dumps([e for e in test_ort_profile.cpu_profile() if isinstance(e, dict)]).encode()
    ort_at = ort.index(b'"dur": 10')  # the first timed conv
    v1_at = v1.index(b'"BeginNs"', len(v1) // 2)
    cases = {}
    for huge, number in ((True, HUGE_INT), (False, HUGE_EXPONENT)):
        extra = b'"extra": ' + number + b", "
        tag = "int" if huge else "exp"
        cases[f"kineto_{tag}.json"] = (content[:at] + extra + content[at:], content, huge)
        cases[f"onnxruntime_profile_{tag}.json"] = (ort[:ort_at] + extra + ort[ort_at:], ort, huge)
        cases[f"v1_{tag}_results.json"] = (v1[:v1_at] + extra + v1[v1_at:], v1, huge)
    paths = []
    for name, (data, base, _) in cases.items():
        paths += [write(tmp_path, data, name), write(tmp_path, base, "base_" + name)]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, *map(str, paths)],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = {Path(line.split()[0]).name: line.split(maxsplit=3)[1:] for line in proc.stdout.splitlines()}
    for name, (_, _, huge) in cases.items():
        rows, base_rows, skipped = int(got[name][0]), int(got["base_" + name][0]), got[name][2]
        if huge:  # no reader takes it: that event alone is invalid_json
            assert rows in (base_rows - 1, base_rows) and "invalid_json" in skipped, (name, got[name])
        else:  # the standard library reads it as an infinity, made null: the event is kept
            assert rows == base_rows and "invalid_json" not in skipped, (name, got[name])
