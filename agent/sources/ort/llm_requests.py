"""LLM-shaped requests served by an ONNX model: the token rule, the serving loop and vLLM's span attributes.

A request is a prefill (one run of the model, which yields the first output token) then a decode of
``output_tokens - 1`` runs (one token each), served one request at a time in arrival order, as a
single-sequence server does. The token counts are not computed by the model (the demo graph is an
image classifier); they come from a seeded rule (``plan_requests``, docs/llm-demo.md), so a cycle's
requests are the same for the same seed. The times are measured around the runs themselves: a
request's queue time is how long it waited for the requests before it, its TTFT ends when its
prefill run returns. The attributes are those vLLM puts on its ``llm_request`` span (seconds as
floats), plus the OpenTelemetry GenAI names of the same values.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestPlan:
    """One request as the rule draws it: when it arrives, its prompt and how many tokens it gets."""

    request_id: str
    arrival_offset_s: float  # after the cycle's first arrival
    input_tokens: int
    max_tokens: int
    output_tokens: int  # 1 (the prefill's token) + decode runs
    finish_reason: str  # "length" when the drawn answer reached max_tokens, else "stop"

    @property
    def decode_runs(self) -> int:
        """Model runs after the prefill: one per output token after the first."""
        return self.output_tokens - 1


@dataclass(frozen=True)
class RequestTiming:
    """The wall-clock instants (Unix ns) of one served request, as vLLM records them."""

    arrival_ns: int
    scheduled_ns: int  # its prefill run starts
    first_token_ns: int  # its prefill run returned
    last_token_ns: int  # its last decode run returned (== first_token_ns without decode)


def plan_requests(
    seed: int,
    cycle: int,
    count: int,
    *,
    input_tokens: tuple[int, int],
    max_tokens: int,
    mean_interarrival_s: float,
    prefix: str = "cmpl",
) -> list[RequestPlan]:
    """The ``count`` requests of cycle ``cycle``: the same list for the same arguments.

    Input tokens are uniform on ``input_tokens`` (inclusive). The answer's wanted length L is uniform
    on 1..ceil(1.5 * max_tokens); ``output_tokens = min(L, max_tokens)`` and the finish reason is
    ``length`` when L >= max_tokens, else ``stop``. Arrivals are a Poisson process of mean gap
    ``mean_interarrival_s`` (0: all arrive at once), the first at offset 0.
    """
    lo, hi = input_tokens
    if not 1 <= lo <= hi:
        raise ValueError(f"input_tokens must be 1 <= min <= max, got {input_tokens}")
    if max_tokens < 1:
        raise ValueError("max_tokens must be at least 1")
    rng = random.Random(f"{seed}:{cycle}")
    longest = -(-3 * max_tokens // 2)
    plans = []
    offset = 0.0
    for i in range(count):
        if i and mean_interarrival_s > 0:
            offset += rng.expovariate(1.0 / mean_interarrival_s)
        wanted = rng.randint(1, longest)
        plans.append(
            RequestPlan(
                request_id=f"{prefix}-{seed}-{cycle}-{i}",
                arrival_offset_s=offset,
                input_tokens=rng.randint(lo, hi),
                max_tokens=max_tokens,
                output_tokens=min(wanted, max_tokens),
                finish_reason="length" if wanted >= max_tokens else "stop",
            )
        )
    return plans


def serve(
    plans: list[RequestPlan],
    run_once: Callable[[], None],
    stop: threading.Event,
    clock: Callable[[], int] = time.time_ns,
) -> list[tuple[RequestPlan, RequestTiming]]:
    """Serve ``plans`` in arrival order, one at a time; returns the requests that finished.

    The first arrival is now. The server waits (on ``stop``) for a request that has not arrived yet;
    a stop ends serving between runs, and the request it cuts short is not returned.
    """
    start = clock()
    done = []
    for plan in plans:
        arrival = start + round(plan.arrival_offset_s * 1e9)
        wait_s = (arrival - clock()) / 1e9
        if (wait_s > 0 and stop.wait(wait_s)) or stop.is_set():
            break
        scheduled = clock()
        run_once()
        first = last = clock()
        for _ in range(plan.decode_runs):
            if stop.is_set():
                return done
            run_once()
            last = clock()
        done.append((plan, RequestTiming(arrival, scheduled, first, last)))
    return done


def span_attributes(plan: RequestPlan, timing: RequestTiming, model: str) -> dict[str, str | int | float | list[str]]:
    """The attributes of the request's ``llm_request`` span: vLLM's names, then the GenAI conventions'."""
    s = 1e-9
    return {
        "gen_ai.response.model": model,
        "gen_ai.request.model": model,
        "gen_ai.request.id": plan.request_id,
        "gen_ai.request.max_tokens": plan.max_tokens,
        "gen_ai.usage.prompt_tokens": plan.input_tokens,
        "gen_ai.usage.completion_tokens": plan.output_tokens,
        "gen_ai.usage.input_tokens": plan.input_tokens,
        "gen_ai.usage.output_tokens": plan.output_tokens,
        "gen_ai.response.finish_reasons": [plan.finish_reason],
        "gen_ai.latency.time_in_queue": (timing.scheduled_ns - timing.arrival_ns) * s,
        "gen_ai.latency.time_to_first_token": (timing.first_token_ns - timing.arrival_ns) * s,
        "gen_ai.latency.e2e": (timing.last_token_ns - timing.arrival_ns) * s,
        "gen_ai.latency.time_in_model_prefill": (timing.first_token_ns - timing.scheduled_ns) * s,
        "gen_ai.latency.time_in_model_decode": (timing.last_token_ns - timing.first_token_ns) * s,
        "gen_ai.latency.time_in_model_inference": (timing.last_token_ns - timing.scheduled_ns) * s,
    }
