"""OTLP/JSON for tests: a message written as the OTLP specification's JSON, the upstream examples, a rich request.

``to_json`` is protobuf's own JSON writer (``json_format.MessageToDict``) with the one change OTLP
makes, done here independently of the receiver's reader: trace and span ids as hex, not base64.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
from google.protobuf import json_format, text_format
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

DATA = Path(__file__).resolve().parents[1] / "data" / "otlp"
ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"})
INT_KEYS = frozenset({"intValue", "int_value"})


def _otlp(node: Any, numbers: bool) -> Any:
    """Ids from base64 to hex; with ``numbers``, 64-bit integers (times, int values) as JSON numbers."""
    if isinstance(node, list):
        return [_otlp(item, numbers) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k in ID_KEYS and isinstance(v, str):
            out[k] = base64.b64decode(v).hex()
        elif numbers and isinstance(v, str) and (k.lower().endswith(("unixnano", "unix_nano")) or k in INT_KEYS):
            out[k] = int(v)
        else:
            out[k] = _otlp(v, numbers)
    return out


def to_json(message: Any, *, snake_case: bool = False, enum_names: bool = False, int64_numbers: bool = False) -> bytes:
    """``message`` as an OTLP/JSON body: lowerCamelCase names, enums as integers, 64-bit integers as strings,
    hex ids; ``snake_case``, ``enum_names`` and ``int64_numbers`` write the other spellings OTLP readers take."""
    tree = json_format.MessageToDict(
        message, preserving_proto_field_name=snake_case, use_integers_for_enums=not enum_names
    )
    return orjson.dumps(_otlp(tree, int64_numbers))


def upstream_trace() -> tuple[bytes, trace_service_pb2.ExportTraceServiceRequest]:
    """opentelemetry-proto's ``examples/trace.json`` and the request its ``trace.protobuf-text`` describes."""
    text = (DATA / "trace.protobuf-text").read_text()
    return (DATA / "trace.json").read_bytes(), text_format.Parse(text, trace_service_pb2.ExportTraceServiceRequest())


def _kv(key: str, **value: Any) -> common_pb2.KeyValue:
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(**value))


def rich_request(tag: int = 1) -> trace_service_pb2.ExportTraceServiceRequest:
    """A vLLM request span (read into a ``requests`` row) and a child with every kind of field OTLP/JSON maps."""
    msg = trace_service_pb2.ExportTraceServiceRequest()
    rs = msg.resource_spans.add(schema_url="https://opentelemetry.io/schemas/1.26.0")
    rs.resource.attributes.extend([_kv("service.name", string_value="vllm"), _kv("process.pid", int_value=4242)])
    ss = rs.scope_spans.add()
    ss.scope.name, ss.scope.version = "vllm.tracing", "0.6.0"
    trace_id = bytes([0xA0 + tag]) + bytes(range(1, 16))
    llm = ss.spans.add(
        trace_id=trace_id,
        span_id=bytes([0xB0 + tag]) + bytes(range(1, 8)),
        name="llm_request",
        kind=trace_pb2.Span.SPAN_KIND_SERVER,
        start_time_unix_nano=1_790_000_000_000_000_000 + tag,
        end_time_unix_nano=1_790_000_001_050_000_000 + tag,
    )
    llm.attributes.extend(
        [
            _kv("gen_ai.response.model", string_value="llama-3-8b"),
            _kv("gen_ai.request.id", string_value=f"cmpl-{tag}"),
            _kv("gen_ai.usage.prompt_tokens", int_value=120),
            _kv("gen_ai.usage.completion_tokens", int_value=33),
            _kv("gen_ai.latency.time_to_first_token", double_value=0.21),
            _kv("gen_ai.latency.e2e", double_value=1.05),
        ]
    )
    child = ss.spans.add(
        trace_id=trace_id,
        span_id=bytes([0xC0 + tag]) + bytes(range(1, 8)),
        parent_span_id=llm.span_id,
        trace_state="vendor=1",
        flags=0x301,
        name="decode step",
        kind=trace_pb2.Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=1_790_000_000_300_000_000,
        end_time_unix_nano=2**63 + 5,  # past int64: a uint64 written as a decimal string
        dropped_attributes_count=2,
        status=trace_pb2.Status(code=trace_pb2.Status.STATUS_CODE_ERROR, message="out of blocks"),
    )
    nested = common_pb2.KeyValueList(values=[_kv("inner", array_value=common_pb2.ArrayValue(values=[]))])
    child.attributes.extend(
        [
            _kv("s", string_value='ü ✓ "quoted"'),
            _kv("b", bool_value=True),
            _kv("i", int_value=-(2**63)),
            _kv("d", double_value=-1.5e-300),
            _kv("raw", bytes_value=b"\x00\xff binary"),
            _kv("a", array_value=common_pb2.ArrayValue(values=[common_pb2.AnyValue(int_value=7)])),
            _kv("m", kvlist_value=nested),
            _kv("empty"),
        ]
    )
    child.events.add(time_unix_nano=1_790_000_000_400_000_000, name="preempted").attributes.append(
        _kv("why", string_value="memory")
    )
    child.links.add(trace_id=bytes(range(16, 32)), span_id=bytes(range(8, 16)), trace_state="k=v", flags=1)
    return msg
