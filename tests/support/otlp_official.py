"""The official protobuf form of what the span encoder writes: attribute values and kernel spans, for tests."""

from __future__ import annotations

import pyarrow as pa
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from aaco.exporters.otlp_spans import OPTIONAL_ATTRIBUTES


def any_value(v: object) -> common_pb2.AnyValue:
    """The official AnyValue of ``v`` (the types our encoder supports)."""
    if isinstance(v, bool):
        return common_pb2.AnyValue(bool_value=v)
    if isinstance(v, int):
        return common_pb2.AnyValue(int_value=v)
    if isinstance(v, float):
        return common_pb2.AnyValue(double_value=v)
    if isinstance(v, bytes):
        return common_pb2.AnyValue(bytes_value=v)
    return common_pb2.AnyValue(string_value=str(v))


def key_values(attrs: dict[str, object]) -> list[common_pb2.KeyValue]:
    """Official KeyValues of ``attrs`` in their order, None values left out."""
    return [common_pb2.KeyValue(key=k, value=any_value(v)) for k, v in attrs.items() if v is not None]


def official_kernel_spans(
    batch: pa.RecordBatch, families: list[str], ids: list[int], launch_ids: list[int]
) -> list[trace_pb2.Span]:
    """The official spans of a kernels batch, each launch before its kernel (as the encoder emits them)."""
    rows = batch.to_pylist()
    out = []
    for r, fam, sid, lid in zip(rows, families, ids, launch_ids, strict=True):
        trace = bytes.fromhex(r["trace_id"])
        parent = bytes.fromhex(r["parent_span_id"]) if r["parent_span_id"] else b""
        attrs: dict[str, object] = {
            "gpu.kernel.name": r["name"] or "",
            "gpu.kernel.kind": r["kind"] or "",
            "gpu.device.id": r["device"] or "",
            "gpu.correlation.id": r["correlation_id"],
        }
        attrs.update({key: r[col] for key, col in OPTIONAL_ATTRIBUTES})
        links = []
        if r["launch_start_ns"] is not None:
            launch_id = lid.to_bytes(8, "little")
            links.append(
                trace_pb2.Span.Link(trace_id=trace, span_id=launch_id, attributes=key_values({"aaco.link": "launch"}))
            )
            launch_attrs = {
                "aaco.span.kind": "gpu.launch",
                "gpu.correlation.id": r["correlation_id"],
                "thread.id": r["tid"],
            }
            out.append(
                trace_pb2.Span(
                    trace_id=trace,
                    span_id=launch_id,
                    parent_span_id=parent,
                    name=r["launch_name"] or "launch",
                    kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
                    start_time_unix_nano=r["launch_start_ns"],
                    end_time_unix_nano=max(r["launch_end_ns"], r["launch_start_ns"]),
                    attributes=key_values(launch_attrs),
                )
            )
        out.append(
            trace_pb2.Span(
                trace_id=trace,
                span_id=sid.to_bytes(8, "little"),
                parent_span_id=parent,
                name=fam,
                kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
                start_time_unix_nano=r["start_ns"],
                end_time_unix_nano=r["end_ns"],
                attributes=key_values(attrs),
                links=links,
            )
        )
    return out
