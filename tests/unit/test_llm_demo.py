"""The demo's LLM requests: the seeded token rule, the serving loop's timings and vLLM's span attributes."""

from __future__ import annotations

import threading

import pytest
from pydantic import ValidationError

from aaco.agent.sources import SOURCES
from aaco.agent.sources.ort.llm_requests import RequestPlan, RequestTiming, plan_requests, serve, span_attributes
from aaco.agent.sources.ort.llm_source import LlmRequestsConfig

RULE = {"input_tokens": (16, 512), "max_tokens": 12, "mean_interarrival_s": 0.05}


class FakeClock:
    """Nanoseconds that move only when a run or a wait moves them."""

    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


class WaitingStop(threading.Event):
    """A stop event whose wait advances the fake clock instead of sleeping."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.waits.append(timeout)
        self.clock.now += round(timeout * 1e9)
        return self.is_set()


def plan(rid: str, offset: float, out: int) -> RequestPlan:
    return RequestPlan(rid, offset, 100, 8, out, "length" if out == 8 else "stop")


def test_the_rule_is_deterministic_per_seed_and_cycle():
    a = plan_requests(3, 0, 50, **RULE)
    assert a == plan_requests(3, 0, 50, **RULE)
    assert a != plan_requests(3, 1, 50, **RULE)
    assert a != plan_requests(4, 0, 50, **RULE)
    assert [p.request_id for p in a[:2]] == ["cmpl-3-0-0", "cmpl-3-0-1"]


def test_token_counts_and_finish_reasons_follow_the_rule():
    plans = [p for cycle in range(20) for p in plan_requests(0, cycle, 50, **RULE)]
    assert all(16 <= p.input_tokens <= 512 for p in plans)
    assert all(1 <= p.output_tokens <= 12 and p.decode_runs == p.output_tokens - 1 for p in plans)
    # length <=> the wanted answer reached max_tokens, so it was cut at exactly max_tokens
    assert all((p.finish_reason == "length") == (p.output_tokens == 12) for p in plans)
    reasons = [p.finish_reason for p in plans]
    # L uniform on 1..18: P(L >= 12) = 7/18 of 1,000 requests
    assert 300 < reasons.count("length") < 480
    assert any(p.output_tokens == 1 for p in plans)  # one-token requests occur (TPOT undefined for them)


def test_arrivals_start_at_zero_and_never_go_back():
    plans = plan_requests(1, 0, 200, **RULE)
    offsets = [p.arrival_offset_s for p in plans]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert 0.03 < offsets[-1] / 199 < 0.07  # mean gap near 0.05 s
    burst = plan_requests(1, 0, 10, input_tokens=(1, 1), max_tokens=1, mean_interarrival_s=0)
    assert {p.arrival_offset_s for p in burst} == {0.0}
    assert {(p.input_tokens, p.output_tokens, p.finish_reason) for p in burst} == {(1, 1, "length")}


@pytest.mark.parametrize("bad", [{"input_tokens": (0, 4)}, {"input_tokens": (5, 4)}, {"max_tokens": 0}])
def test_the_rule_refuses_impossible_ranges(bad):
    with pytest.raises(ValueError):
        plan_requests(0, 0, 1, **{**RULE, **bad})


def test_a_burst_is_served_in_order_and_waits_in_the_queue():
    clock = FakeClock()
    runs = []

    def run_once() -> None:
        runs.append(clock.now)
        clock.now += 10_000_000  # 10 ms per model run

    plans = [plan("a", 0.0, 3), plan("b", 0.0, 1), plan("c", 0.0, 2)]
    served = serve(plans, run_once, WaitingStop(clock), clock)
    assert len(runs) == 6  # one run per output token
    t0 = 1_000_000_000
    ms = 10_000_000
    assert [t for _p, t in served] == [
        RequestTiming(t0, t0, t0 + ms, t0 + 3 * ms),
        RequestTiming(t0, t0 + 3 * ms, t0 + 4 * ms, t0 + 4 * ms),
        RequestTiming(t0, t0 + 4 * ms, t0 + 5 * ms, t0 + 6 * ms),
    ]


def test_an_idle_server_waits_for_the_next_arrival():
    clock = FakeClock()
    stop = WaitingStop(clock)

    def run_once() -> None:
        clock.now += 10_000_000

    served = serve([plan("a", 0.0, 2), plan("b", 0.5, 1)], run_once, stop, clock)
    assert stop.waits == [pytest.approx(0.48)]  # 0.5 s after the first arrival, which took 20 ms
    timing = served[1][1]
    assert timing.scheduled_ns == timing.arrival_ns == 1_500_000_000  # arrived to an idle server: no queue


def test_a_stop_ends_serving_and_drops_the_request_it_cut():
    clock = FakeClock()
    stop = WaitingStop(clock)
    runs = 0

    def run_once() -> None:
        nonlocal runs
        runs += 1
        clock.now += 1_000
        if runs == 5:
            stop.set()

    served = serve([plan("a", 0.0, 3), plan("b", 0.0, 4), plan("c", 0.0, 1)], run_once, stop, clock)
    assert [p.request_id for p, _t in served] == ["a"]
    assert runs == 5


def test_span_attributes_are_vllms_in_seconds_and_tpot_is_the_decode_run_mean():
    p = RequestPlan("cmpl-1", 0.0, 321, 8, 5, "stop")
    t = RequestTiming(10_000_000_000, 10_250_000_000, 10_400_000_000, 10_800_000_000)
    a = span_attributes(p, t, "demo-llm-a")
    assert a["gen_ai.response.model"] == a["gen_ai.request.model"] == "demo-llm-a"
    assert a["gen_ai.request.id"] == "cmpl-1" and a["gen_ai.request.max_tokens"] == 8
    assert a["gen_ai.usage.prompt_tokens"] == a["gen_ai.usage.input_tokens"] == 321
    assert a["gen_ai.usage.completion_tokens"] == a["gen_ai.usage.output_tokens"] == 5
    assert a["gen_ai.response.finish_reasons"] == ["stop"]
    assert a["gen_ai.latency.time_in_queue"] == pytest.approx(0.25)
    assert a["gen_ai.latency.time_to_first_token"] == pytest.approx(0.4)
    assert a["gen_ai.latency.e2e"] == pytest.approx(0.8)
    assert a["gen_ai.latency.time_in_model_prefill"] == pytest.approx(0.15)
    assert a["gen_ai.latency.time_in_model_decode"] == pytest.approx(0.4)
    assert a["gen_ai.latency.time_in_model_inference"] == pytest.approx(0.55)
    tpot = (a["gen_ai.latency.e2e"] - a["gen_ai.latency.time_to_first_token"]) / (p.output_tokens - 1)
    assert tpot == pytest.approx(0.1)  # 4 decode runs in 0.4 s


def test_the_source_is_registered_and_its_settings_are_checked():
    assert "llm_requests" in SOURCES.kinds()
    cfg = LlmRequestsConfig()
    assert cfg.models == ["demo-llm-a", "demo-llm-b"] and cfg.endpoint == "http://127.0.0.1:4318"
    with pytest.raises(ValidationError):
        LlmRequestsConfig(input_tokens_min=20, input_tokens_max=10)
    with pytest.raises(ValidationError):
        LlmRequestsConfig(models=[])


def test_spans_nobody_accepts_are_one_counted_problem(tmp_path):
    from aaco.agent.pipeline.bus import Bus
    from aaco.agent.sources.base import Journal, SourceContext
    from aaco.contract.stats import Stats
    from tests.conftest import get_free_port

    cfg = LlmRequestsConfig(
        provider="cpu",
        cycles=1,
        requests_per_cycle=3,
        max_tokens=1,
        warmup=0,
        endpoint=f"http://127.0.0.1:{get_free_port()}",
        export_timeout_s=0.5,
    )
    stats = Stats()
    bus = Bus(stats, 4096, 10_000_000)
    ctx = SourceContext("n", stats, bus, Journal(stats))
    source = SOURCES["llm_requests"].factory(cfg, "llm")
    source.run(ctx)
    assert source.sent == 3
    (problem,) = [p for p in ctx.journal.problems if p.reason == "export"]
    assert problem.subject == cfg.endpoint and problem.message.startswith("3 request span(s) not accepted")
    kinds = []
    while (item := bus.get(0.0)) is not None:
        kinds.append((item.kind, item.rows))
    assert ("iterations", 3) in kinds  # one prefill run per one-token request, published all the same
