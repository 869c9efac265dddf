"""What throttling costs in iteration latency, per model: inside versus outside episodes (docs/throttle.md)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.analyzers.grouping import group
from aaco.analyzers.stats import MedianRatio, Reservoir, median_ratio
from aaco.analyzers.throttle_episodes import Gpu
from aaco.analyzers.throttle_settings import ThrottleSettings
from aaco.contract.snapshot import Finding

# node, model, start_ns, end_ns, trace id
_Pending = tuple[str, str, int, int, str | None]
MAX_DEVICES_PER_MODEL = 64


@dataclass(frozen=True)
class ImpactRow:
    """The latency impact of throttling on one model, as the snapshot reports it."""

    ratio: float | None
    ci: tuple[float, float] | None
    median_inside_s: float | None
    median_outside_s: float | None
    significant: bool
    enough: bool  # both sides have min_samples iterations
    inside: int
    outside: int
    unknown: int
    gpus_from: str  # kernels | node

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``iterations``: inside, outside, unknown)."""
        return {
            "ratio": self.ratio,
            "ci": list(self.ci) if self.ci is not None else None,
            "median_inside_s": self.median_inside_s,
            "median_outside_s": self.median_outside_s,
            "significant": self.significant,
            "enough": self.enough,
            "iterations": {"inside": self.inside, "outside": self.outside, "unknown": self.unknown},
            "gpus_from": self.gpus_from,
        }


class _Model:
    """Latency reservoirs of one model, inside and outside episodes, and the latest estimate."""

    def __init__(self, size: int, rng: np.random.Generator) -> None:
        self.inside = Reservoir(size, rng)
        self.outside = Reservoir(size, rng)
        self.unknown = 0
        self.estimated_at = (0, 0)
        self.estimate: MedianRatio | None = None
        self.significant = False


