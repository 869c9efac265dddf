"""OTLP metrics: the LLM serving histograms under GenAI names and iteration latency, with exemplars per bucket."""

from __future__ import annotations

import numpy as np
import pytest
from opentelemetry.sdk.metrics.export import HistogramDataPoint, MetricExporter, MetricExportResult, MetricsData

from aaco.contract.schemas import EventBatch, conform
from aaco.contract.serving import TTFT_BUCKETS, request_series
from aaco.contract.stats import Stats
from aaco.exporters.otlp_histograms import TOKEN_BUCKETS, span_context
from aaco.exporters.otlp_metrics import OtlpMetricsExporter
from aaco.exporters.otlp_settings import OtlpConfig

from .builders import item, iterations


class Capture(MetricExporter):
    """Keeps what the reader exports."""

    def __init__(self) -> None:
        super().__init__()
        self.data: list[MetricsData] = []

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        self.data.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        pass


def exported(batches: list[EventBatch]) -> dict[str, list[HistogramDataPoint]]:
    """Histogram points by metric name after feeding ``batches`` and flushing once."""
    capture = Capture()
    exp = OtlpMetricsExporter(OtlpConfig(endpoint="http://127.0.0.1:1"), Stats(), "n1", {}, 3600, capture)
    exp.start()
    for b in batches:
        exp.export(b)
    assert exp.force_flush(10)
    exp.shutdown(5)
    out: dict[str, list[HistogramDataPoint]] = {}
    for rm in capture.data[0].resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if isinstance(m.data.data_points[0], HistogramDataPoint):
                    out.setdefault(m.name, []).extend(m.data.data_points)  # type: ignore[arg-type]
    return out


def trace(i: int) -> str:
    return f"{i + 1:032x}"


def span(i: int) -> str:
    return f"{i + 0xA0:016x}"


def requests() -> list[dict]:
    """Two pods of one model; TTFTs in three buckets; a one-token request; bad and absent ids; a row without model."""
    ttfts = [0.004, 0.04, 0.045, 0.9, 0.02, 0.3, 0.2]
    out = []
    for i, ttft in enumerate(ttfts):
        out.append(
            {
                "start_ns": 0,
                "end_ns": 2_000_000_000,
                "node": "n1",
                "model": "llama",
                "namespace": "serving",
                "pod": f"p{i % 2}",
                "trace_id": trace(i),
                "span_id": span(i),
                "source": "otlp",
                "ttft_s": ttft,
                "e2e_s": ttft + 1.0,
                "queue_s": 0.001 * i,
                "input_tokens": 100 * (i + 1),
                "output_tokens": 1 if i == 3 else 11,
            }
        )
    out[4]["trace_id"] = "zz" * 16  # not hex: no exemplar, no error
    out[5]["span_id"] = None
    out[6].update(model="", pod="")
    return out


def batch(rows: list[dict]) -> EventBatch:
    return EventBatch("requests", conform("requests", {k: [r[k] for r in rows] for k in rows[0]}), "otlp")


def test_serving_histograms_equal_the_rows_and_carry_their_traces():
    rows = requests()
    b = batch(rows)
    points = exported([b])
    values = request_series(b.batch).values
    ttft = {tuple(sorted(p.attributes.items())): p for p in points["gen_ai.server.time_to_first_token"]}
    for pod in ("p0", "p1"):
        idx = [i for i, r in enumerate(rows) if r["pod"] == pod and r["model"]]
        key = (("gen_ai.response.model", "llama"), ("k8s.namespace.name", "serving"), ("k8s.pod.name", pod))
        p = ttft[key]
        v = values["ttft_s"][idx]
        assert p.count == len(idx) and p.sum == pytest.approx(v.sum())
        assert tuple(p.explicit_bounds) == TTFT_BUCKETS
        slots = np.searchsorted(TTFT_BUCKETS, v, side="left")
        assert list(p.bucket_counts) == np.bincount(slots, minlength=len(TTFT_BUCKETS) + 1).tolist()
        valid = {trace(i): span(i) for i in idx if i not in (4, 5)}
        got = {f"{e.trace_id:032x}": f"{e.span_id:016x}" for e in p.exemplars}
        assert got == valid  # one per bucket: here every valid row is alone in its bucket
    (bare,) = [p for k, p in ttft.items() if dict(k).get("gen_ai.response.model") is None]
    assert bare.attributes == {"k8s.namespace.name": "serving"} and bare.count == 1
    tpot = points["gen_ai.server.time_per_output_token"]
    assert sum(p.count for p in tpot) == len(rows) - 1  # the one-token request is left out
    assert sum(p.sum for p in tpot) == pytest.approx(np.nansum(values["tpot_s"]))
    for name, field in (("gen_ai.server.request.duration", "duration_s"), ("aaco.llm.queue_time", "queue_s")):
        assert sum(p.count for p in points[name]) == len(rows), name
        assert sum(p.sum for p in points[name]) == pytest.approx(values[field].sum()), name
    assert "aaco.llm.prefill.duration" not in points  # nothing measured, nothing recorded


def test_token_usage_per_type_with_the_semconv_buckets():
    rows = requests()
    tokens = exported([batch(rows)])["gen_ai.client.token.usage"]
    for kind in ("input", "output"):
        mine = [p for p in tokens if p.attributes["gen_ai.token.type"] == kind]
        assert sum(p.count for p in mine) == len(rows)
        assert sum(p.sum for p in mine) == sum(r[f"{kind}_tokens"] for r in rows)
        assert all(tuple(p.explicit_bounds) == TOKEN_BUCKETS for p in mine)
    assert TOKEN_BUCKETS[0] == 1 and TOKEN_BUCKETS[-1] == 67108864 and len(TOKEN_BUCKETS) == 14


def test_iteration_latency_exemplars_are_the_iterations_spans():
    b = iterations([(0, 1_000_000), (0, 20_000_000)])
    (p,) = exported([item("iterations", b)])["aaco.iteration.duration"]
    assert p.count == 2
    sent = set(zip(b.column("trace_id").to_pylist(), b.column("span_id").to_pylist(), strict=True))
    assert {(f"{e.trace_id:032x}", f"{e.span_id:016x}") for e in p.exemplars} == sent


@pytest.mark.parametrize(
    ("trace_id", "span_id"),
    [(None, "00f067aa0ba902b7"), ("4bf92f3577b34da6a3ce929d0e0e4736", ""), ("0" * 32, "00f067aa0ba902b7"), ("x", "y")],
)
def test_no_context_without_valid_ids(trace_id, span_id):
    assert span_context(trace_id, span_id) is None
