"""The regression verdict: a session's model against its baseline, in the seeds' JSON shape.

Latency: ``latency_delta_pct`` is the change of the median iteration latency (session / baseline -
1, in percent), with a percentile bootstrap 95 % confidence interval (``scipy.stats.bootstrap``,
both samples resampled independently, a fixed seed so CI runs are reproducible) and the one-sided
Mann-Whitney U p-value that session latencies are stochastically greater (``scipy.stats.mannwhitneyu``;
rank based, so heavy tails and outliers do not sway it). A **regression** is a change that is
significant (p < ``alpha`` and the interval above 0) and large enough (the median rose by at least
``min_delta_pct``). ``confidence`` is the share of bootstrap replicates on the side of the answer:
with a regression, those in which the median rose by at least ``min_delta_pct``; without, the others.
Severity by the median change: low < 5 % <= medium < 15 % <= high < 50 % <= critical.

Cause, from first principles: an iteration's time is the device busy for it plus the gap in which
it waited on the host. The change of each part per iteration — compute kernels (GEMM, convolution,
attention), memory-bound work (copies, memsets, elementwise, normalisation), other kernels, and the
host gap — is attributed, and the largest increase names the suspect: compute-bound, memory-bound,
or, for the host gap, launch-bound when kernels per iteration rose by 20 % or more (or the session's
bottleneck is launch-bound), else CPU-bound. Lower compute clocks in the session (5 % or more), or a
session classified throttled, make it throttled. The recommendation follows the cause.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import numpy as np

from aaco.analyzers.bottleneck_rules import COMPUTE_BOUND, CPU_BOUND, LAUNCH_BOUND, MEMORY_BOUND, THROTTLED, UNKNOWN

MIN_SAMPLES: Final = 5
ALPHA: Final = 0.01
MIN_DELTA_PCT: Final = 5.0
RESAMPLES: Final = 2000
SEED: Final = 0
KERNEL_GROWTH: Final = 0.20  # kernels per iteration up this much: the host gap is launch overhead
CLOCK_DROP: Final = 0.05  # compute clock median down this much: throttled

COMPUTE_FAMILIES: Final = ("gemm", "convolution", "attention")
MEMORY_FAMILIES: Final = ("memcpy", "memset", "elementwise", "normalization")
OTHER_FAMILIES: Final = ("communication", "other")

RECOMMENDATIONS: Final[dict[str, str]] = {
    LAUNCH_BOUND: "More and shorter kernels per iteration: investigate graph partitioning changes and consider "
    "operator fusion (and CUDA/HIP graphs) to cut launches; compare kernels per iteration and KAR.",
    COMPUTE_BOUND: "More compute per iteration: check model and shape changes (layer sizes, batch, precision) and "
    "kernel selection (GEMM/convolution tuning, tensor-core/MFMA paths) for the families that grew.",
    MEMORY_BOUND: "More time in copies or bandwidth-bound kernels: pin host memory, overlap copies with compute, "
    "keep tensors on the device, fuse elementwise and normalisation ops.",
    CPU_BOUND: "The device waits on the host: check CPU contention (scheduler interference, CPU limits, "
    "co-located processes), thread settings (intra-op threads), data loading and preprocessing.",
    THROTTLED: "Clocks dropped: check power caps, cooling and throttle reasons on the node, and compare its "
    "clocks with the baseline's.",
    UNKNOWN: "No single part of the iteration explains the change: compare the per-family deltas and the traces "
    "of the slowest iterations.",
}


class VerdictInputError(ValueError):
    """A profile that cannot be compared (too few samples)."""


def _pct(new: float | None, old: float | None) -> float | None:
    if new is None or old is None or old == 0:
        return None
    return (new / old - 1.0) * 100.0


def fmt_pct(value: float | None) -> str:
    """``+67%`` / ``-35%`` (``n/a`` when unknown)."""
    return "n/a" if value is None else f"{value:+.0f}%"


def _median_ratio_pct(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    return (np.median(y, axis=axis) / np.median(x, axis=axis) - 1.0) * 100.0


def latency_test(
    base: np.ndarray,
    session: np.ndarray,
    alpha: float = ALPHA,
    min_delta_pct: float = MIN_DELTA_PCT,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> dict[str, Any]:
    """Median change with its bootstrap CI, Mann-Whitney p-values, and the regression decision."""
    from scipy import stats  # loaded only for a verdict

    if base.size < MIN_SAMPLES or session.size < MIN_SAMPLES:
        raise VerdictInputError(
            f"needs at least {MIN_SAMPLES} iterations on each side (baseline {base.size}, session {session.size})"
        )
    delta = float(_median_ratio_pct(base, session))
    boot = stats.bootstrap(
        (base, session),
        _median_ratio_pct,
        n_resamples=resamples,
        vectorized=True,
        paired=False,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(seed),
        batch=max(1, 2_000_000 // max(base.size, session.size)),
    )
    lo, hi = float(boot.confidence_interval.low), float(boot.confidence_interval.high)
    p_greater = float(stats.mannwhitneyu(session, base, alternative="greater").pvalue)
    p_less = float(stats.mannwhitneyu(session, base, alternative="less").pvalue)
    regression = p_greater < alpha and lo > 0 and delta >= min_delta_pct
    improvement = p_less < alpha and hi < 0 and delta <= -min_delta_pct
    above = float(np.mean(boot.bootstrap_distribution >= min_delta_pct))
    return {
        "latency_delta_pct": round(delta, 2),
        "latency_delta_ci95_pct": [round(lo, 2), round(hi, 2)],
        "p_value": p_greater,
        "p_value_faster": p_less,
        "regression": regression,
        "improvement": improvement,
        "confidence": round(above if regression else 1.0 - above, 3),
    }


def severity(delta_pct: float, regression: bool) -> str:
    """``none`` without a regression, else by the median change."""
    if not regression:
        return "none"
    if delta_pct < 5:
        return "low"
    if delta_pct < 15:
        return "medium"
    return "high" if delta_pct < 50 else "critical"


def attribution(base: Mapping[str, Any], session: Mapping[str, Any]) -> dict[str, float | None]:
    """Change per iteration (seconds) of the latency and of each part of it (see module doc)."""

    def fam(p: Mapping[str, Any], names: tuple[str, ...]) -> float:
        t = p.get("family_time_per_iteration_s") or {}
        return float(sum(t.get(f, 0.0) for f in names))

    def get(p: Mapping[str, Any], key: str) -> float | None:
        v = p.get(key)
        return float(v) if isinstance(v, int | float) else None

    mean_b = (base.get("latency") or {}).get("mean_s")
    mean_s = (session.get("latency") or {}).get("mean_s")
    gap_b, gap_s = get(base, "host_gap_per_iteration_s"), get(session, "host_gap_per_iteration_s")
    return {
        "latency_s": (mean_s - mean_b) if mean_s is not None and mean_b is not None else None,
        "compute_kernels_s": fam(session, COMPUTE_FAMILIES) - fam(base, COMPUTE_FAMILIES),
        "memory_kernels_s": fam(session, MEMORY_FAMILIES) - fam(base, MEMORY_FAMILIES),
        "other_kernels_s": fam(session, OTHER_FAMILIES) - fam(base, OTHER_FAMILIES),
        "host_gap_s": (gap_s - gap_b) if gap_s is not None and gap_b is not None else None,
    }


def clock_drop(env_base: Mapping[str, Any], env_session: Mapping[str, Any]) -> float | None:
    """The largest relative drop of a compute clock's median (graphics, sm) from baseline to session."""
    a = (env_base.get("clocks") or {}).get("value") or {}
    b = (env_session.get("clocks") or {}).get("value") or {}
    drops = [
        1.0 - b[d]["median_hz"] / a[d]["median_hz"]
        for d in ("graphics", "sm")
        if a.get(d, {}).get("median_hz") and b.get(d, {}).get("median_hz") is not None
    ]
    return max(drops) if drops else None