class LatencyImpact:
    """Iterations waiting for telemetry, the GPUs of each model, and each model's impact estimate.

    ``gpus`` is the episode tracker's map of GPUs; ``emit`` receives a finding when a model's impact
    becomes significant.
    """

    def __init__(self, settings: ThrottleSettings, max_models: int, emit: Callable[[Finding], None]) -> None:
        self.settings = settings
        self.max_models = max_models
        self.pending: deque[_Pending] = deque()
        self.model_devices: dict[tuple[str, str], set[str]] = {}
        self.models: dict[tuple[str, str], _Model] = {}
        self._rng = np.random.default_rng(settings.seed)  # reservoir sampling (deterministic for a given input)
        self._emit = emit

    def kernels(self, b: pa.RecordBatch) -> None:
        """Learn which GPUs each model's kernels ran on."""
        for node, model, device in group(b.column("node"), b.column("model"), b.column("device")).keys:
            if model is None or device is None:
                continue
            devs = self.model_devices.get((node, model))
            if devs is None:
                if len(self.model_devices) >= self.max_models:
                    continue
                devs = self.model_devices[(node, model)] = set()
            if len(devs) < MAX_DEVICES_PER_MODEL:
                devs.add(device)

    def iterations(self, b: pa.RecordBatch) -> int:
        """Queue iterations for classification; returns how many the ``max_pending`` bound dropped."""
        rows = zip(
            b.column("node").to_pylist(),
            b.column("model").fill_null("unknown").to_pylist(),
            b.column("start_ns").to_pylist(),
            b.column("end_ns").to_pylist(),
            b.column("trace_id").to_pylist(),
            strict=True,
        )
        self.pending.extend(rows)
        dropped = 0
        while len(self.pending) > self.settings.max_pending:
            self.pending.popleft()
            dropped += 1
        return dropped

    def devices_of(self, gpus: dict[tuple[str, str], Gpu], node: str, model: str) -> list[Gpu]:
        """The GPUs the model's kernels ran on, else every GPU of its node."""
        devs = self.model_devices.get((node, model))
        mine = [gpus[(node, d)] for d in sorted(devs or ()) if (node, d) in gpus]
        return mine or [g for (n, _), g in gpus.items() if n == node]

    def classify(self, gpus: dict[tuple[str, str], Gpu], now_ns: int) -> int:
        """Score the pending iterations their GPUs' telemetry covers; returns how many ``max_models`` dropped."""
        if not self.pending:
            return 0
        waiting: deque[_Pending] = deque()
        ready: dict[tuple[str, str], list[tuple[int, int]]] = {}
        gpus_of: dict[tuple[str, str], list[Gpu]] = {}
        for row in self.pending:
            key = (row[0], row[1])
            mine = gpus_of.get(key)
            if mine is None:
                mine = gpus_of[key] = self.devices_of(gpus, *key)
            if mine and min(g.last_ts for g in mine) < row[3]:
                waiting.append(row)
            else:
                ready.setdefault(key, []).append((row[2], row[3]))
        self.pending = waiting
        dropped = 0
        for key, rows in ready.items():
            imp = self.models.get(key)
            if imp is None:
                if len(self.models) >= self.max_models:
                    dropped += len(rows)
                    continue
                imp = self.models[key] = _Model(self.settings.reservoir, self._rng)
            self._fold(imp, gpus_of[key], rows)
            self._maybe_estimate(key, imp, gpus, now_ns)
        return dropped

    @staticmethod
    def _fold(imp: _Model, gpus: list[Gpu], rows: list[tuple[int, int]]) -> None:
        starts = np.array([r[0] for r in rows], dtype=np.float64)
        ends = np.array([r[1] for r in rows], dtype=np.float64)
        # no telemetry on the node, or older than what is kept of it: cannot tell
        kept_from = max((g.kept_from_ns for g in gpus), default=None)
        unknown = np.ones(len(rows), dtype=bool) if kept_from is None else starts < kept_from
        inside = np.zeros(len(rows), dtype=bool)
        for g in gpus:
            s, e = g.intervals()
            if s.size:
                j = np.searchsorted(s, ends, side="left") - 1  # the last episode starting before the iteration ends
                inside |= (j >= 0) & (e[np.maximum(j, 0)] > starts)
        lat = (ends - starts) / 1e9
        imp.unknown += int(unknown.sum())
        imp.inside.add(lat[inside & ~unknown])
        imp.outside.add(lat[~inside & ~unknown])

    def _enough(self, imp: _Model) -> bool:
        return imp.inside.seen >= self.settings.min_samples and imp.outside.seen >= self.settings.min_samples

    def _maybe_estimate(self, key: tuple[str, str], imp: _Model, gpus: dict[tuple[str, str], Gpu], now: int) -> None:
        """Re-estimate when either side grew by 10 % (at least 10 values); report a newly significant impact."""
        n_in, n_out = imp.inside.seen, imp.outside.seen
        last_in, last_out = imp.estimated_at
        grew = n_in >= max(last_in * 1.1, last_in + 10) or n_out >= max(last_out * 1.1, last_out + 10)
        if not grew or n_in < 2 or n_out < 2:
            return
        imp.estimated_at = (n_in, n_out)
        # Seeded by the counts: the same input gives the same interval.
        est = imp.estimate = median_ratio(
            imp.inside.sample(),
            imp.outside.sample(),
            self.settings.bootstrap,
            np.random.default_rng((self.settings.seed, n_in, n_out)),
        )
        significant = self._enough(imp) and (est.ci[0] > 1.0 or est.ci[1] < 1.0)
        if significant and not imp.significant and est.ratio is not None:
            node, model = key
            severity = "critical" if est.ratio >= 1.5 else ("warning" if est.ratio >= 1.05 else "info")
            lo, hi = est.ci
            summary = (
                f"{model}: iterations during GPU throttling take x{est.ratio:.2f} the median latency of the others "
                f"(95 % CI {lo:.2f}-{hi:.2f}, {n_in} vs {n_out} iterations)"
            )
            evidence = {
                "ratio": est.ratio,
                "ci": [lo, hi],
                "median_inside_s": est.median_a,
                "median_outside_s": est.median_b,
                "iterations_inside": n_in,
                "iterations_outside": n_out,
                "gpus": [g.gpu for g in self.devices_of(gpus, node, model)],
            }
            self._emit(Finding(now, node, "throttle", model, severity, 0.95, summary, evidence))
        imp.significant = significant

    def rows(self) -> dict[tuple[str, str], ImpactRow]:
        """Every model's impact as it stands."""
        out = {}
        for key, imp in self.models.items():
            est = imp.estimate
            has = est is not None and est.ratio is not None
            out[key] = ImpactRow(
                ratio=est.ratio if has and est is not None else None,
                ci=est.ci if has and est is not None else None,
                median_inside_s=est.median_a if est is not None else None,
                median_outside_s=est.median_b if est is not None else None,
                significant=imp.significant,
                enough=self._enough(imp),
                inside=imp.inside.seen,
                outside=imp.outside.seen,
                unknown=imp.unknown,
                gpus_from="kernels" if self.model_devices.get(key) else "node",
            )
        return out
