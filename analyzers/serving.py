"""LLM serving per (model, namespace, pod): TTFT, time per output token, durations, tokens, finish reasons.

Folds the ``requests`` rows the OTLP receiver reads from servers' request spans into cumulative
histograms (bounds in ``contract/serving.py``) and counters, as Prometheus expects. Each bucket's
exemplar is the latest request's trace id in that bucket, stamped with the request's end. The
per-request values (time per output token, duration, and why TPOT was left out) are
``contract.serving.request_series``. Bounded: at most ``max_groups`` (model, namespace, pod) groups
and ``max_finish_reasons`` finish reasons per group (further ones count as ``other``).
docs/serving.md.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from pydantic import Field, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.analyzers.grouping import group
from aaco.analyzers.stats import Histogram
from aaco.contract.config_base import StrictModel
from aaco.contract.schemas import EventBatch
from aaco.contract.serving import (
    HISTOGRAMS,
    REQUEST_COUNT,
    REQUESTS_SKIPPED,
    TOKEN_COUNT,
    request_series,
)
from aaco.contract.signals import HistogramValue, MetricPoint, PointBuilder

Group = tuple[str, str, str]  # model, namespace, pod
OTHER_REASON = "other"
UNKNOWN_REASON = "unknown"


@dataclass
class _Group:
    hists: dict[str, Histogram]
    tokens: Counter[str] = field(default_factory=Counter)
    finish: Counter[str] = field(default_factory=Counter)
    skipped: Counter[str] = field(default_factory=Counter)


@dataclass(frozen=True)
class _Rows:
    """A requests batch's columns as the fold reads them, one entry per row."""

    values: dict[str, np.ndarray]  # request_series values
    reasons: dict[str, np.ndarray]  # request_series skip masks
    traces: np.ndarray
    ends: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    finish: np.ndarray


@dataclass(frozen=True)
class GroupStats:
    """One (model, namespace, pod): request count, tokens, finish reasons, skips and histograms."""

    requests: int
    input_tokens: int
    output_tokens: int
    finish_reasons: dict[str, int]
    skipped: dict[str, int]
    histograms: dict[str, HistogramValue]  # by field: ttft_s, tpot_s, duration_s, queue_s, prefill_s, decode_s

    def to_dict(self) -> dict[str, Any]:
        """JSON form: counts, and per histogram its count and mean (seconds)."""
        return {
            "requests": self.requests,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "finish_reasons": dict(sorted(self.finish_reasons.items())),
            "skipped": dict(sorted(self.skipped.items())),
            **{
                name: {"count": h.count, "mean_s": h.total / h.count if h.count else None}
                for name, h in self.histograms.items()
            },
        }


@dataclass(frozen=True)
class ServingResult:
    """Serving statistics per (model, namespace, pod), and requests past the group bound."""

    groups: dict[Group, GroupStats]
    over_limit: int

    def to_dict(self) -> dict[str, Any]:
        """``{"groups": [{"model", "namespace", "pod", ...}], "over_limit": n}``."""
        return {
            "groups": [
                {"model": m, "namespace": ns, "pod": pod, **g.to_dict()}
                for (m, ns, pod), g in sorted(self.groups.items())
            ],
            "over_limit": self.over_limit,
        }

    def points(self) -> list[MetricPoint]:
        """Histograms (those with observations), token, request and skip counters."""
        pb = PointBuilder()
        for (model, ns, pod), g in self.groups.items():
            labels = {"model": model, "namespace": ns, "pod": pod}
            for name, hist in g.histograms.items():
                if hist.count:
                    pb.add(HISTOGRAMS[name], hist, **labels)
            pb.add(TOKEN_COUNT, g.input_tokens, type="input", **labels)
            pb.add(TOKEN_COUNT, g.output_tokens, type="output", **labels)
            for reason, n in g.finish_reasons.items():
                pb.add(REQUEST_COUNT, n, finish_reason=reason, **labels)
            for reason, n in g.skipped.items():
                pb.add(REQUESTS_SKIPPED, n, reason=reason, **labels)
        if self.over_limit:
            pb.add(REQUESTS_SKIPPED, self.over_limit, model="", namespace="", pod="", reason="series_limit")
        return pb.points


