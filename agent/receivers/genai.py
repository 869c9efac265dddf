"""LLM request spans read from received traces into rows of the ``requests`` kind (docs/serving.md).

A span is a request span when it is of kind SERVER, names a model (``contract/genai.py``, either
naming) and carries at least one token count or latency. Its resource says where the server runs
(``k8s.namespace.name``, ``k8s.pod.name``, ``service.name``, ``process.pid``): the receiver reads it
before adding the node's own attributes, so a server that does not say is never given the agent's pod.
A value of the wrong type, negative or not finite is counted by field and left null; the rest of the
row is kept. The request itself is only read, never changed. Only SERVER spans are scanned, each
attribute's key is looked up once among the names read, and the rows become arrays once per request
(the cost per span: docs/llm-demo.md).
"""

from __future__ import annotations

import math
from typing import Any, Final

import pyarrow as pa

from aaco.contract.genai import (
    FINISH_REASON_ATTRS,
    LATENCY_ATTRS,
    MODEL_ATTRS,
    REQUEST_ID_ATTRS,
    RESOURCE_ATTRS,
    TOKEN_ATTRS,
)
from aaco.contract.schemas import REQUESTS
from aaco.contract.signals import define
from aaco.contract.stats import Stats

REQUEST_VALUES_INVALID = define(
    "aaco.receiver.request_spans.invalid_values",
    "aaco_receiver_request_span_invalid_values",
    "counter",
    "{value}",
    "Values of LLM request span attributes left out of the requests rows because they were of the wrong type, "
    "negative or not finite, by field (input_tokens, output_tokens, queue_s, ttft_s, e2e_s, prefill_s, decode_s, "
    "inference_s, pid; time: a span time past int64, its row left out).",
    ("field",),
)

SPAN_KIND_SERVER: Final = 2  # opentelemetry.proto.trace.v1.Span.SpanKind.SPAN_KIND_SERVER
SOURCE: Final = "otlp"
_I64_MAX: Final = 2**63 - 1
_NUMBERS: Final = (
    *((field, names, True) for field, names in TOKEN_ATTRS.items()),
    *((field, names, False) for field, names in LATENCY_ATTRS.items()),
)
_NUMERIC_KEYS: Final = frozenset(a for _field, names, _integral in _NUMBERS for a in names)
# Attribute read -> the AnyValue field it usually sets ("": an array, read element-wise).
_KEYS: Final[dict[str, str]] = {
    **{a: "string_value" for a in (*MODEL_ATTRS, *REQUEST_ID_ATTRS)},
    **{a: "" for a in FINISH_REASON_ATTRS},
    **{a: "int_value" if integral else "double_value" for _field, names, integral in _NUMBERS for a in names},
}
# The order rows are built in: fixed columns, request id, resource, numbers, finish reason.
_ORDER: Final = (
    "start_ns",
    "end_ns",
    "node",
    "model",
    "trace_id",
    "span_id",
    "source",
    "request_id",
    "namespace",
    "pod",
    "service",
    "pid",
    *(field for field, _names, _integral in _NUMBERS),
    "finish_reason",
)


def _scalar(value: Any) -> Any:
    """An AnyValue as a Python value: an array as its first element (finish reasons: the first sequence's)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        values = value.array_value.values
        return _scalar(values[0]) if values else None
    return getattr(value, kind)


def _first(attrs: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        if name in attrs:
            return attrs[name]
    return None


def _text(value: Any) -> str | None:
    return value if type(value) is str and value else None


def _count(value: Any) -> int | None:
    """A non-negative integer (a float with an integral value is accepted), else None (bools too)."""
    if type(value) is int:
        return value if value >= 0 else None
    if type(value) is float:
        return int(value) if math.isfinite(value) and value >= 0 and value == int(value) else None
    return None


def _seconds(value: Any) -> float | None:
    """A non-negative finite number of seconds, else None (bools too)."""
    if type(value) is float or type(value) is int:
        v = float(value)
        return v if math.isfinite(v) and v >= 0 else None
    return None


class RequestRows:
    """Reads request spans out of ``ExportTraceServiceRequest``s, counting invalid values in ``stats``."""

    def __init__(self, node: str, stats: Stats) -> None:
        self.node = node
        self.stats = stats

    def read(self, msg: Any) -> pa.RecordBatch | None:
        """The request spans of ``msg`` as a ``requests`` batch (full schema), or None when it has none."""
        rows: list[list[Any]] = []
        for rs in msg.resource_spans:
            resource: list[Any] | None = None
            for ss in rs.scope_spans:
                for span in ss.spans:
                    if span.kind != SPAN_KIND_SERVER:
                        continue
                    attrs = {}
                    for kv in span.attributes:
                        key = kv.key
                        expected = _KEYS.get(key)
                        if expected is not None:
                            # The field the attribute usually sets: read directly when set (not zero),
                            # else by which one is set.
                            value = kv.value
                            attrs[key] = (expected and getattr(value, expected)) or _scalar(value)
                    if not attrs or _NUMERIC_KEYS.isdisjoint(attrs):
                        continue
                    model = _text(_first(attrs, MODEL_ATTRS))
                    if model is None:
                        continue
                    if resource is None:
                        resource = self._resource(rs.resource)
                    row = self._row(span, attrs, model, resource)
                    if row is not None:
                        rows.append(row)
        if not rows:
            return None
        columns = dict(zip(_ORDER, zip(*rows, strict=True), strict=True))
        nulls = [None] * len(rows)  # columns a span does not give (a distributed job's rank)
        arrays = [pa.array(columns.get(f.name, nulls), type=f.type) for f in REQUESTS]
        return pa.RecordBatch.from_arrays(arrays, schema=REQUESTS)

    def _resource(self, res: Any) -> list[Any]:
        """namespace, pod, service and pid, in the row's order."""
        attrs = {kv.key: _scalar(kv.value) for kv in res.attributes}
        out: list[Any] = [_text(attrs.get(RESOURCE_ATTRS[f])) for f in ("namespace", "pod", "service")]
        pid = attrs.get(RESOURCE_ATTRS["pid"])
        out.append(None if pid is None else self._valid("pid", pid, _count))
        return out

    def _valid(self, field: str, value: Any, parse: Any) -> Any:
        parsed = parse(value)
        if parsed is None:
            self.stats.inc(REQUEST_VALUES_INVALID, 1, field=field)
        return parsed

    def _row(self, span: Any, attrs: dict[str, Any], model: str, resource: list[Any]) -> list[Any] | None:
        start, end = span.start_time_unix_nano, span.end_time_unix_nano
        if start > _I64_MAX or end > _I64_MAX:
            self.stats.inc(REQUEST_VALUES_INVALID, 1, field="time")
            return None
        row = [
            start,
            max(end, start),
            self.node,
            model,
            span.trace_id.hex(),
            span.span_id.hex(),
            SOURCE,
            _text(_first(attrs, REQUEST_ID_ATTRS)),
            *resource,
        ]
        for field, names, integral in _NUMBERS:
            for name in names:
                if name in attrs:
                    parsed = (_count if integral else _seconds)(attrs[name])
                    if parsed is None:
                        self.stats.inc(REQUEST_VALUES_INVALID, 1, field=field)
                    row.append(parsed)
                    break
            else:
                row.append(None)
        row.append(_text(_first(attrs, FINISH_REASON_ATTRS)))
        return row
