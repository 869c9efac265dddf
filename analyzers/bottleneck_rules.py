"""The bottleneck taxonomy as data, and the pure classifier that applies it to a set of signals.

Each class (``launch-bound``, ``CPU-bound``, ``memory-bound``, ``compute-bound``, ``queue-bound``,
``throttled``) has weighted signals; a signal's value maps to a match score in [0, 1] by a linear ramp between
two thresholds (``low`` scores 0, ``high`` scores 1; ``low > high`` ramps downwards). A class's
score is the weighted mean of its signals' match scores, times its gates (ramps that must hold for
the class to apply at all: a device that is idle is not memory- or compute-bound). A signal the
inputs do not provide (no telemetry, no scheduler data) scores ``MISSING_SCORE`` (no information
either way) and lowers the class's coverage; a class with less coverage than ``MIN_COVERAGE``, or
without a signal it requires (queue-bound: the requests' queue share and the device's idle share),
is not a candidate. The best candidate wins when its score reaches ``MIN_SCORE``, else the answer is
``unknown``. Confidence grows with the winner's score, its coverage and its margin over the
runner-up. ``docs/bottleneck_taxonomy.md`` gives every threshold and weight with its reason.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final


@dataclass(frozen=True)
class Ramp:
    """A signal of a rule: its weight and the ramp that maps its value to a match score."""

    signal: str
    weight: float
    low: float
    high: float

    def score(self, value: float) -> float:
        """0 at ``low``, 1 at ``high``, linear between, clamped (decreasing when ``low > high``)."""
        if self.low == self.high:
            return 1.0 if value >= self.high else 0.0
        return min(1.0, max(0.0, (value - self.low) / (self.high - self.low)))


@dataclass(frozen=True)
class Rule:
    """One class: weighted signals (weights sum to 1), gates (multiplicative ramps), required signals."""

    cls: str
    signals: tuple[Ramp, ...]
    gates: tuple[Ramp, ...] = ()
    requires: tuple[str, ...] = ()  # signals without which the class is not a candidate


LAUNCH_BOUND: Final = "launch-bound"
CPU_BOUND: Final = "CPU-bound"
MEMORY_BOUND: Final = "memory-bound"
COMPUTE_BOUND: Final = "compute-bound"
QUEUE_BOUND: Final = "queue-bound"
THROTTLED: Final = "throttled"
UNKNOWN: Final = "unknown"

# Order matters only for ties: the more specific explanation first.
RULES: Final[tuple[Rule, ...]] = (
    Rule(
        THROTTLED,
        (
            Ramp("throttle_latency_impact", 0.40, 0.03, 0.15),
            Ramp("throttle_active", 0.30, 0.0, 1.0),
            Ramp("clock_drop_under_load", 0.30, 0.05, 0.25),
        ),
    ),
    Rule(
        LAUNCH_BOUND,
        (
            Ramp("microkernel_pct", 0.30, 0.30, 0.70),
            Ramp("avg_kernel_duration_us", 0.15, 50.0, 10.0),
            Ramp("kernel_launch_rate", 0.15, 2_000.0, 10_000.0),
            Ramp("cpu_overhead_ratio", 0.15, 0.10, 0.40),
            Ramp("gpu_idle_ratio", 0.15, 0.20, 0.60),
            Ramp("kernels_per_iteration", 0.10, 200.0, 2_000.0),
        ),
    ),
    Rule(
        MEMORY_BOUND,
        (
            Ramp("memory_ops_ratio", 0.40, 0.20, 0.50),
            Ramp("memory_bound_kernel_pct", 0.35, 0.30, 0.70),
            Ramp("gpu_memory_utilization", 0.25, 0.50, 0.90),
        ),
        gates=(Ramp("gpu_active_ratio", 1.0, 0.20, 0.50),),
    ),
    Rule(
        COMPUTE_BOUND,
        (
            Ramp("gpu_active_ratio", 0.35, 0.60, 0.90),
            Ramp("compute_kernel_pct", 0.25, 0.40, 0.80),
            Ramp("gpu_utilization", 0.20, 0.60, 0.90),
            Ramp("latency_p95_p50", 0.20, 1.50, 1.10),
        ),
        # a device far below its compute clock under load is held back by power or heat, not by its work
        gates=(Ramp("gpu_active_ratio", 1.0, 0.30, 0.60), Ramp("clock_drop_under_load", 1.0, 0.25, 0.05)),
    ),
    Rule(
        QUEUE_BOUND,
        (Ramp("queue_share", 0.60, 0.20, 0.50), Ramp("gpu_idle_ratio", 0.40, 0.30, 0.70)),
        # requests that wait while the device is busy wait for the device (saturated, not queue-bound)
        gates=(Ramp("gpu_idle_ratio", 1.0, 0.20, 0.50), Ramp("queue_share", 1.0, 0.10, 0.30)),
        requires=("queue_share", "gpu_idle_ratio"),
    ),
    Rule(
        CPU_BOUND,
        (
            Ramp("gpu_idle_ratio", 0.40, 0.30, 0.70),
            Ramp("sched_interference_index", 0.30, 0.05, 0.25),
            Ramp("involuntary_switch_ratio", 0.15, 0.10, 0.50),
            Ramp("fault_penalty_index", 0.15, 10.0, 200.0),
        ),
    ),
)
CLASSES: Final = (*(r.cls for r in RULES), UNKNOWN)
SIGNALS: Final = tuple(dict.fromkeys(g.signal for r in RULES for g in (*r.signals, *r.gates)))

MISSING_SCORE: Final = 0.5  # a signal the inputs lack: no information either way
MIN_COVERAGE: Final = 0.25  # a class needs at least this share of its signal weight present
MIN_SCORE: Final = 0.5  # below it no class is supported: unknown
FULL_MARGIN: Final = 0.25  # a lead over the runner-up this large counts as full separation
TOP_EVIDENCE: Final = 3


@dataclass(frozen=True)
class Classification:
    """The answer for one subject: class, confidence, evidence, and every class's score."""

    bottleneck_class: str
    confidence: float
    top_evidence: tuple[dict[str, float | str], ...]
    scores: Mapping[str, float | None]
    coverage: Mapping[str, float]
    signals: Mapping[str, float | None]
    candidate: str | None = None  # the best class when the answer is unknown

    def to_dict(self) -> dict[str, Any]:
        """The seeds' shape (``bottleneck_class``, ``confidence``, ``top_evidence``) plus the detail."""
        return {
            "bottleneck_class": self.bottleneck_class,
            "confidence": self.confidence,
            "top_evidence": [dict(e) for e in self.top_evidence],
            "scores": dict(self.scores),
            "coverage": dict(self.coverage),
            "candidate": self.candidate,
            "signals": {k: v for k, v in self.signals.items() if v is not None},
            "missing_signals": sorted(k for k in SIGNALS if self.signals.get(k) is None),
        }


