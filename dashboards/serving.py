"""LLM serving: per model TTFT, TPOT, tokens, requests, the SLO burn and the GPU work behind them.

The request panels read the agent's serving metrics (``aaco_llm_*``, from the servers' own request
spans: docs/serving.md); the SLO panels the records of ``rules/recording.yaml`` (group
``aaco.llm_slo``) that the burn-rate alerts of ``rules/alerts-serving.yaml`` compare; the GPU panels
the kernel and device series of the same nodes; the prefill/decode panels the kernel time that the
serving_phases analyzer splits by the requests' phases. Latency panels carry exemplars (one
request's trace each) and link to the traces of the model's requests.
"""

from __future__ import annotations

from typing import Final

from .lib import DEVICE, MODEL, NODE, RATE, Q, Spec, single_stat, trace_links, ts

UID: Final = "aaco-serving"
LLM: Final = 'model=~"$model", namespace=~"$namespace"'
KERNELS: Final = 'node=~"$node", model=~"$model"'
# The span attribute that names the model on vLLM's (and the GenAI conventions') request spans.
MODEL_ATTRIBUTE: Final = "gen_ai.response.model"
VARIABLES: Final = {
    "namespace": (
        "label_values(aaco_llm_requests_total, namespace)",
        "Kubernetes namespace of the serving pods (empty when the server's spans do not say).",
    ),
    "model": (
        'label_values(aaco_llm_requests_total{namespace=~"$namespace"}, model)',
        "The served model, as the request spans name it (gen_ai.response.model or gen_ai.request.model).",
    ),
}
BURN_BANDS: Final = (("green", None), ("orange", 6.0), ("red", 14.4))


def _quantiles(metric: str, what: str, qs: tuple[float, ...] = (0.5, 0.95, 0.99)) -> list[Q]:
    return [
        Q(
            f"histogram_quantile({q}, sum by (model, le) (rate({metric}_bucket{{{LLM}}}[{RATE}])))",
            f"{{{{model}}}} {what} p{round(q * 100)}",
            exemplar=True,
        )
        for q in qs
    ]


