"""Per-event OTLP histograms: iteration latency and LLM serving, each observation with its trace as exemplar.

The OTLP metrics exporter records into SDK histograms what arrives per event rather than per
snapshot: each iteration's latency (``aaco.iteration.duration``) and, for each request of a
``requests`` batch, the serving histograms under their GenAI names (``gen_ai.server.*``,
``aaco.llm.*``, values from ``contract.serving.request_series``) and its tokens
(``gen_ai.client.token.usage``, ``gen_ai.token.type`` = input | output). A View gives each its
bucket boundaries: the contract's for the serving histograms, the semantic conventions' advisory
ones for tokens.

Each observation is recorded in a context carrying its row's span (a sampled, remote
``NonRecordingSpan``), so the SDK's default trace-based exemplar filter keeps it and the
aligned-bucket reservoir holds the latest per bucket: the exported HistogramDataPoints carry
exemplars with the trace and span ids. A row without valid ids is recorded without exemplar.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import pyarrow as pa
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.metrics import Histogram, Meter
from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from aaco.contract.serving import HISTOGRAMS
from aaco.contract.signals import LATENCY_BUCKETS

LATENCY_METRIC: Final = "aaco.iteration.duration"
TOKEN_USAGE: Final = "gen_ai.client.token.usage"
SAMPLED: Final = TraceFlags(TraceFlags.SAMPLED)
# The semantic conventions' advisory boundaries for gen_ai.client.token.usage: 4**k, 1 .. 64 Mi.
TOKEN_BUCKETS: Final = tuple(float(4**k) for k in range(14))
# The request attributes by column; empty or missing values are left out.
REQUEST_ATTRIBUTES: Final = {"model": "gen_ai.response.model", "namespace": "k8s.namespace.name", "pod": "k8s.pod.name"}


def views() -> list[View]:
    """One View per histogram recorded here, with its bucket boundaries."""
    bounds = {
        LATENCY_METRIC: LATENCY_BUCKETS,
        TOKEN_USAGE: TOKEN_BUCKETS,
        **{m.otel_name: m.buckets for m in HISTOGRAMS.values()},
    }
    return [View(instrument_name=n, aggregation=ExplicitBucketHistogramAggregation(b)) for n, b in bounds.items()]


def span_context(trace_id: str | None, span_id: str | None) -> Context | None:
    """A context whose current span is the (sampled, remote) span of these hex ids; None where they are not valid."""
    if not trace_id or not span_id or len(trace_id) != 32 or len(span_id) != 16:
        return None
    try:
        ctx = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=SAMPLED)
    except ValueError:
        return None
    return trace.set_span_in_context(NonRecordingSpan(ctx)) if ctx.is_valid else None


def _column(b: pa.RecordBatch, name: str) -> list:
    return b.column(name).to_pylist() if name in b.schema.names else [None] * b.num_rows


class EventHistograms:
    """The SDK histograms fed per event, with exemplars (see the module docstring)."""

    def __init__(self, meter: Meter) -> None:
        self._latency = meter.create_histogram(
            LATENCY_METRIC, unit="s", description="Iteration (inference request, training step) latency."
        )
        self._serving: dict[str, Histogram] = {
            field: meter.create_histogram(m.otel_name, unit=m.unit, description=m.description)
            for field, m in HISTOGRAMS.items()
        }
        self._tokens = meter.create_histogram(
            TOKEN_USAGE, unit="{token}", description="Tokens per LLM request, by type (input, output)."
        )

    def iterations(self, b: pa.RecordBatch) -> None:
        """Record each iteration's latency, in its span's context."""
        cols = b.select(["start_ns", "end_ns", "model", "trace_id", "span_id"]).to_pydict()
        for start, end, model, tid, sid in zip(*cols.values(), strict=True):
            self._latency.record((end - start) / 1e9, {"aaco.model": model or "unknown"}, span_context(tid, sid))

    def requests(self, b: pa.RecordBatch, values: dict[str, np.ndarray]) -> None:
        """Record each request's serving values (``request_series``, NaN: not measured) and tokens."""
        attrs = [
            {REQUEST_ATTRIBUTES[k]: v for k, v in zip(REQUEST_ATTRIBUTES, row, strict=True) if v}
            for row in zip(*(_column(b, c) for c in REQUEST_ATTRIBUTES), strict=True)
        ]
        contexts = [span_context(t, s) for t, s in zip(_column(b, "trace_id"), _column(b, "span_id"), strict=True)]
        for field, hist in self._serving.items():
            v = values[field]
            for i in np.flatnonzero(~np.isnan(v)).tolist():
                hist.record(float(v[i]), attrs[i], contexts[i])
        for kind in ("input", "output"):
            for i, n in enumerate(_column(b, f"{kind}_tokens")):
                if n is not None:
                    self._tokens.record(int(n), {**attrs[i], "gen_ai.token.type": kind}, contexts[i])
