"""The critical path's shares of a rank's recent steps (the iteration rows' ``cp_*`` columns; docs/jobs.md).

Each step's path is HTA 0.5.0's lightweight critical path, found at ingest
(``agent/sources/traces/kineto_critical.py``); its length is the sum of its five bounds. A rank's
shares are each bound's summed time over the summed length of its steps with a path, so a long step
weighs more than a short one, as the time a user would save does.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import numpy as np
import pyarrow as pa

# the iteration columns, length first, then the bounds in the order of BOUNDS
COLUMNS: Final = ("cp_length_ns", "cp_cpu_ns", "cp_compute_ns", "cp_comm_ns", "cp_launch_ns", "cp_gap_ns")
# HTA's bound_by: cpu_bound, gpu_compute_bound, gpu_communication_bound, gpu_kernel_launch_overhead,
# gpu_kernel_kernel_overhead
BOUNDS: Final = ("cpu", "compute", "comm", "launch", "gap")

StepPath = tuple[int, ...]  # length, then the bounds, in ns


def step_paths(batch: pa.RecordBatch) -> list[StepPath | None]:
    """Per iteration row its path (length and bounds), None where the step has none."""
    if not all(c in batch.schema.names for c in COLUMNS):
        return [None] * batch.num_rows
    cols = [batch.column(c).to_pylist() for c in COLUMNS]
    return [None if row[0] is None or None in row else row for row in zip(*cols, strict=True)]


@dataclass(frozen=True)
class CriticalShares:
    """A rank's critical path over its recent steps: the median length and each bound's share (0..1)."""

    steps: int
    length_p50_s: float
    shares: dict[str, float]  # bound -> share of the summed length

    def to_dict(self) -> dict[str, float | int]:
        """JSON form: percentages 0..100 as the rest of a rank's figures."""
        return {
            "steps": self.steps,
            "length_p50_s": self.length_p50_s,
            **{f"{bound}_pct": 100 * share for bound, share in self.shares.items()},
        }


def critical_shares(paths: Iterable[StepPath | None]) -> CriticalShares | None:
    """The shares over the steps that have a path of positive length; None when none has."""
    rows = np.array([p for p in paths if p is not None and p[0] > 0], np.int64).reshape(-1, len(COLUMNS))
    if rows.shape[0] == 0:
        return None
    total = rows.sum(axis=0)
    shares = {bound: float(total[i + 1] / total[0]) for i, bound in enumerate(BOUNDS)}
    return CriticalShares(int(rows.shape[0]), float(np.median(rows[:, 0])) / 1e9, shares)