def suspected_cause(
    base: Mapping[str, Any],
    session: Mapping[str, Any],
    parts: Mapping[str, float | None],
    drop: float | None,
) -> str:
    """The class that explains the change best (see module doc)."""
    session_class = (session.get("bottleneck") or {}).get("bottleneck_class")
    if (drop is not None and drop >= CLOCK_DROP) or session_class == THROTTLED:
        return THROTTLED
    named = {
        COMPUTE_BOUND: parts.get("compute_kernels_s"),
        MEMORY_BOUND: parts.get("memory_kernels_s"),
        "host": parts.get("host_gap_s"),
        "other": parts.get("other_kernels_s"),
    }
    known = {k: v for k, v in named.items() if v is not None}
    if not known or max(known.values()) <= 0:
        return session_class if session_class and session_class != UNKNOWN else UNKNOWN
    top = max(known, key=lambda k: known[k])
    if top == "host":
        growth = _pct(session.get("kernels_per_iteration"), base.get("kernels_per_iteration"))
        launchy = growth is not None and growth >= KERNEL_GROWTH * 100
        return LAUNCH_BOUND if launchy or session_class == LAUNCH_BOUND else CPU_BOUND
    if top == "other":
        return session_class if session_class and session_class != UNKNOWN else UNKNOWN
    return top


def evidence(base: Mapping[str, Any], session: Mapping[str, Any]) -> dict[str, Any]:
    """The seeds' evidence (relative changes as ``+67%``) and the per-family time changes."""
    out: dict[str, Any] = {
        "kernel_launch_count_delta": fmt_pct(
            _pct(session.get("kernels_per_iteration"), base.get("kernels_per_iteration"))
        ),
        "avg_kernel_duration_delta": fmt_pct(
            _pct(session.get("avg_kernel_duration_us"), base.get("avg_kernel_duration_us"))
        ),
        "gpu_busy_delta": fmt_pct(_pct(session.get("busy_per_iteration_s"), base.get("busy_per_iteration_s"))),
        "host_gap_delta": fmt_pct(_pct(session.get("host_gap_per_iteration_s"), base.get("host_gap_per_iteration_s"))),
    }
    if session.get("cpu_overhead_ratio") is not None and base.get("cpu_overhead_ratio") is not None:
        out["cpu_overhead_delta"] = fmt_pct(_pct(session["cpu_overhead_ratio"], base["cpu_overhead_ratio"]))
    fb = base.get("family_time_per_iteration_s") or {}
    fs = session.get("family_time_per_iteration_s") or {}
    out["family_time_delta"] = {
        f: ("new" if not fb.get(f) else fmt_pct(_pct(fs.get(f, 0.0), fb[f]))) for f in sorted(set(fb) | set(fs))
    }
    return out


