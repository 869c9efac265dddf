"""What the per-batch layout cache (``aaco.analyzers.layout``) saves the telemetry and throttle analyzers.

A GPU telemetry source sends the same rows sample after sample: 8 GPUs, 19 readings each (152 rows:
utilisation, power and its cap, memory, energy, three clocks and their maxima, three temperatures,
four throttle flags), one sample time per batch. Each analyzer folds 1,900 such batches after 100 of
warm-up, once as built and once with a cache that never matches (so every batch takes the full
path); the best of three runs is reported in milliseconds per batch. Prints one JSON line.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import pyarrow as pa

from aaco.analyzers.base import Analyzer
from aaco.analyzers.layout import LayoutCache
from aaco.analyzers.telemetry import TelemetryAnalyzer
from aaco.analyzers.throttle import ThrottleAnalyzer
from aaco.contract.schemas import ATTRS, EventBatch, conform
from aaco.contract.telemetry import THROTTLE_REASONS

S = 1_000_000_000
GPUS = 8


def sample(t: int, rng: np.random.Generator) -> EventBatch:
    """One telemetry sample of every GPU at ``t`` seconds."""
    rows: list[tuple[str, str, float, dict[str, str]]] = []
    for g in range(GPUS):
        gpu = str(g)
        rows += [
            (gpu, "hw.gpu.utilization", float(rng.random()), {}),
            (gpu, "hw.gpu.power", 250 + float(rng.random()), {}),
            (gpu, "aaco.gpu.power.limit", 300.0, {}),
            (gpu, "hw.gpu.memory.usage", 1e9, {}),
            (gpu, "hw.gpu.memory.limit", 6.4e10, {}),
            (gpu, "aaco.gpu.energy", 1e6 * t, {}),
        ]
        rows += [(gpu, "hw.gpu.clock", 1.5e9, {"clock": c}) for c in ("graphics", "memory", "soc")]
        rows += [(gpu, "hw.gpu.clock.max", 1.7e9, {"clock": c}) for c in ("graphics", "memory", "soc")]
        rows += [(gpu, "hw.gpu.temperature", 60.0, {"sensor": s}) for s in ("edge", "junction", "memory")]
        rows += [(gpu, "aaco.gpu.throttle.active", 0.0, {"reason": r}) for r in THROTTLE_REASONS]
    n = len(rows)
    table = pa.table(
        {
            "ts_ns": [t * S] * n,
            "node": ["node-a"] * n,
            "device": [r[0] for r in rows],
            "metric": [r[1] for r in rows],
            "value": [r[2] for r in rows],
            "unit": ["1"] * n,
            "attributes": pa.array([list(r[3].items()) for r in rows], ATTRS),
        }
    )
    return EventBatch("telemetry", conform("telemetry", table), "smi")


class NeverMatches(LayoutCache[Any]):
    """A layout cache that never has the batch: every batch takes the full path."""

    def get(self, layout: pa.RecordBatch, tag: Hashable = None) -> Any:
        """Nothing kept."""
        return None


def ms_per_batch(make: Callable[[], Analyzer], batches: list[EventBatch], warmup: int = 100) -> float:
    """Best of three runs, milliseconds per batch after ``warmup`` batches."""
    best = float("inf")
    for _ in range(3):
        a = make()
        for b in batches[:warmup]:
            a.update(b)
        t0 = time.perf_counter()
        for b in batches[warmup:]:
            a.update(b)
        best = min(best, (time.perf_counter() - t0) / (len(batches) - warmup) * 1e3)
    return best


def without_cache(a: Analyzer) -> Analyzer:
    """``a`` with its layout cache replaced by one that never matches."""
    cache = a._layout  # type: ignore[attr-defined]
    a._layout = NeverMatches(cache.columns)  # type: ignore[attr-defined]
    return a


def main() -> None:
    """Both analyzers, with and without the cache."""
    rng = np.random.default_rng(0)
    batches = [sample(1_700_000_000 + t, rng) for t in range(2000)]
    out: dict[str, Any] = {"rows_per_batch": batches[0].batch.num_rows, "gpus": GPUS}
    for name, cls in (("telemetry", TelemetryAnalyzer), ("throttle", ThrottleAnalyzer)):
        out[f"{name}_ms"] = round(ms_per_batch(cls, batches), 4)
        out[f"{name}_without_cache_ms"] = round(ms_per_batch(lambda c=cls: without_cache(c()), batches), 4)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
