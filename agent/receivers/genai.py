"""LLM request spans read from received traces into rows of the ``requests`` kind (docs/serving.md).

A span is a request span when it is of kind SERVER, names a model (``contract/genai.py``, either
naming) and carries at least one token count or latency. Its resource says where the server runs
(``k8s.namespace.name``, ``k8s.pod.name``, ``service.name``, ``process.pid``): the receiver reads it
before adding the node's own attributes, so a server that does not say is never given the agent's pod.
A value of the wrong type, negative or not finite is counted by field and left null; the rest of the
row is kept. The request itself is only read, never changed.
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
_NUMERIC_KEYS: Final = frozenset(a for names in (*TOKEN_ATTRS.values(), *LATENCY_ATTRS.values()) for a in names)


def _first(attrs: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        value = attrs.get(name)
        if value is not None:
            return value
    return None


def _text(value: Any) -> str | None:
    if value is None:
        return None
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return value.string_value or None
    if kind == "array_value":  # gen_ai.response.finish_reasons: the first sequence's reason
        first = next(iter(value.array_value.values), None)
        return _text(first)
    return None


def _count(value: Any) -> int | None:
    """A non-negative integer (a float with an integral value is accepted), else None."""
    kind = value.WhichOneof("value")
    if kind == "int_value":
        return value.int_value if value.int_value >= 0 else None
    if kind == "double_value":
        v = value.double_value
        return int(v) if math.isfinite(v) and v >= 0 and v == int(v) else None
    return None


def _seconds(value: Any) -> float | None:
    """A non-negative finite number of seconds, else None."""
    kind = value.WhichOneof("value")
    if kind == "double_value":
        v = value.double_value
    elif kind == "int_value":
        v = float(value.int_value)
    else:
        return None
    return v if math.isfinite(v) and v >= 0 else None


class RequestRows:
    """Reads request spans out of ``ExportTraceServiceRequest``s, counting invalid values in ``stats``."""

    def __init__(self, node: str, stats: Stats) -> None:
        self.node = node
        self.stats = stats

    def read(self, msg: Any) -> pa.RecordBatch | None:
        """The request spans of ``msg`` as a ``requests`` batch (full schema), or None when it has none."""
        cols: dict[str, list[Any]] = {name: [] for name in REQUESTS.names}
        for rs in msg.resource_spans:
            resource: dict[str, Any] | None = None
            for ss in rs.scope_spans:
                for span in ss.spans:
                    if span.kind != SPAN_KIND_SERVER:
                        continue
                    attrs = {kv.key: kv.value for kv in span.attributes if kv.key.startswith("gen_ai.")}
                    model = _text(_first(attrs, MODEL_ATTRS))
                    if model is None or _NUMERIC_KEYS.isdisjoint(attrs):
                        continue
                    if resource is None:
                        resource = self._resource(rs.resource)
                    self._row(cols, span, attrs, model, resource)
        if not cols["model"]:
            return None
        return pa.RecordBatch.from_pydict(cols, schema=REQUESTS)

    def _resource(self, res: Any) -> dict[str, Any]:
        attrs = {kv.key: kv.value for kv in res.attributes}
        out: dict[str, Any] = {field: _text(attrs.get(key)) for field, key in RESOURCE_ATTRS.items() if field != "pid"}
        pid = attrs.get(RESOURCE_ATTRS["pid"])
        out["pid"] = None if pid is None else self._valid("pid", pid, _count)
        return out

    def _valid(self, field: str, value: Any, parse: Any) -> Any:
        parsed = parse(value)
        if parsed is None:
            self.stats.inc(REQUEST_VALUES_INVALID, 1, field=field)
        return parsed

    def _row(
        self, cols: dict[str, list[Any]], span: Any, attrs: dict[str, Any], model: str, resource: dict[str, Any]
    ) -> None:
        if span.start_time_unix_nano > _I64_MAX or span.end_time_unix_nano > _I64_MAX:
            self.stats.inc(REQUEST_VALUES_INVALID, 1, field="time")
            return
        row: dict[str, Any] = {
            "start_ns": span.start_time_unix_nano,
            "end_ns": max(span.end_time_unix_nano, span.start_time_unix_nano),
            "node": self.node,
            "model": model,
            "trace_id": span.trace_id.hex(),
            "span_id": span.span_id.hex(),
            "source": SOURCE,
            "request_id": _text(_first(attrs, REQUEST_ID_ATTRS)),
            "finish_reason": _text(_first(attrs, FINISH_REASON_ATTRS)),
            **resource,
        }
        for field, names in TOKEN_ATTRS.items():
            value = _first(attrs, names)
            row[field] = None if value is None else self._valid(field, value, _count)
        for field, names in LATENCY_ATTRS.items():
            value = _first(attrs, names)
            row[field] = None if value is None else self._valid(field, value, _seconds)
        for name, values in cols.items():
            values.append(row.get(name))
