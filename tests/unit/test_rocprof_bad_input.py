"""Bad input, property-based: mutated real samples never raise, keep every good row, count every bad one."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.agent.sources.traces.rocprofv3_csv import Rocprofv3CsvDecoder
from aaco.contract.clock import ClockOffset
from aaco.contract.errors import TraceFormatError

from .test_rocprof_json import build

CLOCK = ClockOffset(1_700_000_000 * 10**9, 0, "test")  # events land in 2023, inside 1990..2100
CTX = TraceContext("n", "id", "run", "m", "rocprofv3", CLOCK)
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def csv_sample(samples) -> tuple[bytes, bytes, list[bytes]]:
    data = (samples / "rocprofv3/kernel_trace.csv").read_bytes()
    header, _, body = data.partition(b"\n")
    return header + b"\n", body, [ln for ln in body.split(b"\n") if ln]


def key(line: bytes) -> tuple[int, int]:
    """(Correlation_Id, Start_Timestamp) of a sample row."""
    fields = line.rsplit(b'"', 1)[1].split(b",")
    return int(fields[1]), int(fields[2])


def keys(table: pa.Table) -> set[tuple[int, int]]:
    raw = [t - CLOCK.offset_ns for t in table["start_ns"].to_pylist()]
    return set(zip(table["correlation_id"].to_pylist(), raw, strict=True))


def decode(header: bytes, body: bytes):
    return Rocprofv3CsvDecoder(header, CTX).decode(body, len(header))


junk_line = st.binary(min_size=1, max_size=300).filter(
    lambda b: b"\n" not in b and b.strip() and not b.lstrip(b'"').startswith(b"KERNEL_DISPATCH")
)


@SETTINGS
@given(data=st.data())
def test_junk_lines_are_counted_and_good_rows_kept(csv_sample, data):
    header, _, rows = csv_sample
    junk = data.draw(st.lists(st.tuples(st.integers(0, len(rows)), junk_line), min_size=1, max_size=6))
    lines = list(rows)
    for pos, j in sorted(junk, key=lambda x: -x[0]):
        lines.insert(pos, j)
    body = b"\n".join(lines) + b"\n"
    res = decode(header, body)
    assert keys(res.table) == {key(r) for r in rows}
    assert len(res.bad_rows) == len(junk) == sum(res.skipped.values())
    full = header + body
    for bad in res.bad_rows:
        assert full[bad.offset : bad.offset + len(bad.line)] == bad.line
    # the decoder strips the one \r of a CRLF ending, not every \r before the newline
    assert sorted(b.line for b in res.bad_rows) == sorted(j.removesuffix(b"\r") for _, j in junk)


@SETTINGS
@given(data=st.data())
def test_flipped_bytes(csv_sample, data):
    header, body, _ = csv_sample
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(body) - 1), st.integers(1, 255)), min_size=1, max_size=8))
    mutated = bytearray(body)
    for pos, x in flips:
        mutated[pos] ^= x
    mutated = bytes(mutated)
    res = decode(header, mutated)  # never raises
    lines = [ln.rstrip(b"\r") for ln in mutated.split(b"\n")]
    nonblank = [ln for ln in lines if ln.strip() and ln != header.rstrip(b"\n")]
    assert res.table.num_rows + len(res.bad_rows) == len(nonblank)
    # lines no flip touched (nor the newlines around them) are all kept
    touched = {p for p, _ in flips}
    start = 0
    untouched = []
    for line in body.split(b"\n"):
        end = start + len(line)
        if line and not any(start - 1 <= p <= end for p in touched):
            untouched.append(line)
        start = end + 1
    assert {key(r) for r in untouched} <= keys(res.table)


@SETTINGS
@given(data=st.data())
def test_dropped_columns_and_huge_names(csv_sample, data):
    header, _, rows = csv_sample
    idx = data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=4, unique=True))
    huge = data.draw(st.sampled_from([b""] + [b"n" * (m << 20) for m in (1, 2)]))
    lines = list(rows)
    expect: dict[int, str] = {}
    for n, i in enumerate(idx):
        if huge and n == 0:
            parts = lines[i].split(b'"')
            parts[5] = huge  # the kernel name
            lines[i] = b'"'.join(parts)
            expect[i] = "name_too_long"
        else:
            fields = lines[i].split(b'"')
            tail = fields[-1].split(b",")
            drop = data.draw(st.integers(1, len(tail) - 1))
            fields[-1] = b",".join(tail[:drop] + tail[drop + 1 :])
            lines[i] = b'"'.join(fields)
            expect[i] = "column_count"
    res = decode(header, b"\n".join(lines) + b"\n")
    assert keys(res.table) == {key(r) for i, r in enumerate(rows) if i not in expect}
    assert sorted(b.reason for b in res.bad_rows) == sorted(expect.values())


@SETTINGS
@given(cut=st.integers(0, 10_000))
def test_truncated_csv_file(samples, cut):
    data = (samples / "rocprofv3/kernel_trace.csv").read_bytes()
    header_end = data.index(b"\n") + 1
    cut = header_end + 1 + cut % (len(data) - header_end - 1)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "t_kernel_trace.csv"
        p.write_bytes(data[:cut])
        tf = identify(p)
        parts = list(parse_any(tf, context_for(tf, node="n", source="s", clock=CLOCK)))
    kept = sum(p.kernels.num_rows for p in parts)
    bad = sum(len(p.bad_rows) for p in parts)
    complete = data[header_end:cut].count(b"\n")
    partial = 1 if data[header_end:cut].rsplit(b"\n", 1)[-1].strip() else 0
    assert kept + bad == complete + partial
    assert kept >= complete


@settings(max_examples=40, deadline=None)
@given(frac=st.floats(0.0, 1.0))
def test_truncated_rocprofv3_json(frac):
    doc, _ = build(200, copies=5)
    data = json.dumps(doc, indent=1).encode()
    durations = {
        r["end_timestamp"] - r["start_timestamp"]
        for r in doc["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"]
    }
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "r.json"
        p.write_bytes(data[: int(len(data) * frac)])
        try:
            tf = identify(p)
            parts = list(parse_any(tf, context_for(tf, node="n", source="s", clock=CLOCK)))
        except TraceFormatError:
            return  # cut before it could even be recognised: reported, never a crash
    rows = [r for part in parts for r in part.kernels.to_pylist() if r["kind"] == "kernel"]
    assert len(rows) <= 200
    assert all(r["end_ns"] - r["start_ns"] in durations for r in rows)
    if frac < 1.0:
        assert sum(part.skipped["truncated_json"] for part in parts) == 1


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_mutated_rocprof_v1_json(samples, data):
    raw = bytearray((samples / "rocprof-v1/hip_trace_results.json").read_bytes())
    cut = data.draw(st.integers(1, len(raw)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(1, 255)), max_size=4))
    for pos, x in flips:
        raw[pos] ^= x
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "results.json"
        p.write_bytes(bytes(raw[:cut]))
        try:
            tf = identify(p)
            parts = list(parse_any(tf, context_for(tf, node="n", source="s", clock=CLOCK)))
        except TraceFormatError:
            return
    assert sum(part.kernels.num_rows for part in parts) <= 7


def test_truncated_gzip_csv_keeps_the_lines_before_the_cut(samples, tmp_path):
    data = (samples / "rocprofv3/kernel_trace.csv").read_bytes()  # header + 9 rows
    header, _, body = data.partition(b"\n")
    big = header + b"\n" + body * 3000  # ~5 MB: several read steps
    packed = gzip.compress(big)
    p = tmp_path / "cut_kernel_trace.csv.gz"
    p.write_bytes(packed[: len(packed) * 2 // 3])
    tf = identify(p)
    parts = list(parse_any(tf, context_for(tf, node="n", source="s", clock=CLOCK)))
    kept = sum(part.kernels.num_rows for part in parts)
    assert 0 < kept < 27_000
    assert sum(part.skipped["truncated_file"] for part in parts) == 1


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_damaged_rocpd_database(data):
    from .test_rocpd import build as build_rocpd

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "run.db"
        build_rocpd(p, 60)
        raw = bytearray(p.read_bytes())
        flips = data.draw(
            st.lists(st.tuples(st.integers(100, len(raw) - 1), st.integers(1, 255)), min_size=1, max_size=20)
        )
        for pos, x in flips:
            raw[pos] ^= x
        p.write_bytes(bytes(raw))
        try:
            tf = identify(p)
            parts = list(parse_any(tf, context_for(tf, node="n", source="s", clock=CLOCK)))
        except TraceFormatError:
            return  # unreadable: reported with the file's name, never a crash
    assert sum(part.kernels.num_rows for part in parts) <= 61
