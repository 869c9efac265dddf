"""The bottleneck rules: ramps, scores, missing signals, gates, confidence, and the generated doc table."""

from __future__ import annotations

from pathlib import Path

import pytest

from aaco.analyzers.bottleneck_rules import (
    CLASSES,
    COMPUTE_BOUND,
    CPU_BOUND,
    LAUNCH_BOUND,
    MISSING_SCORE,
    RULES,
    THROTTLED,
    UNKNOWN,
    Ramp,
    Rule,
    classify,
    markdown_rules,
    score_rule,
    splice_rules,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "bottleneck_taxonomy.md"


def test_ramps_rise_fall_and_clamp():
    up = Ramp("x", 1.0, 10.0, 20.0)
    assert [up.score(v) for v in (0, 10, 15, 20, 99)] == [0.0, 0.0, 0.5, 1.0, 1.0]
    down = Ramp("x", 1.0, 50.0, 10.0)  # shorter is more launch-bound
    assert [down.score(v) for v in (100, 50, 30, 10, 2)] == [0.0, 0.0, 0.5, 1.0, 1.0]


def test_every_rule_weighs_one_and_classes_are_fixed():
    for rule in RULES:
        assert sum(r.weight for r in rule.signals) == pytest.approx(1.0), rule.cls
    assert CLASSES == (
        "throttled",
        "launch-bound",
        "memory-bound",
        "compute-bound",
        "queue-bound",
        "CPU-bound",
        "unknown",
    )


def test_score_is_the_weighted_mean_with_missing_signals_at_the_prior():
    rule = Rule("c", (Ramp("a", 0.6, 0.0, 1.0), Ramp("b", 0.4, 0.0, 1.0)))
    score, coverage, contributions = score_rule(rule, {"a": 1.0})
    assert score == pytest.approx(0.6 * 1.0 + 0.4 * MISSING_SCORE)
    assert coverage == pytest.approx(0.6)
    assert [(round(c, 3), r.signal, v) for c, r, v in contributions] == [(0.6, "a", 1.0)]
    # NaN and infinities are missing, not numbers
    assert score_rule(rule, {"a": float("nan"), "b": float("inf")})[1] == 0.0


def test_gates_multiply_and_a_missing_gate_holds_nothing_back():
    rule = Rule("c", (Ramp("a", 1.0, 0.0, 1.0),), gates=(Ramp("g", 1.0, 0.0, 1.0),))
    assert score_rule(rule, {"a": 1.0, "g": 0.25})[0] == pytest.approx(0.25)
    assert score_rule(rule, {"a": 1.0})[0] == pytest.approx(1.0)


def test_no_signals_at_all_is_unknown_with_zero_confidence():
    c = classify({})
    assert c.bottleneck_class == UNKNOWN and c.confidence == 0.0 and c.top_evidence == ()
    assert all(v is None for v in c.scores.values())  # no class has enough evidence to be scored


def test_confidence_formula_on_a_hand_computed_case():
    # Launch-bound, every signal measured and fully matching: score 1, coverage 1.
    # CPU-bound: idle 0.6 scores (0.6-0.3)/0.4 = 0.75 x 0.4 = 0.3, its three sched signals missing: 0.6 x 0.5 = 0.3.
    # Runner-up 0.6, margin 0.4 >= 0.25: full separation. confidence = 1 x 1 x 1.
    signals = {
        "microkernel_pct": 0.9,
        "avg_kernel_duration_us": 2.0,
        "kernel_launch_rate": 50_000.0,
        "cpu_overhead_ratio": 0.5,
        "gpu_idle_ratio": 0.6,
        "kernels_per_iteration": 3000.0,
    }
    c = classify(signals)
    assert c.bottleneck_class == LAUNCH_BOUND
    assert c.scores[LAUNCH_BOUND] == 1.0
    assert c.scores[CPU_BOUND] == pytest.approx(0.6)
    assert c.confidence == 1.0
    assert [e["signal"] for e in c.top_evidence] == ["microkernel_pct", "avg_kernel_duration_us", "kernel_launch_rate"]
    assert c.top_evidence[0] == {"signal": "microkernel_pct", "value": 0.9, "weight": 0.3}
    # Without the launch-call measurement: coverage 0.85, score 1 - 0.15 x 0.5 = 0.925,
    # margin 0.325 -> full; confidence = 0.925 x (0.5 + 0.425) = 0.855625.
    del signals["cpu_overhead_ratio"]
    c = classify(signals)
    assert c.bottleneck_class == LAUNCH_BOUND
    assert c.confidence == pytest.approx(0.925 * 0.925, abs=1e-3)
    assert "cpu_overhead_ratio" in c.to_dict()["missing_signals"]


def test_close_runner_up_lowers_confidence():
    # compute-bound and memory-bound evidence at once: the margin shrinks the confidence
    both = {
        "gpu_active_ratio": 0.95,
        "compute_kernel_pct": 0.5,
        "latency_p95_p50": 1.05,
        "memory_ops_ratio": 0.35,
        "memory_bound_kernel_pct": 0.5,
        "gpu_idle_ratio": 0.05,
    }
    only = {**both, "memory_ops_ratio": 0.0, "memory_bound_kernel_pct": 0.0, "compute_kernel_pct": 1.0}
    c_both, c_only = classify(both), classify(only)
    assert c_only.bottleneck_class == COMPUTE_BOUND
    assert c_both.confidence < c_only.confidence


def test_ties_go_to_the_more_specific_class():
    rules = (Rule("first", (Ramp("a", 1.0, 0.0, 1.0),)), Rule("second", (Ramp("a", 1.0, 0.0, 1.0),)))
    assert classify({"a": 1.0}, rules).bottleneck_class == "first"


def test_throttled_needs_its_own_evidence():
    # With no telemetry at all, throttled is not a candidate even though its prior would be 0.5.
    c = classify({"gpu_idle_ratio": 0.1, "gpu_active_ratio": 0.9})
    assert c.scores[THROTTLED] is None and c.coverage[THROTTLED] == 0.0


def test_low_scores_are_unknown_and_name_the_candidate():
    # idle 0.45 -> CPU-bound 0.375 x 0.4 + 0.3 = 0.45 < 0.5; nothing else stands out
    c = classify({"gpu_idle_ratio": 0.45, "gpu_active_ratio": 0.55, "microkernel_pct": 0.1})
    assert c.bottleneck_class == UNKNOWN and c.confidence == 0.0
    assert c.candidate == CPU_BOUND
    assert c.top_evidence[0]["signal"] == "gpu_idle_ratio"


def test_the_doc_holds_the_current_rules():
    text = DOC.read_text()
    assert markdown_rules() in text, "docs/bottleneck_taxonomy.md is stale: regenerate it with splice_rules"
    assert splice_rules(text) == text


def test_queue_bound_needs_both_a_queue_and_an_idle_device():
    idle = classify({"queue_share": 0.6, "gpu_idle_ratio": 0.7})
    assert idle.bottleneck_class == "queue-bound" and idle.scores["queue-bound"] == 1.0
    assert idle.scores["CPU-bound"] == pytest.approx(0.7)  # idle alone: 0.4 x 1 + 0.6 x the prior
    busy = classify({"queue_share": 0.6, "gpu_idle_ratio": 0.05, "gpu_active_ratio": 0.95})
    assert busy.scores["queue-bound"] == 0.0 and busy.bottleneck_class == "compute-bound"
    short_queue = classify({"queue_share": 0.1, "gpu_idle_ratio": 0.7})
    assert short_queue.scores["queue-bound"] == 0.0 and short_queue.bottleneck_class == "CPU-bound"
    # a required signal missing: not a candidate, whatever the coverage of the others
    assert classify({"gpu_idle_ratio": 0.7}).scores["queue-bound"] is None
    assert classify({"queue_share": 0.9}).scores["queue-bound"] is None
    rule = Rule("c", (Ramp("a", 0.5, 0.0, 1.0), Ramp("b", 0.5, 0.0, 1.0)), requires=("b",))
    assert classify({"a": 1.0}, (rule,)).bottleneck_class == UNKNOWN
    assert classify({"a": 1.0, "b": 1.0}, (rule,)).bottleneck_class == "c"
