"""The serving analyzer: histograms, counters and skips per (model, namespace, pod), computed here by hand."""

from __future__ import annotations

import random

import pytest

from aaco.analyzers.base import AgentHints
from aaco.analyzers.serving import ServingAnalyzer, ServingSettings, create
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.serving import (
    DURATION_BUCKETS,
    PHASE_BUCKETS,
    REQUEST_COUNT,
    REQUESTS_SKIPPED,
    TOKEN_COUNT,
    TPOT,
    TPOT_BUCKETS,
    TTFT,
    TTFT_BUCKETS,
)


def rows(items: list[dict]) -> EventBatch:
    base = {"node": "n", "trace_id": "", "span_id": "00" * 8, "source": "otlp", "start_ns": 0, "end_ns": 0}
    full = [{**base, **r} for r in items]
    cols = {k: [r.get(k) for r in full] for k in {k for r in full for k in r}}
    return EventBatch("requests", conform("requests", cols), "otlp")


def make_requests(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        ttft = rng.uniform(0.004, 2.0)
        tokens = rng.choice([1, 2, 17, 256])
        out.append(
            {
                "model": rng.choice(["a", "b"]),
                "namespace": "ns",
                "pod": rng.choice(["p0", "p1"]),
                "trace_id": f"{i:032x}",
                "ttft_s": ttft,
                "e2e_s": ttft + rng.uniform(0.0, 30.0),
                "queue_s": rng.uniform(0, 0.5),
                "input_tokens": rng.randint(1, 4000),
                "output_tokens": tokens,
                "finish_reason": rng.choice(["stop", "length", None]),
                "start_ns": i * 1000,
                "end_ns": i * 1000 + 5,
            }
        )
    return out


def cumulative(values: list[float], bounds: tuple[float, ...]) -> tuple[int, ...]:
    return tuple(sum(1 for v in values if v <= b) for b in bounds)


def test_histograms_and_counters_equal_the_hand_computed_values():
    reqs = make_requests(400, seed=3)
    an = ServingAnalyzer()
    for i in range(0, len(reqs), 37):
        an.update(rows(reqs[i : i + 37]))
    res = an.snapshot()
    assert {k for k in res.groups} == {(m, "ns", p) for m in "ab" for p in ("p0", "p1")}
    for (model, ns, pod), g in res.groups.items():
        mine = [r for r in reqs if (r["model"], r["namespace"], r["pod"]) == (model, ns, pod)]
        ttft = [r["ttft_s"] for r in mine]
        tpot = [(r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in mine if r["output_tokens"] > 1]
        e2e = [r["e2e_s"] for r in mine]
        for name, values, bounds in (
            ("ttft_s", ttft, TTFT_BUCKETS),
            ("tpot_s", tpot, TPOT_BUCKETS),
            ("duration_s", e2e, DURATION_BUCKETS),
            ("queue_s", [r["queue_s"] for r in mine], PHASE_BUCKETS),
        ):
            h = g.histograms[name]
            assert h.count == len(values), name
            assert h.total == pytest.approx(sum(values), rel=1e-12), name
            assert h.bucket_counts == cumulative(values, bounds), name
            assert h.bounds == bounds
        assert g.histograms["prefill_s"].count == 0 and g.histograms["decode_s"].count == 0
        assert mine[-1]["trace_id"] in {e.trace_id for e in g.histograms["ttft_s"].exemplars if e}
        assert g.input_tokens == sum(r["input_tokens"] for r in mine)
        assert g.output_tokens == sum(r["output_tokens"] for r in mine)
        assert g.skipped == {"tpot_one_token": sum(1 for r in mine if r["output_tokens"] == 1)}
        want = {}
        for r in mine:
            want[r["finish_reason"] or "unknown"] = want.get(r["finish_reason"] or "unknown", 0) + 1
        assert g.finish_reasons == want and g.requests == len(mine)


def test_tpot_skips_by_reason_and_duration_falls_back_to_the_span():
    an = ServingAnalyzer()
    an.update(
        rows(
            [
                {"model": "m", "ttft_s": 0.1, "e2e_s": 1.1, "output_tokens": 11},  # tpot 0.1
                {"model": "m", "ttft_s": 0.1, "e2e_s": 0.5, "output_tokens": 1},
                {"model": "m", "ttft_s": 0.1, "e2e_s": 0.5, "output_tokens": 0},
                {"model": "m", "ttft_s": 0.1, "e2e_s": 0.5},
                {"model": "m", "ttft_s": 0.1, "output_tokens": 5, "start_ns": 0, "end_ns": 2_500_000_000},
                {"model": "m", "ttft_s": 0.9, "e2e_s": 0.5, "output_tokens": 5},
            ]
        )
    )
    (g,) = an.snapshot().groups.values()
    assert g.skipped == {"tpot_one_token": 2, "tpot_no_tokens": 1, "tpot_no_latency": 1, "tpot_negative": 1}
    tpot = g.histograms["tpot_s"]
    assert (tpot.count, tpot.total) == (1, pytest.approx(0.1))
    dur = g.histograms["duration_s"]
    assert dur.count == 6 and dur.total == pytest.approx(1.1 + 0.5 * 3 + 2.5 + 0.5)


def test_points_carry_the_fixed_labels_and_omit_empty_histograms():
    an = ServingAnalyzer()
    row = {"model": "m", "trace_id": "ab" * 16, "ttft_s": 0.2, "e2e_s": 1.0, "output_tokens": 3, "input_tokens": 9}
    an.update(rows([row]))
    pts = an.snapshot().points()
    by = {(p.metric.prom_name, tuple(sorted(p.labels.items()))): p.value for p in pts}
    labels = (("model", "m"), ("namespace", ""), ("pod", ""))
    assert by[(TOKEN_COUNT.prom_name, (*labels, ("type", "input")))] == 9
    assert by[(TOKEN_COUNT.prom_name, (*labels, ("type", "output")))] == 3
    assert by[(REQUEST_COUNT.prom_name, (("finish_reason", "unknown"), *labels))] == 1
    assert by[(TPOT.prom_name, labels)].total == pytest.approx(0.4)
    assert [(e.trace_id, e.value) for e in by[(TTFT.prom_name, labels)].exemplars if e] == [("ab" * 16, 0.2)]
    names = {p.metric.prom_name for p in pts}
    assert "aaco_llm_prefill_seconds" not in names and REQUESTS_SKIPPED.prom_name not in names


def test_groups_and_finish_reasons_are_bounded_and_overflow_counted():
    an = create(ServingSettings(max_groups=2, max_finish_reasons=2), AgentHints(), max_models=256)
    an.update(rows([{"model": f"m{i}", "ttft_s": 0.1, "finish_reason": "stop"} for i in range(5)]))
    an.update(rows([{"model": "m0", "ttft_s": 0.1, "finish_reason": r} for r in ("length", "abort", "x", "stop")]))
    res = an.snapshot()
    assert set(res.groups) == {("m0", "", ""), ("m1", "", "")} and res.over_limit == 3
    assert res.groups[("m0", "", "")].finish_reasons == {"stop": 2, "length": 1, "other": 2}
    (over,) = [p for p in res.points() if p.metric is REQUESTS_SKIPPED and p.labels["reason"] == "series_limit"]
    assert over.value == 3 and over.labels == {"model": "", "namespace": "", "pod": "", "reason": "series_limit"}


def test_the_group_bound_defaults_to_the_agents_model_bound():
    an = create(ServingSettings(), AgentHints(), max_models=1)
    an.update(rows([{"model": "a", "ttft_s": 0.1}, {"model": "b", "ttft_s": 0.1}]))
    assert an.snapshot().over_limit == 1


def test_an_unknown_pod_and_an_empty_one_are_one_group():
    a = ServingAnalyzer()
    a.update(
        rows(
            [
                {"model": "m", "pod": None, "ttft_s": 0.1, "output_tokens": 3, "e2e_s": 0.5},
                {"model": "m", "pod": "", "ttft_s": 0.2, "output_tokens": 3, "e2e_s": 0.7},
                {"model": "m", "pod": "p", "ttft_s": 0.3, "output_tokens": 1, "e2e_s": 0.3},
            ]
        )
    )
    snap = a.snapshot()
    assert sorted(snap.groups) == [("m", "", ""), ("m", "", "p")]
    merged = snap.groups[("m", "", "")]
    assert merged.requests == 2 and merged.histograms["ttft_s"].count == 2
    assert merged.histograms["tpot_s"].total == pytest.approx((0.4 / 2) + (0.5 / 2))
    assert snap.groups[("m", "", "p")].skipped == {"tpot_one_token": 1}
