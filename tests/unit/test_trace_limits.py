"""Bounded trace reading: gzip streamed within limits and kept up to its damage, sizes, ratio, JSON depth."""

from __future__ import annotations

import builtins
import gzip
import json
import os
import random
import subprocess
import sys
import textwrap
import zlib
from pathlib import Path

import pytest

from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.json_scan import JsonScanner, JsonTooDeepError
from aaco.agent.sources.traces.limits import JsonDepthError, TraceLimitError, TraceLimits, open_trace, read_document
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.errors import TraceFormatError

PAYLOAD = b"".join(b"row %d,some text that compresses,%d\n" % (i, i * 7) for i in range(20_000))


def decodable(packed: bytes) -> bytes:
    """What zlib gives of a gzip stream fed one byte at a time before it errs or ends (the reference)."""
    d = zlib.decompressobj(31)
    out = []
    for i in range(len(packed)):
        try:
            out.append(d.decompress(packed[i : i + 1]))
        except zlib.error:
            break
        if d.eof:
            break
    return b"".join(out)


def read_steps(path: Path, step: int, *, one: bool = False) -> tuple[bytes, Exception | None]:
    """The content read ``step`` bytes at a time (``read1`` when ``one``), and the error that ended it."""
    got = []
    with open_trace(path) as fh:
        try:
            while piece := (fh.read1(step) if one else fh.read(step)):
                got.append(piece)
        except (EOFError, zlib.error) as exc:
            return b"".join(got), exc
    return b"".join(got), None


def test_gzip_members_padding_and_read_sizes(tmp_path):
    p = tmp_path / "t.csv.gz"
    half = len(PAYLOAD) // 2
    p.write_bytes(gzip.compress(PAYLOAD[:half]) + b"\0" * 3 + gzip.compress(PAYLOAD[half:]))
    assert bytes(read_document(p, TraceLimits()).data) == PAYLOAD
    for step in (7, 4097, 1 << 20, 5 << 20):
        assert read_steps(p, step) == (PAYLOAD, None)
    assert read_steps(p, 3000, one=True) == (PAYLOAD, None)
    with open_trace(p) as fh:
        assert fh.read(10) == PAYLOAD[:10] and fh.tell() == 10
        assert fh.read() == PAYLOAD[10:]


def test_read_reserves_nothing_up_front(tmp_path):
    p = tmp_path / "t.csv"
    p.write_bytes(PAYLOAD)
    with open_trace(p) as fh:  # a plain file object's read(1 TiB) asks the allocator for 1 TiB first
        assert fh.read(1 << 40) == PAYLOAD


@pytest.mark.parametrize("cut", [12, 300, 5_000, 20_000, -9])
def test_cut_gzip_keeps_everything_before_the_cut(tmp_path, cut):
    packed = gzip.compress(PAYLOAD)
    p = tmp_path / "t.csv.gz"
    p.write_bytes(packed[:cut])
    want = decodable(packed[:cut])
    doc = read_document(p, TraceLimits())
    assert bytes(doc.data) == want
    assert "cut short" in doc.damage
    data, err = read_steps(p, 1 << 20)
    assert data == want and isinstance(err, EOFError)
    assert read_steps(p, 777, one=True)[0] == want


def test_corrupt_gzip_keeps_the_output_before_the_damage(tmp_path):
    packed = gzip.compress(PAYLOAD)
    rng = random.Random(5)
    p = tmp_path / "t.csv.gz"
    seen = 0
    while seen < 12:  # flips that zlib detects in the middle (others pass as garbage or a CRC error)
        bad = bytearray(packed)
        at = rng.randrange(100, len(packed) - 100)
        bad[at] ^= 0x55
        want = decodable(bytes(bad))
        if len(want) >= len(PAYLOAD):
            continue
        p.write_bytes(bytes(bad))
        doc = read_document(p, TraceLimits())
        assert bytes(doc.data) == want, at
        assert doc.damage is not None
        seen += 1


def test_file_size_is_checked_before_reading(tmp_path, monkeypatch):
    p = tmp_path / "huge.json"
    with p.open("wb") as fh:
        fh.write(b'{"schemaVersion": 1, "traceEvents": []}')
        fh.truncate(64 << 30)  # sparse: 64 GiB that no test could read
    tf = TraceFile(p, "kineto", "0" * 24, p.stat().st_mtime_ns, p.stat().st_size)
    real_open = builtins.open

    def no_open(file, *args, **kw):
        assert os.fspath(file) != os.fspath(p), "the file was opened before its size was checked"
        return real_open(file, *args, **kw)

    monkeypatch.setattr(builtins, "open", no_open)
    with pytest.raises(TraceLimitError, match=r"file is 68719476736 bytes, over the 4294967296 byte limit") as exc:
        list(parse_any(tf, context_for(tf, node="n", source="s")))
    assert exc.value.limit == "max_file_bytes" and "max_file_bytes" in exc.value.hint


def test_decompressed_size_is_bounded(tmp_path):
    p = tmp_path / "t.csv.gz"
    p.write_bytes(gzip.compress(PAYLOAD))
    with pytest.raises(TraceLimitError, match="decompressed content passed") as exc:
        read_document(p, TraceLimits(max_file_bytes=len(PAYLOAD) - 1))
    assert exc.value.limit == "max_file_bytes"