class ServingSettings(StrictModel):
    """LLM serving metrics from request spans (TTFT, time per output token, tokens)."""

    max_groups: PositiveInt | None = Field(
        None, description="(model, namespace, pod) groups tracked at once; default analyzers.max_models."
    )
    max_finish_reasons: PositiveInt = Field(16, description="Finish reasons kept per group (others: other).")


def _floats(b: pa.RecordBatch, name: str) -> np.ndarray:
    return b.column(name).to_numpy(zero_copy_only=False).astype(np.float64)  # nulls -> NaN


def _strings(b: pa.RecordBatch, name: str, default: str) -> np.ndarray:
    # numpy rather than pc.fill_null: the compute call costs ~50 us, more than the rest on small batches
    col = b.column(name)
    values = col.to_numpy(zero_copy_only=False).astype(object)
    if col.null_count:
        values[np.equal(values, None)] = default
    return values


class ServingAnalyzer(Analyzer):
    """Folds ``requests`` rows into per-(model, namespace, pod) serving histograms and counters."""

    name = "serving"
    kinds = frozenset({"requests"})

    def __init__(self, max_groups: int = 256, max_finish_reasons: int = 16) -> None:
        self._max_groups = max_groups
        self._max_reasons = max_finish_reasons
        self._bounds = {name: np.array(m.buckets, dtype=np.float64) for name, m in HISTOGRAMS.items()}
        self._groups: dict[Group, _Group] = {}
        self.over_limit = 0

    def _group(self, key: Group) -> _Group | None:
        g = self._groups.get(key)
        if g is None and len(self._groups) < self._max_groups:
            hists = {n: Histogram(b) for n, b in self._bounds.items()}
            g = self._groups[key] = _Group(hists)
        return g

    def update(self, item: EventBatch) -> None:
        """Fold a requests batch in: the per-request values once for the batch, then each group's rows."""
        b = item.batch
        if b.num_rows == 0:
            return
        groups = group(b.column("model"), b.column("namespace"), b.column("pod"))
        series = request_series(b)
        rows = _Rows(
            series.values,
            series.reasons,
            _strings(b, "trace_id", ""),
            b.column("end_ns").to_numpy(),
            _floats(b, "input_tokens"),
            _floats(b, "output_tokens"),
            _strings(b, "finish_reason", UNKNOWN_REASON),
        )
        for i, key in enumerate(groups.keys):
            sel = groups.mask(i)
            g = self._group(tuple("" if k is None else k for k in key))  # type: ignore[arg-type]
            if g is None:
                self.over_limit += int(groups.counts()[i])
                continue
            self._fold(g, rows, sel)

    def _fold(self, g: _Group, r: _Rows, sel: np.ndarray | slice) -> None:
        traces, ends = r.traces[sel], r.ends[sel]
        for reason, mask in r.reasons.items():
            n = int(mask[sel].sum())
            if n:
                g.skipped[reason] += n
        for name, column in r.values.items():
            values = column[sel]
            present = ~np.isnan(values)
            g.hists[name].add(values[present], traces[present], ends[present])
        g.tokens["input"] += int(np.nansum(r.input_tokens[sel]))
        g.tokens["output"] += int(np.nansum(r.output_tokens[sel]))
        for reason, n in Counter(r.finish[sel].tolist()).items():
            key = reason if reason in g.finish or len(g.finish) < self._max_reasons else OTHER_REASON
            g.finish[key] += n

    def snapshot(self) -> ServingResult:
        """Current statistics."""
        groups = {
            key: GroupStats(
                requests=sum(g.finish.values()),
                input_tokens=g.tokens["input"],
                output_tokens=g.tokens["output"],
                finish_reasons=dict(g.finish),
                skipped=dict(g.skipped),
                histograms={n: h.value() for n, h in g.hists.items()},
            )
            for key, g in self._groups.items()
        }
        return ServingResult(groups, self.over_limit)


def create(s: ServingSettings, hints: AgentHints, max_models: int) -> ServingAnalyzer:
    """The analyzer for its settings (the group bound defaults to the agent's model bound)."""
    return ServingAnalyzer(s.max_groups or max_models, s.max_finish_reasons)