def roofline_changes(base: Mapping[str, Any], session: Mapping[str, Any], min_delta_pct: float) -> list[dict[str, Any]]:
    """Kernel families whose HBM intensity or bandwidth moved by at least ``min_delta_pct``, largest first.

    Only families measured by hardware counters in both profiles (docs/regression_verdict.md).
    """
    rb, rs = base.get("roofline") or {}, session.get("roofline") or {}
    out = []
    for family in sorted(set(rb) & set(rs)):
        b, s = rb[family], rs[family]
        ai, bw = _pct(s.get("ai_hbm"), b.get("ai_hbm")), _pct(s.get("hbm_bytes_per_s"), b.get("hbm_bytes_per_s"))
        moved = max((abs(v) for v in (ai, bw) if v is not None), default=0.0)
        if moved >= min_delta_pct:
            out.append(
                {
                    "family": family,
                    "ai_hbm": {"baseline": b.get("ai_hbm"), "session": s.get("ai_hbm"), "delta_pct": ai},
                    "hbm_bytes_per_s": {
                        "baseline": b.get("hbm_bytes_per_s"),
                        "session": s.get("hbm_bytes_per_s"),
                        "delta_pct": bw,
                    },
                    "bound": {"baseline": b.get("bound"), "session": s.get("bound")},
                    "_moved": moved,
                }
            )
    out.sort(key=lambda c: -c["_moved"])
    return [{k: v for k, v in c.items() if k != "_moved"} for c in out]


def compare(
    base: Mapping[str, Any],
    session: Mapping[str, Any],
    env_base: Mapping[str, Any] | None = None,
    env_session: Mapping[str, Any] | None = None,
    alpha: float = ALPHA,
    min_delta_pct: float = MIN_DELTA_PCT,
) -> dict[str, Any]:
    """The verdict for one model (profiles as ``baseline.model_profile`` makes them)."""
    test = latency_test(
        np.asarray(base.get("latency_s") or [], dtype=np.float64),
        np.asarray(session.get("latency_s") or [], dtype=np.float64),
        alpha,
        min_delta_pct,
    )
    parts = attribution(base, session)
    drop = clock_drop(env_base or {}, env_session or {})
    cause = suspected_cause(base, session, parts, drop) if test["regression"] else None
    fb = base.get("family_time_per_iteration_s") or {}
    fs = session.get("family_time_per_iteration_s") or {}
    changes = roofline_changes(base, session, min_delta_pct)
    said = evidence(base, session)
    if changes:  # the kernel family the counters say changed most: what the verdict names
        top = changes[0]
        said["roofline_change"] = (
            f"{top['family']}: HBM bandwidth {fmt_pct(top['hbm_bytes_per_s']['delta_pct'])}, "
            f"arithmetic intensity {fmt_pct(top['ai_hbm']['delta_pct'])}"
        )
    return {
        "regression": test["regression"],
        "severity": severity(test["latency_delta_pct"], test["regression"]),
        "confidence": test["confidence"],
        "latency_delta_pct": test["latency_delta_pct"],
        "suspected_cause": cause,
        "evidence": said,
        "recommendation": RECOMMENDATIONS[cause] if cause else None,
        "latency_delta_ci95_pct": test["latency_delta_ci95_pct"],
        "p_value": test["p_value"],
        "test": "Mann-Whitney U, one-sided: session latencies greater than baseline",
        "improvement": test["improvement"],
        "p_value_faster": test["p_value_faster"],
        "thresholds": {"alpha": alpha, "min_delta_pct": min_delta_pct},
        "latency": {
            "baseline": {**(base.get("latency") or {}), "iterations": base.get("iterations")},
            "session": {**(session.get("latency") or {}), "iterations": session.get("iterations")},
        },
        "kernels": {
            "per_iteration": {
                "baseline": base.get("kernels_per_iteration"),
                "session": session.get("kernels_per_iteration"),
                "delta_pct": _pct(session.get("kernels_per_iteration"), base.get("kernels_per_iteration")),
            },
            "family_time_per_iteration_s": {
                f: {"baseline": fb.get(f, 0.0), "session": fs.get(f, 0.0), "delta_pct": _pct(fs.get(f, 0.0), fb.get(f))}
                for f in sorted(set(fb) | set(fs))
            },
        },
        "attribution_per_iteration_s": parts,
        "clock_drop": drop,
        "bottleneck": {
            "baseline": (base.get("bottleneck") or {}).get("bottleneck_class"),
            "session": (session.get("bottleneck") or {}).get("bottleneck_class"),
        },
        "roofline_changes": changes,
    }