def _present(signals: Mapping[str, float | None], name: str) -> float | None:
    v = signals.get(name)
    if v is None or not isinstance(v, int | float) or math.isnan(v) or math.isinf(v):
        return None
    return float(v)


def score_rule(rule: Rule, signals: Mapping[str, float | None]) -> tuple[float, float, list[tuple[float, Ramp, float]]]:
    """(score, coverage, [(contribution, ramp, value) of present signals]) of one rule."""
    total = sum(r.weight for r in rule.signals)
    score = 0.0
    present_weight = 0.0
    contributions: list[tuple[float, Ramp, float]] = []
    for ramp in rule.signals:
        value = _present(signals, ramp.signal)
        if value is None:
            score += ramp.weight * MISSING_SCORE
            continue
        s = ramp.score(value)
        score += ramp.weight * s
        present_weight += ramp.weight
        contributions.append((ramp.weight * s, ramp, value))
    score /= total
    for gate in rule.gates:
        value = _present(signals, gate.signal)
        if value is not None:  # a gate the inputs lack does not hold the class back
            score *= gate.score(value)
    return score, present_weight / total, contributions


def classify(signals: Mapping[str, float | None], rules: tuple[Rule, ...] = RULES) -> Classification:
    """Apply ``rules`` to ``signals`` (name -> value; None or absent when unknown)."""
    scored = {r.cls: score_rule(r, signals) for r in rules}
    candidates = [
        r.cls
        for r in rules
        if scored[r.cls][1] >= MIN_COVERAGE and all(_present(signals, name) is not None for name in r.requires)
    ]
    # a class without enough evidence has no score: its value would be mostly the missing-signal prior
    scores = {c: (round(s, 4) if c in candidates else None) for c, (s, _, _) in scored.items()}
    coverage = {c: round(cov, 4) for c, (_, cov, _) in scored.items()}
    clean = {k: _present(signals, k) for k in SIGNALS}
    if not candidates:
        return Classification(UNKNOWN, 0.0, (), scores, coverage, clean)
    # max keeps the first of equals: RULES order breaks ties
    best = max(candidates, key=lambda c: scored[c][0])
    s1, cov1, contributions = scored[best]
    s2 = max((scored[c][0] for c in candidates if c != best), default=0.0)
    contributions.sort(key=lambda t: (-t[0], -t[1].weight))
    evidence = tuple(
        {"signal": ramp.signal, "value": _round(value), "weight": ramp.weight}
        for _, ramp, value in contributions[:TOP_EVIDENCE]
    )
    if s1 < MIN_SCORE:
        return Classification(UNKNOWN, 0.0, evidence, scores, coverage, clean, candidate=best)
    separation = min(1.0, (s1 - s2) / FULL_MARGIN)
    confidence = s1 * (0.5 + 0.5 * cov1) * (0.5 + 0.5 * separation)
    return Classification(best, round(confidence, 3), evidence, scores, coverage, clean)


def _round(value: float) -> float:
    """Evidence values as people read them: 4 significant digits."""
    if value == 0 or not math.isfinite(value):
        return value
    return float(f"{value:.4g}")


DOC_BEGIN: Final = "<!-- BEGIN GENERATED: bottleneck rules -->"
DOC_END: Final = "<!-- END GENERATED -->"


def markdown_rules(rules: tuple[Rule, ...] = RULES) -> str:
    """The rules as the table of ``docs/bottleneck_taxonomy.md`` (between its markers)."""
    lines = [
        DOC_BEGIN,
        "",
        "| class | signal | weight | scores 0 at | scores 1 at |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in rules:
        for g in r.signals:
            lines.append(f"| {r.cls} | `{g.signal}` | {g.weight:g} | {g.low:g} | {g.high:g} |")
        for g in r.gates:
            lines.append(f"| {r.cls} | gate: `{g.signal}` | x | {g.low:g} | {g.high:g} |")
        if r.requires:
            lines.append(f"| {r.cls} | requires: {', '.join(f'`{n}`' for n in r.requires)} | | | |")
    lines += [
        "",
        f"Missing signal score {MISSING_SCORE:g}; minimum coverage {MIN_COVERAGE:g}; minimum score "
        f"{MIN_SCORE:g}; full margin {FULL_MARGIN:g}; top evidence {TOP_EVIDENCE}.",
        "",
        DOC_END,
    ]
    return "\n".join(lines)


def splice_rules(document: str) -> str:
    """``document`` with its generated rules table replaced by the current one."""
    head, _, rest = document.partition(DOC_BEGIN)
    _, _, tail = rest.partition(DOC_END)
    return head + markdown_rules() + tail
