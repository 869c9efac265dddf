"""The hand-encoded OTLP bytes (otlp_wire, otlp_spans) pinned against the official opentelemetry-proto classes.

Each case builds the same message twice, with our encoder and with the generated classes, and asserts
that our bytes parse to an equal message and, where every field is set to a non-default value (proto3
leaves defaults out, we do not), that the bytes are the official deterministic serialization itself.
``retrace`` is pinned too: a moved span keeps every field but its trace.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from aaco.contract.schemas import SCHEMAS, conform
from aaco.exporters import otlp_wire as w
from aaco.exporters.otlp_assembly import retrace
from aaco.exporters.otlp_spans import RootSpan, SpanEncoder, SpanEvent
from tests.support.otlp_official import key_values, official_kernel_spans

TRACE = bytes(range(1, 17))
OTHER_TRACE = bytes(range(101, 117))
SPAN = bytes(range(20, 28))
PARENT = bytes(range(30, 38))
APP_TRACE, APP_SPAN = b"\xaa" * 16, b"\xbb" * 8

EVERY_TYPE: dict[str, object] = {
    "s": "text",
    "s.empty": "",
    "s.unicode": "Grüße ✓ 步骤 🚀",
    "i.zero": 0,
    "i.neg": -5,
    "i.big": 2**31 + 7,
    "i.max": 2**63 - 1,
    "i.min": -(2**63),
    "f": 1.5,
    "f.neg.zero": -0.0,
    "f.huge": 1e308,
    "b.true": True,
    "b.false": False,
    "bytes": b"\x00\xff\x10",
    "bytes.empty": b"",
    "none": None,  # left out
}


def official_root(root: RootSpan) -> trace_pb2.Span:
    """The official Span for a ``RootSpan``."""
    return trace_pb2.Span(
        trace_id=root.trace_id,
        span_id=root.span_id,
        parent_span_id=root.parent_span_id or b"",
        name=root.name,
        kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=root.start_ns,
        end_time_unix_nano=max(root.end_ns, root.start_ns),
        attributes=key_values(root.attributes),
        events=[
            trace_pb2.Span.Event(time_unix_nano=e.time_ns, name=e.name, attributes=key_values(e.attributes))
            for e in root.events
        ],
        links=[trace_pb2.Span.Link(trace_id=t, span_id=s, attributes=key_values(a)) for t, s, a in root.links],
    )


def assert_same(ours: bytes, official: Message, canonical: bool = True) -> None:
    """Our bytes parse to ``official``; with ``canonical``, they are its serialization byte for byte."""
    assert type(official).FromString(ours) == official
    if canonical:
        assert ours == official.SerializeToString(deterministic=True)


ROOTS = {
    "every_type_parent_events_links": RootSpan(
        TRACE,
        SPAN,
        "ProfilerStep",
        1_700_000_000_000_000_000,
        1_700_000_000_250_000_000,
        dict(EVERY_TYPE),
        parent_span_id=PARENT,
        events=[
            SpanEvent(1_700_000_000_100_000_000, "off-cpu", {"thread.id": 7, "aaco.offcpu.duration_ns": 1500}),
            SpanEvent(1_700_000_000_200_000_000, "mark"),
        ],
        links=[(APP_TRACE, APP_SPAN, {"aaco.link": "application"}), (OTHER_TRACE, PARENT, {})],
    ),
    "empty_attributes": RootSpan(TRACE, SPAN, "capture window", 10, 20),
    "unicode_name": RootSpan(TRACE, SPAN, "Schritt ✓ 步骤 🚀 ÅÄÖ", 10, 20, {"aaco.model": "résnet-50"}),
    "very_long_name": RootSpan(TRACE, SPAN, "void at::native::kernel<" + "float, " * 20_000 + ">", 10, 20),
    "end_before_start": RootSpan(TRACE, SPAN, "clamped", 20, 10),
}


@pytest.mark.parametrize("case", list(ROOTS))
def test_root_span_is_the_official_encoding(case: str) -> None:
    root = ROOTS[case]
    ours = root.encode()
    assert_same(ours, official_root(root))
    parsed = trace_pb2.Span.FromString(ours)
    assert parsed.kind == trace_pb2.Span.SPAN_KIND_INTERNAL and not parsed.HasField("status")  # status: unset


def test_defaults_parse_equal_though_proto3_leaves_them_out() -> None:
    """Zero times, an empty name and an empty key: we write them, protobuf omits them; the messages are equal."""
    root = RootSpan(TRACE, SPAN, "", 0, 0, {"": "empty key"}, events=[SpanEvent(0, "")])
    ours = root.encode()
    official = official_root(root)
    assert_same(ours, official, canonical=False)
    assert len(ours) > len(official.SerializeToString())


def test_int_past_int64_goes_as_a_string_and_lone_surrogates_are_replaced() -> None:
    kv = common_pb2.KeyValue.FromString(w.key_value("k\ud800", 2**64))
    assert kv.key == "k?" and kv.value.string_value == str(2**64)
    assert common_pb2.AnyValue.FromString(w.any_value(-(2**63) - 1)).string_value == str(-(2**63) - 1)
    assert common_pb2.AnyValue.FromString(w.any_value("x\udfff")).string_value == "x?"


def test_varint_and_read_varint_agree_across_lengths() -> None:
    for n in (0, 1, 127, 128, 300, 2**31, 2**35, 2**63 - 1, 2**64 - 1):
        enc = w.varint(n)
        assert w.read_varint(b"\x00" + enc, 1) == (n, 1 + len(enc))
    assert w.varint(-1) == b"\xff" * 9 + b"\x01"  # int64 -1: ten bytes, as protobuf writes it
    with pytest.raises(ValueError):
        w.read_varint(b"\x80", 0)


def test_attribute_cache_matches_uncached_encoding() -> None:
    cache = w.AttributeCache(limit=2)
    for k, v in [("a", 1), ("b", "x"), ("c", 2.5), ("a", 1), ("d", b"\x01")]:
        assert cache.get(k, v) == w.attributes(9, {k: v})


def test_export_request_resource_and_scope() -> None:
    spans = [ROOTS["every_type_parent_events_links"].encode(), ROOTS["empty_attributes"].encode()]
    res = {"host.name": "node-a", "service.name": "aaco-agent", "process.pid": 42}
    official = trace_service_pb2.ExportTraceServiceRequest(
        resource_spans=[
            trace_pb2.ResourceSpans(
                resource=resource_pb2.Resource(attributes=key_values(res)),
                scope_spans=[
                    trace_pb2.ScopeSpans(
                        scope=common_pb2.InstrumentationScope(name="aaco", version="1.2.3"),
                        spans=[trace_pb2.Span.FromString(s) for s in spans],
                    )
                ],
            )
        ]
    )
    assert_same(w.export_trace_request(w.resource(res), w.scope("aaco", "1.2.3"), spans), official)
    assert_same(w.resource(res), resource_pb2.Resource(attributes=key_values(res)))
    empty = w.export_trace_request(w.resource(res), w.scope("aaco", "1.2.3"), [])
    assert (
        len(trace_service_pb2.ExportTraceServiceRequest.FromString(empty).resource_spans[0].scope_spans[0].spans) == 0
    )


# -- kernel and launch spans ------------------------------------------------------------------------

KERNEL_ROWS: dict[str, list[Any]] = {
    "name": ["void gemm_kernel<float>(int)", "Memcpy HtoD", "ÿ kernel ✓"],
    "kind": ["kernel", "memcpy", "kernel"],
    "device": ["0", "1", None],
    "stream": [7, None, 3],
    "correlation_id": [123, None, 2**40],
    "tid": [11, 12, None],
    "queue_id": [None, 5, None],
    "grid_x": [64, None, 1],
    "grid_y": [2, None, 1],
    "grid_z": [1, None, 1],
    "workgroup_x": [256, None, 32],
    "workgroup_y": [1, None, 1],
    "workgroup_z": [1, None, 1],
    "op_name": ["aten::mm", None, None],
    "launch_start_ns": [900, None, 2900],
    "launch_end_ns": [950, None, 2800],  # the last ends before it starts: clamped
    "launch_name": ["cudaLaunchKernel", None, None],
    "trace_id": [TRACE.hex(), TRACE.hex(), OTHER_TRACE.hex()],
    "parent_span_id": [PARENT.hex(), PARENT.hex(), None],
}
FAMILIES = ["gemm", "memcpy", "other"]  # families() of the three names, pinned here


def kernel_batch() -> pa.RecordBatch:
    """Three kernel rows: two with launches, one memcpy without, one without a parent."""
    cols = {
        "start_ns": [1000, 2000, 3000],
        "end_ns": [1500, 2100, 3500],
        "node": ["node-a"] * 3,
        "pid": [1] * 3,
        "source": ["test"] * 3,
    }
    cols.update(KERNEL_ROWS)
    schema = SCHEMAS["kernels"]
    return conform("kernels", pa.table({k: pa.array(v, schema.field(k).type) for k, v in cols.items()}))


def encoded_kernels() -> tuple[list[bytes], list[trace_pb2.Span]]:
    """Our kernel and launch spans of ``kernel_batch`` and the official ones."""
    from aaco.exporters.otlp_spans import _LAUNCH_SALT, _hex_ids, splitmix64

    batch = kernel_batch()
    enc = SpanEncoder()
    _, parent_ints = _hex_ids(batch.column("parent_span_id").to_pylist(), 8)
    ids = enc.kernel_span_ids(batch, parent_ints)
    launch_ids = splitmix64(ids ^ _LAUNCH_SALT)
    return enc.kernel_spans(batch), official_kernel_spans(batch, FAMILIES, ids.tolist(), launch_ids.tolist())


def test_kernel_and_launch_spans_are_the_official_encoding() -> None:
    ours, official = encoded_kernels()
    assert len(ours) == len(official) == 5
    for b, span in zip(ours, official, strict=True):
        assert_same(b, span)


# -- property: any attributes, names and times ------------------------------------------------------

TEXT = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=40)
VALUES = st.one_of(
    TEXT,
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.binary(max_size=40),
)
U64 = st.integers(1, 2**64 - 1)


@settings(max_examples=150, deadline=None)
@given(
    name=TEXT,
    attrs=st.dictionaries(TEXT, VALUES, max_size=8),
    start=U64,
    span=st.integers(0, 10**12),
    parent=st.one_of(st.none(), st.binary(min_size=8, max_size=8).filter(any)),
    events=st.lists(st.tuples(U64, TEXT, st.dictionaries(TEXT, VALUES, max_size=3)), max_size=3),
    links=st.lists(st.tuples(st.dictionaries(TEXT, VALUES, max_size=3)), max_size=3),
)
def test_any_root_span_is_the_official_encoding(name, attrs, start, span, parent, events, links) -> None:
    root = RootSpan(
        TRACE,
        SPAN,
        name,
        start,
        min(start + span, 2**64 - 1),
        attrs,
        parent_span_id=parent,
        events=[SpanEvent(t, n, a) for t, n, a in events],
        links=[(APP_TRACE, APP_SPAN, a) for (a,) in links],
    )
    ours = root.encode()
    assert_same(ours, official_root(root))
    moved = trace_pb2.Span.FromString(retrace(ours, OTHER_TRACE))
    assert moved.trace_id == OTHER_TRACE
    moved.trace_id = TRACE
    assert moved == trace_pb2.Span.FromString(ours)


# -- retrace ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", list(ROOTS))
def test_retrace_changes_only_the_trace_of_a_root(case: str) -> None:
    before = trace_pb2.Span.FromString(ROOTS[case].encode())
    after = trace_pb2.Span.FromString(retrace(ROOTS[case].encode(), OTHER_TRACE))
    assert after.trace_id == OTHER_TRACE
    assert [ln.trace_id for ln in after.links] == [ln.trace_id for ln in before.links]  # other traces: kept
    after.trace_id = before.trace_id
    assert after == before


def test_retrace_moves_kernels_launches_and_their_links_together() -> None:
    ours, _ = encoded_kernels()
    in_trace = [b for b in ours if trace_pb2.Span.FromString(b).trace_id == TRACE]
    moved = {}
    for b in in_trace:
        before, after = trace_pb2.Span.FromString(b), trace_pb2.Span.FromString(retrace(b, OTHER_TRACE))
        assert after.trace_id == OTHER_TRACE
        assert all(ln.trace_id == OTHER_TRACE for ln in after.links)  # the launch moved too
        moved[after.span_id] = after
        after.trace_id = TRACE
        for ln in after.links:
            ln.trace_id = TRACE
        assert after == before
    linked = [ln.span_id for s in moved.values() for ln in s.links]
    assert linked and all(sid in moved for sid in linked)  # every link lands on a span of the moved trace


@pytest.mark.parametrize(
    ("span", "new_trace"),
    [
        (b"\x12\x08" + SPAN + b"\x0a\x10" + TRACE, OTHER_TRACE),  # span_id first: another encoder's order
        (b"\x0a\x08" + SPAN, OTHER_TRACE),  # a trace_id of 8 bytes
        (b"\x0a\x10" + TRACE[:10], OTHER_TRACE),  # truncated
        (b"", OTHER_TRACE),
        (ROOTS["empty_attributes"].encode(), OTHER_TRACE[:8]),  # the new trace ID is not 16 bytes
    ],
    ids=["span_id_first", "trace_id_8_bytes", "truncated", "empty", "new_trace_8_bytes"],
)
def test_retrace_refuses_what_it_cannot_move(span: bytes, new_trace: bytes) -> None:
    with pytest.raises(ValueError):
        retrace(span, new_trace)


def test_retrace_refuses_a_span_whose_fields_do_not_walk() -> None:
    with pytest.raises(ValueError):
        retrace(b"\x0a\x10" + TRACE + b"\x6a\x40" + b"\x00" * 4, OTHER_TRACE)  # a link longer than the span
