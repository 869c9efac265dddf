"""The span attributes LLM servers put on their request spans, in both namings (docs/serving.md).

vLLM (and TensorRT-LLM with the same names) emits one ``llm_request`` span of kind SERVER per request;
the OpenTelemetry GenAI semantic conventions name some of the same things differently. Each field of
a ``requests`` row (``schemas.REQUESTS``) is read from the first of its attribute names that the span
carries. Latencies are seconds, token counts integers.
"""

from __future__ import annotations

from typing import Final

REQUEST_SPAN_NAME: Final = "llm_request"  # vLLM's span name (any SERVER span with the attributes is read)

# Row field -> span attribute names, the first present wins.
MODEL_ATTRS: Final = ("gen_ai.response.model", "gen_ai.request.model")
REQUEST_ID_ATTRS: Final = ("gen_ai.request.id", "gen_ai.response.id")
FINISH_REASON_ATTRS: Final = ("gen_ai.response.finish_reasons", "gen_ai.response.finish_reason")

TOKEN_ATTRS: Final[dict[str, tuple[str, ...]]] = {
    "input_tokens": ("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens"),
    "output_tokens": ("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens"),
}
LATENCY_ATTRS: Final[dict[str, tuple[str, ...]]] = {
    "queue_s": ("gen_ai.latency.time_in_queue",),
    "ttft_s": ("gen_ai.latency.time_to_first_token",),
    "e2e_s": ("gen_ai.latency.e2e",),
    "prefill_s": ("gen_ai.latency.time_in_model_prefill",),
    "decode_s": ("gen_ai.latency.time_in_model_decode",),
    "inference_s": ("gen_ai.latency.time_in_model_inference",),
}

# Resource attributes (OpenTelemetry semantic conventions) naming where the server runs.
RESOURCE_ATTRS: Final[dict[str, str]] = {
    "namespace": "k8s.namespace.name",
    "pod": "k8s.pod.name",
    "service": "service.name",
    "pid": "process.pid",
}