def test_gzip_bomb_is_stopped_past_the_grace(tmp_path):
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(bytes(64 << 20)))  # 64 MiB in about 64 KB
    limits = TraceLimits(gzip_grace_bytes=4 << 20)
    with pytest.raises(TraceLimitError, match="decompression bomb") as exc:
        read_document(p, limits)
    assert exc.value.limit == "max_gzip_ratio"
    genuine = tmp_path / "genuine.csv.gz"
    genuine.write_bytes(gzip.compress(PAYLOAD))  # about 10:1
    assert bytes(read_document(genuine, TraceLimits(gzip_grace_bytes=1 << 10)).data) == PAYLOAD


def test_stream_stops_at_the_depth_limit_after_the_bytes_before(tmp_path):
    head = b'{"rocprofiler-sdk-tool": [{"a": "[[[[[[[[[[[[[[[", "b": '
    p = tmp_path / "deep.json"
    p.write_bytes(head + b"[" * 200_000)
    got = []
    deep = r"nested deeper than 128 levels \(max_json_depth\) at byte"
    with open_trace(p) as fh, pytest.raises(JsonDepthError, match=deep) as exc:
        while piece := fh.read(4096):
            got.append(piece)
    data = b"".join(got)
    assert data == (head + b"[" * 200_000)[: len(data)]
    assert len(data) == len(head) + 125  # the 126th [ of the run is level 129 (three levels open before it)
    assert exc.value.limit == "max_json_depth" and isinstance(exc.value, ValueError)
    csv = tmp_path / "t.csv"
    csv.write_bytes(b"Name\n" + b"[" * 100_000 + b"\n")  # not JSON: brackets are text
    assert read_steps(csv, 1 << 20)[1] is None


def json_depth_reference(data: str, limit: int) -> tuple:
    """Byte by byte: the offset of the first bracket past ``limit``, else (depth, in string) at the end."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(data):
        was_escaped, escaped = escaped, ch == "\\" and not escaped
        if ch == "\n":
            in_string = False  # a raw newline ends any string (the scanner's resync)
        elif ch == '"' and not was_escaped:
            in_string = not in_string
        elif not in_string and ch in "[{":
            depth += 1
            if depth > limit:
                return ("deep", i)
        elif not in_string and ch in "]}":
            depth -= 1
    return ("ok", depth, in_string)


def test_scanner_matches_a_byte_by_byte_reference_for_any_block_split():
    rng = random.Random(13)
    for _ in range(1500):
        text = "".join(rng.choice('[]{}"\\\nab ,:') for _ in range(rng.randint(0, 90)))
        want = json_depth_reference(text, 6)
        for block in (1, 2, 5, 64):
            scanner = JsonScanner(6)
            try:
                for i in range(0, len(text), block):
                    scanner.feed(text.encode()[i : i + block])
                got: tuple = ("ok", scanner.depth, scanner.in_string)
            except JsonTooDeepError as exc:
                got = ("deep", exc.offset)
            assert got == want, (text, block)


CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from aaco.contract.errors import TraceFormatError
    from aaco.agent.sources.traces.detect import identify
    from aaco.agent.sources.traces.parse import context_for, parse_any
    tf = identify(Path(sys.argv[1]))
    try:
        rows = sum(p.kernels.num_rows for p in parse_any(tf, context_for(tf, node="n", source="s")))
        outcome = f"rows={rows}"
    except TraceFormatError as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    # VmHWM: this process's peak since exec (ru_maxrss keeps the forking parent's peak across exec)
    peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    print(json.dumps({"outcome": outcome, "peak": peak * 1024}))
    """
)


def child_run(path: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_memory_stays_bounded_on_hostile_input(tmp_path):
    kineto_deep = tmp_path / "deep.json"
    kineto_deep.write_bytes(b'{"schemaVersion": 1, "traceEvents": ' + b"[" * 200_000)
    v3_deep = tmp_path / "deep_results.json"
    v3_deep.write_bytes(b'{"rocprofiler-sdk-tool": [' + b"[" * 200_000)
    bomb = tmp_path / "bomb.json.gz"
    spaces = b" " * (64 << 20)
    member = gzip.compress(spaces)
    bomb.write_bytes(gzip.compress(b'{"schemaVersion": 1, "traceEvents": [' + spaces) + member * 31)  # 2 GiB in 2 MB
    for path, expect in (
        (kineto_deep, "max_json_depth"),
        (v3_deep, "rows=0"),
        (bomb, "decompression bomb"),
    ):
        got = child_run(path)
        assert expect in got["outcome"], (path.name, got)
        assert got["peak"] < 512 << 20, (path.name, got)  # the bomb holds its 256 MiB grace at most


def test_refusal_names_the_file(tmp_path):
    p = tmp_path / "deep.json"
    head = b'{"schemaVersion": 1, "traceEvents": '
    p.write_bytes(head + b"[" * 5000)
    tf = TraceFile(p, "kineto", "0" * 24, p.stat().st_mtime_ns, p.stat().st_size)
    with pytest.raises(TraceFormatError) as exc:
        list(parse_any(tf, context_for(tf, node="n", source="s")))
    assert exc.value.subject == os.fspath(p)
    assert f"nested deeper than 128 levels (max_json_depth) at byte {len(head) + 127}" in exc.value.message
