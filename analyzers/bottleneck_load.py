"""A model's serving load for the bottleneck analyzer: served requests summed in bins of their end time.

The queue-bound evidence (docs/bottleneck_taxonomy.md): over the last window of request end times,
the queue share (queue time over request duration, both from ``request_series``), the mean queue
time, and output tokens per second (over the span of the requests' end times) and per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import pyarrow as pa

from aaco.analyzers.base import ratio
from aaco.analyzers.grouping import group
from aaco.contract.serving import request_series

BINS: Final = 30  # the window is kept in this many bins
# a bin's sums: requests, queue s, requests with a queue time, queue s and duration s of requests with
# both, output tokens; then the first and last request end (ns)
_N, _Q, _QN, _PQ, _PD, _TOK, _FIRST, _LAST = range(8)


@dataclass(frozen=True)
class ServingLoad:
    """A model's served requests over the window: the queue-bound evidence."""

    requests: int
    queue_share: float | None  # sum of queue time / sum of request duration
    mean_queue_s: float | None
    output_tokens_per_s: float | None  # over the span of the requests' end times
    output_tokens_per_s_per_gpu: float | None  # over the model's GPUs
    gpus: int

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {
            "requests": self.requests,
            "queue_share": self.queue_share,
            "mean_queue_s": self.mean_queue_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "output_tokens_per_s_per_gpu": self.output_tokens_per_s_per_gpu,
            "gpus": self.gpus,
        }


def request_sums(b: pa.RecordBatch, model: pa.Array, bin_ns: int) -> tuple[list[tuple[Any, ...]], np.ndarray]:
    """Keys ``(node, model, bin)`` of a ``requests`` batch and each one's sums (a row per key)."""
    values = request_series(b).values
    queue, duration = values["queue_s"], values["duration_s"]
    has_queue = ~np.isnan(queue)
    paired = has_queue & ~np.isnan(duration)
    tokens = b.column("output_tokens").to_numpy(zero_copy_only=False).astype(np.float64)
    ends = b.column("end_ns").to_numpy()
    groups = group(b.column("node"), model, pa.array(ends // bin_ns))
    k = len(groups.keys)
    sums = np.stack(
        [
            np.bincount(groups.index, minlength=k).astype(np.float64),
            np.bincount(groups.index, np.where(has_queue, queue, 0.0), k),
            np.bincount(groups.index, has_queue.astype(np.float64), k),
            np.bincount(groups.index, np.where(paired, queue, 0.0), k),
            np.bincount(groups.index, np.where(paired, duration, 0.0), k),
            np.bincount(groups.index, np.nan_to_num(tokens), k),
            groups.mins(ends).astype(np.float64),
            groups.maxs(ends).astype(np.float64),
        ],
        axis=1,
    )
    return groups.keys, sums


@dataclass
class LoadBins:
    """One model's request sums by bin of end time; bins a window older than the newest are dropped."""

    bins: dict[int, np.ndarray] = field(default_factory=dict)

    def add(self, index: int, sums: np.ndarray) -> None:
        """Fold one bin's sums in (a bin already older than the window is ignored)."""
        newest = max(self.bins, default=index)
        if index <= newest - BINS:
            return
        acc = self.bins.get(index)
        if acc is None:
            self.bins[index] = sums.copy()
        else:
            acc[:_FIRST] += sums[:_FIRST]
            acc[_FIRST] = min(acc[_FIRST], sums[_FIRST])
            acc[_LAST] = max(acc[_LAST], sums[_LAST])
        if index > newest:
            for old in [i for i in self.bins if i <= index - BINS]:
                del self.bins[old]

    def load(self, gpus: int) -> ServingLoad | None:
        """The load over the window, per GPU over ``gpus``; None when no request is held."""
        if not self.bins:
            return None
        t = np.stack(list(self.bins.values()))
        total = t[:, :_FIRST].sum(axis=0)
        span_s = (t[:, _LAST].max() - t[:, _FIRST].min()) / 1e9
        per_s = float(total[_TOK] / span_s) if span_s > 0 else None
        return ServingLoad(
            requests=int(total[_N]),
            queue_share=ratio(float(total[_PQ]), float(total[_PD])),
            mean_queue_s=ratio(float(total[_Q]), float(total[_QN])),
            output_tokens_per_s=per_s,
            output_tokens_per_s_per_gpu=per_s / gpus if per_s is not None and gpus else None,
            gpus=gpus,
        )

    @property
    def last_end_ns(self) -> int:
        """The newest request end held (0 when none)."""
        return int(max((s[_LAST] for s in self.bins.values()), default=0))
