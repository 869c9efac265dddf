"""LLM serving metrics: definitions and bucket boundaries, defined once (derivations in docs/serving.md).

Every series is per (model, namespace, pod) of the server that reported the request (empty strings
where the server's resource does not say). Histograms take one observation per request; their bucket
boundaries suit what each one measures and include the usual SLO objectives, so an objective is a
bucket edge and its SLI is read from ``_bucket`` without interpolation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa

from aaco.contract.signals import define

LABELS: Final = ("model", "namespace", "pod")

# Time to first token: 5 ms (a cached prompt on a small model) .. 60 s (a long prompt behind a queue).
TTFT_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0,
)  # fmt: skip
# Time per output token: 1 ms (small models, speculative decoding) .. 2 s (a starved batch).
TPOT_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04,
    0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.0,
)  # fmt: skip
# Whole requests and their decode phase: 10 ms .. 10 min (long generations).
DURATION_BUCKETS: Final = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    15.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip
# Queue time and prefill: 1 ms .. 60 s.
PHASE_BUCKETS: Final = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

TTFT: Final = define(
    "gen_ai.server.time_to_first_token",
    "aaco_llm_time_to_first_token_seconds",
    "histogram",
    "s",
    "Time to first token of LLM requests, as the server reported it (gen_ai.latency.time_to_first_token).",
    LABELS,
    TTFT_BUCKETS,
)
TPOT: Final = define(
    "gen_ai.server.time_per_output_token",
    "aaco_llm_time_per_output_token_seconds",
    "histogram",
    "s",
    "Time per output token after the first, per request: (e2e - TTFT) / (output tokens - 1); requests with "
    "fewer than two output tokens or without both latencies are counted in aaco_llm_requests_skipped_total.",
    LABELS,
    TPOT_BUCKETS,
)
REQUEST_DURATION: Final = define(
    "gen_ai.server.request.duration",
    "aaco_llm_request_duration_seconds",
    "histogram",
    "s",
    "End-to-end duration of LLM requests (gen_ai.latency.e2e, else the span's duration).",
    LABELS,
    DURATION_BUCKETS,
)
QUEUE_TIME: Final = define(
    "aaco.llm.queue_time",
    "aaco_llm_queue_time_seconds",
    "histogram",
    "s",
    "Time LLM requests waited in the server's queue before being scheduled (gen_ai.latency.time_in_queue).",
    LABELS,
    PHASE_BUCKETS,
)
PREFILL: Final = define(
    "aaco.llm.prefill.duration",
    "aaco_llm_prefill_seconds",
    "histogram",
    "s",
    "Time LLM requests spent in the model's prefill, where the server reports it "
    "(gen_ai.latency.time_in_model_prefill).",
    LABELS,
    PHASE_BUCKETS,
)
DECODE: Final = define(
    "aaco.llm.decode.duration",
    "aaco_llm_decode_seconds",
    "histogram",
    "s",
    "Time LLM requests spent in the model's decode, where the server reports it (gen_ai.latency.time_in_model_decode).",
    LABELS,
    DURATION_BUCKETS,
)
TOKEN_COUNT: Final = define(
    "aaco.llm.tokens",
    "aaco_llm_tokens",
    "counter",
    "{token}",
    "Tokens of LLM requests by type: input (prompt) and output (completion).",
    (*LABELS, "type"),
)
REQUEST_COUNT: Final = define(
    "aaco.llm.requests",
    "aaco_llm_requests",
    "counter",
    "{request}",
    "LLM requests by finish reason (gen_ai.response.finish_reasons, the first; unknown when not reported).",
    (*LABELS, "finish_reason"),
)
REQUESTS_SKIPPED: Final = define(
    "aaco.llm.requests.skipped",
    "aaco_llm_requests_skipped",
    "counter",
    "{request}",
    "LLM requests left out of a histogram, by reason: tpot_one_token (fewer than two output tokens), "
    "tpot_no_tokens, tpot_no_latency (no e2e or no TTFT), tpot_negative (e2e before TTFT); series_limit "
    "(a (model, namespace, pod) past the bound, all histograms; counted with empty labels).",
    (*LABELS, "reason"),
)

HISTOGRAMS: Final = {
    "ttft_s": TTFT,
    "tpot_s": TPOT,
    "duration_s": REQUEST_DURATION,
    "queue_s": QUEUE_TIME,
    "prefill_s": PREFILL,
    "decode_s": DECODE,
}


@dataclass(frozen=True)
class RequestSeries:
    """Per-request values of a ``requests`` batch: each histogram's field (NaN where not measured)."""

    values: dict[str, np.ndarray]  # by HISTOGRAMS field, float64 seconds, one per row
    reasons: dict[str, np.ndarray]  # why TPOT was left out: a boolean mask per reason, one per row

    @property
    def skipped(self) -> dict[str, int]:
        """Requests left out of the TPOT histogram, by reason (reasons with none left out)."""
        return {r: int(m.sum()) for r, m in self.reasons.items() if m.any()}


def _floats(b: pa.RecordBatch, name: str) -> np.ndarray:
    return b.column(name).to_numpy(zero_copy_only=False).astype(np.float64)  # nulls -> NaN


def request_series(b: pa.RecordBatch) -> RequestSeries:
    """The histograms' observations of each request row: TPOT is ``(e2e - ttft) / (output_tokens - 1)``.

    The duration is ``e2e_s``, else the span's own duration. TPOT is NaN where it cannot be computed,
    counted by reason: ``tpot_no_tokens``, ``tpot_no_latency``, ``tpot_one_token``, ``tpot_negative``.
    """
    ttft, e2e = _floats(b, "ttft_s"), _floats(b, "e2e_s")
    out = _floats(b, "output_tokens")
    span_s = (b.column("end_ns").to_numpy() - b.column("start_ns").to_numpy()) / 1e9
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = (e2e - ttft) / (out - 1)
    no_tokens = np.isnan(out)
    no_latency = ~no_tokens & (np.isnan(e2e) | np.isnan(ttft))
    one_token = ~no_tokens & ~no_latency & (out <= 1)
    negative = ~no_tokens & ~no_latency & ~one_token & (e2e < ttft)
    reasons = {
        "tpot_no_tokens": no_tokens,
        "tpot_no_latency": no_latency,
        "tpot_one_token": one_token,
        "tpot_negative": negative,
    }
    ok = ~(no_tokens | no_latency | one_token | negative)
    values = {
        "ttft_s": ttft,
        "tpot_s": np.where(ok, tpot, np.nan),
        "duration_s": np.where(np.isnan(e2e), span_s, e2e),
        "queue_s": _floats(b, "queue_s"),
        "prefill_s": _floats(b, "prefill_s"),
        "decode_s": _floats(b, "decode_s"),
    }
    return RequestSeries(values, reasons)