def spec(traces_plugin: str) -> Spec:
    """The dashboard's panels."""
    links = trace_links(traces_plugin, attribute=MODEL_ATTRIBUTE, service="")
    exemplars = "The dots are exemplars: one request each, with its trace ID; click one to open that trace."
    latency = [
        ts(
            "Time to first token p50 / p95 / p99",
            "Time from a request's arrival to its first output token (TTFT: queueing and prefill), per "
            f"model, from the servers' request spans. {exemplars}",
            "s",
            _quantiles("aaco_llm_time_to_first_token_seconds", "TTFT"),
            links=links,
            min_val=0,
        ),
        ts(
            "Time per output token p50 / p95 / p99",
            "Decode time per output token after the first (TPOT: (end-to-end - TTFT) / (output tokens - 1) "
            f"per request; one-token requests are left out and counted). {exemplars}",
            "s",
            _quantiles("aaco_llm_time_per_output_token_seconds", "TPOT"),
            links=links,
            min_val=0,
        ),
        ts(
            "Request duration p50 / p95 / p99",
            f"End-to-end time of each request, arrival to last token, per model. {exemplars}",
            "s",
            _quantiles("aaco_llm_request_duration_seconds", "e2e"),
            links=links,
            min_val=0,
        ),
        ts(
            "Queue time p50 / p95 / p99",
            "Time requests waited in the server's queue before being scheduled: rising with TTFT means the "
            f"server is saturated, not slower. {exemplars}",
            "s",
            _quantiles("aaco_llm_queue_time_seconds", "queue"),
            links=links,
            min_val=0,
        ),
        ts(
            "Prefill and decode time p95",
            "Time in the model's prefill (the prompt) and decode (the output tokens) per request, where the "
            f"server reports them: which phase a TTFT or duration change comes from. {exemplars}",
            "s",
            [
                *_quantiles("aaco_llm_prefill_seconds", "prefill", (0.95,)),
                *_quantiles("aaco_llm_decode_seconds", "decode", (0.95,)),
            ],
            links=links,
            min_val=0,
            width=24,
        ),
    ]
    slo = [
        ts(
            "SLO error ratio (1h)",
            "Share of each model's requests over its TTFT and TPOT thresholds in the last hour "
            "(model:aaco_llm_*_slo_errors:ratio_rate1h), beside the error budget the objective allows "
            "(dashboards/rules/recording.yaml, group aaco.llm_slo).",
            "percentunit",
            [
                Q(f"model:aaco_llm_ttft_slo_errors:ratio_rate1h{{{MODEL}}}", "{{model}} TTFT errors"),
                Q(f"model:aaco_llm_tpot_slo_errors:ratio_rate1h{{{MODEL}}}", "{{model}} TPOT errors"),
                Q(f"model:aaco_llm_ttft_slo_error_budget:ratio{{{MODEL}}}", "{{model}} TTFT budget"),
                Q(f"model:aaco_llm_tpot_slo_error_budget:ratio{{{MODEL}}}", "{{model}} TPOT budget"),
            ],
            min_val=0,
            width=10,
        ),
        ts(
            "Error budget burn rate",
            "Error ratio over the error budget, over 1 hour and 6 hours: 1 spends the budget exactly in the "
            "SLO period; 14.4 over 1h (and 5m) pages (AacoLlm*BudgetBurnFast), 6 over 6h (and 30m) opens a "
            "ticket (AacoLlm*BudgetBurnSlow).",
            "short",
            [
                Q(
                    f"model:aaco_llm_{sli}_slo_errors:ratio_rate{w}{{{MODEL}}} / on (model) "
                    f"model:aaco_llm_{sli}_slo_error_budget:ratio",
                    f"{{{{model}}}} {sli.upper()} {w}",
                )
                for sli in ("ttft", "tpot")
                for w in ("1h", "6h")
            ],
            steps=BURN_BANDS,
            min_val=0,
            width=10,
        ),
        single_stat(
            "Requests within objective (1h)",
            "Share of each model's requests within their TTFT threshold over the last hour, coloured "
            "against the default objective (95 %).",
            "percentunit",
            [Q(f"1 - model:aaco_llm_ttft_slo_errors:ratio_rate1h{{{MODEL}}}", "{{model}}")],
            steps=(("red", None), ("orange", 0.9), ("green", 0.95)),
            width=4,
            height=8,
        ),
    ]
    traffic = [
        ts(
            "Tokens per second (input / output)",
            "Prompt (input) and generated (output) tokens per second per model, from the request spans' usage "
            "counts (aaco_llm_tokens_total).",
            "short",
            [
                Q(
                    f"sum by (model, type) (rate(aaco_llm_tokens_total{{{LLM}}}[{RATE}]))",
                    "{{model}} {{type}}",
                )
            ],
            min_val=0,
        ),
        ts(
            "Requests by finish reason",
            "Requests finished per second, by model and finish reason (stop, length, abort, ...): a rise of "
            "length or abort shows truncation or cancelled requests.",
            "reqps",
            [
                Q(
                    f"sum by (model, finish_reason) (rate(aaco_llm_requests_total{{{LLM}}}[{RATE}]))",
                    "{{model}} {{finish_reason}}",
                )
            ],
            stack=True,
            min_val=0,
        ),
        ts(
            "Output tokens per request",
            "Mean output tokens per finished request: longer answers lengthen request duration without any "
            "change in TPOT.",
            "short",
            [
                Q(
                    f'sum by (model) (rate(aaco_llm_tokens_total{{{LLM}, type="output"}}[{RATE}])) '
                    f"/ sum by (model) (rate(aaco_llm_requests_total{{{LLM}}}[{RATE}]))",
                    "{{model}}",
                )
            ],
            min_val=0,
        ),
        ts(
            "Requests left out",
            "Requests the agent counted but left out of a histogram, by reason (one output token: no TPOT; a "
            "missing or invalid latency attribute).",
            "reqps",
            [
                Q(
                    f"sum by (model, reason) (rate(aaco_llm_requests_skipped_total{{{LLM}}}[{RATE}]))",
                    "{{model}} {{reason}}",
                )
            ],
            min_val=0,
            no_value="none left out",
        ),
    ]
    gpu = [
        ts(
            "GPU time by kernel family",
            "GPU seconds per second in each kernel family (GEMM, attention, normalisation, elementwise, "
            "copies, ...) of the selected models' iterations: the kernels that served the requests above.",
            "short",
            [
                Q(
                    f"sum by (model, family) (rate(aaco_kernel_family_seconds_total{{{KERNELS}}}[{RATE}]))",
                    "{{model}} {{family}}",
                )
            ],
            stack=True,
            min_val=0,
        ),
        ts(
            "Output tokens per GPU second",
            "Output tokens generated per second of GPU kernel time of the model: the serving efficiency of "
            "the kernels (falls when kernels slow down or batches shrink).",
            "short",
            [
                Q(
                    f'sum by (model) (rate(aaco_llm_tokens_total{{{LLM}, type="output"}}[{RATE}])) '
                    f"/ on (model) sum by (model) (rate(aaco_kernel_family_seconds_total{{{KERNELS}}}[{RATE}]))",
                    "{{model}}",
                )
            ],
            min_val=0,
        ),
        ts(
            "Device active ratio per node",
            "Share of the latest capture window in which each device ran any kernel, copy or memset: low "
            "while queue time rises means the server, not the GPU, holds requests back.",
            "percentunit",
            [Q(f"aaco_device_active_ratio{{{DEVICE}}}", "{{node}} device {{gpu}}")],
            min_val=0,
            max_val=1,
        ),
        ts(
            "GPU utilisation per pod",
            "Busy share of the GPUs allocated to each serving pod (the vendor's utilisation counter, averaged "
            "over the pod's GPUs).",
            "percentunit",
            [
                Q(
                    f'avg by (namespace, pod) (aaco_gpu_utilization_ratio{{{NODE}, namespace=~"$namespace"}})',
                    "{{namespace}}/{{pod}}",
                )
            ],
            min_val=0,
            max_val=1,
        ),
    ]
    phases = [
        ts(
            "GPU time in prefill vs decode",
            "Share of each model's kernel time launched during its requests' prefill (the prompt) rather than "
            "decode (the output tokens), from the servers' prefill and decode latencies (aaco_llm_gpu_seconds_total; "
            "a kernel in both counts as prefill, docs/serving.md). A TTFT rise with a rising share points at the "
            "prefill kernels.",
            "percentunit",
            [
                Q(
                    f'sum by (model) (rate(aaco_llm_gpu_seconds_total{{{LLM}, phase="prefill"}}[{RATE}])) '
                    f"/ sum by (model) (rate(aaco_llm_gpu_seconds_total{{{LLM}}}[{RATE}]))",
                    "{{model}} prefill share",
                )
            ],
            min_val=0,
            max_val=1,
        ),
        ts(
            "Kernel families by phase",
            "GPU seconds per second in each kernel family (GEMM, attention, ...) of each model's prefill and "
            "decode kernels: which kernels a prefill or decode slowdown comes from.",
            "short",
            [
                Q(
                    f"sum by (model, phase, family) (rate(aaco_llm_kernel_family_seconds_total{{{LLM}}}[{RATE}]))",
                    "{{model}} {{phase}} {{family}}",
                )
            ],
            stack=True,
            min_val=0,
        ),
    ]
    return Spec(
        uid=UID,
        title="AACO / LLM serving",
        description="Per served model: time to first token and per output token with trace exemplars, request "
        "duration, queue time, prefill and decode, tokens and requests, the SLO burn, and the GPU kernels behind them.",
        tags=("serving",),
        variable_sources=VARIABLES,
        rows=[
            ("Latency", latency),
            ("SLO", slo),
            ("Traffic", traffic),
            ("The GPU work behind them", gpu),
            ("Prefill versus decode on the GPU", phases),
        ],
    )
