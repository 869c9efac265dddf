"""The trace format registry: one registration per format, sniffs tried in order, parse by name."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.format import FormatRegistry, TraceFormat
from aaco.agent.sources.traces.limits import TraceLimits, read_document
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.agent.sources.traces.registry import TRACE_FORMATS
from aaco.agent.sources.traces.tables import chunks, const, stamp_kernels

# The formats the agent read before the registry existed, by the names its files are known by.
KNOWN = {
    "ort_profile",
    "kineto",
    "rocprofv3_kernel_csv",
    "rocprofv3_memcpy_csv",
    "rocprofv3_api_csv",
    "rocprofv3_agent_info_csv",
    "rocprofv3_json",
    "rocpd",
    "rocprof_v1_csv",
    "rocprof_v1_json",
}


def _toy_sniff(head: bytes) -> str | None:
    return "toy" if head.startswith(b"toy\n") else None


def _toy_parse(tf: TraceFile, ctx: TraceContext, limits: TraceLimits) -> Iterator[ParsedTrace]:
    lines = bytes(read_document(tf.path, limits).data).split(b"\n")[1:]
    starts = [int(x) for x in lines if x]
    n = len(starts)
    cols = {"start_ns": pa.array(starts, pa.int64()), "end_ns": pa.array([s + 1 for s in starts], pa.int64())}
    cols["name"] = const("toy_kernel", n)
    yield from chunks("toy", ctx, stamp_kernels(cols, n, ctx, "kernel"))


TOY = TraceFormat(("toy",), _toy_sniff, _toy_parse, tailable=frozenset({"toy"}))


def test_the_agent_registers_every_known_format_once():
    assert set(TRACE_FORMATS.names) == KNOWN
    assert len(TRACE_FORMATS.names) == len(KNOWN)
    for name in KNOWN:
        fmt = TRACE_FORMATS.get(name)
        assert fmt is not None and name in fmt.names


def test_the_registry_derives_the_format_sets():
    csv = {"rocprofv3_kernel_csv", "rocprofv3_memcpy_csv", "rocprofv3_api_csv", "rocprofv3_agent_info_csv"}
    assert TRACE_FORMATS.boottime == csv | {"rocprofv3_json", "rocpd", "rocprof_v1_csv", "rocprof_v1_json"}
    assert TRACE_FORMATS.iterations_first == {"rocprofv3_api_csv"}
    assert TRACE_FORMATS.tailable == {"rocprofv3_kernel_csv", "rocprofv3_memcpy_csv"}


def test_a_name_registered_twice_is_refused():
    reg = FormatRegistry()
    reg.register(TOY)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register(TraceFormat(("toy",), _toy_sniff, _toy_parse))


def test_sniffs_are_tried_in_registration_order():
    reg = FormatRegistry()
    reg.register(TraceFormat(("first",), lambda head: "first" if head.startswith(b"toy") else None, _toy_parse))
    reg.register(TOY)
    assert reg.sniff(b"toy\n1\n") == "first"
    assert reg.sniff(b"other") is None
    assert reg.get("toy") is TOY
    assert reg.get("nothing") is None
    assert reg.tailable == {"toy"}


def test_a_new_format_is_one_module_and_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The registration line is all it takes for detection and parsing (gzip included) to know a format."""
    from aaco.agent.sources.traces.detect import identify
    from aaco.agent.sources.traces.parse import context_for, parse_any

    reg = FormatRegistry()
    for fmt in TRACE_FORMATS:
        reg.register(fmt)
    reg.register(TOY)
    monkeypatch.setattr("aaco.agent.sources.traces.detect.TRACE_FORMATS", reg)
    monkeypatch.setattr("aaco.agent.sources.traces.parse.TRACE_FORMATS", reg)
    path = tmp_path / "run.toy.gz"
    path.write_bytes(gzip.compress(b"toy\n10\n20\n30\n"))

    tf = identify(path)
    parts = list(parse_any(tf, context_for(tf, node="n", source="s")))

    assert tf.format == "toy"
    assert [p.format for p in parts] == ["toy"]
    assert parts[0].kernels.column("start_ns").to_pylist() == [10, 20, 30]
    assert set(parts[0].kernels.column("model").to_pylist()) == {"run.toy"}
