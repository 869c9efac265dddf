"""Each GPU's health verdict, live: ``aaco_gpu_health{gpu,status}`` and a finding when it changes (docs/health.md).

The telemetry rows of every sample are folded, per node and GPU, into a ``contract.health.HealthJudge``
(the rules and thresholds ``aaco health`` uses), the ``xid`` source's rows as the GPU's XIDs. A GPU
is its PCI address where the rows carry one (so the smi and xid sources' rows of one GPU meet, and two
sources' GPU 0 stay apart), else its source and index; it is named by its index. The
verdict is taken at the newest sample's time. When a GPU's status changes the analyzer emits a
finding with the reasons; the trace ID of the last kernel seen on that GPU goes with it, so the job
that was running links to the event. Bounded: ``max_gpus`` GPUs (the least recently seen forgotten
first).
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PositiveInt

from aaco.analyzers.base import AgentHints, Analyzer
from aaco.contract.health import RULE_READINGS, STATUSES, GpuHealth, HealthJudge, HealthThresholds, XidSeen
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define
from aaco.contract.snapshot import Finding
from aaco.contract.telemetry import (
    ATTR_PCI,
    ATTR_XID_LAST,
    SERIES_ATTRIBUTE,
    XID_ERRORS,
    GpuIdentity,
    GpuSample,
    Reading,
)
from aaco.contract.xid import lookup

HEALTH = define(
    "aaco.gpu.health",
    "aaco_gpu_health",
    "gauge",
    "1",
    "1 for a GPU's current health status (healthy, warning, unhealthy, unknown), 0 for the others "
    "(docs/health.md: the rules and thresholds).",
    ("node", "gpu", "gpu_uuid", "status"),
)
REASON = define(
    "aaco.gpu.health.reason",
    "aaco_gpu_health_reason",
    "gauge",
    "1",
    "1 while a reason holds for a GPU not healthy (ecc_uncorrected, row_remap_failure, retired_pages_limit, "
    "retired_pages_pending, row_remap_pending, pcie_replays_rising, ecc_corrected_rising, thermal_slowdown, "
    "gpu_lost, xid_<code>).",
    ("node", "gpu", "reason"),
)


@functools.cache
def _read() -> pa.Array:
    """The readings the analyzer folds: the rules' and the XIDs.

    Built on first use: pyarrow's conversion of a list at import time would import pandas, which the
    agent keeps out.
    """
    return pa.array(sorted(RULE_READINGS | {XID_ERRORS}), pa.string())


_SEVERITY: Final = {"unhealthy": "critical", "warning": "warning", "healthy": "info", "unknown": "info"}


class HealthSettings(HealthThresholds):
    """Each GPU's health verdict from its health readings (docs/health.md)."""

    max_gpus: PositiveInt = Field(1024, description="GPUs judged at once, over every node seen.")


@dataclass(frozen=True)
class HealthResult:
    """Every GPU's verdict, by node."""

    verdicts: tuple[tuple[str, GpuHealth], ...]  # (node, verdict)

    def to_dict(self) -> dict[str, Any]:
        """``{"gpus": [{"node", "gpu", "uuid", "status", "reasons"}]}``."""
        return {"gpus": [{"node": node, **v.to_dict()} for node, v in self.verdicts]}

    def points(self) -> list[MetricPoint]:
        """A 0/1 gauge per status of every GPU, and one per reason that holds."""
        pb = PointBuilder()
        for node, v in self.verdicts:
            for status in STATUSES:
                pb.add(HEALTH, float(v.status == status), node=node, gpu=v.gpu, gpu_uuid=v.uuid, status=status)
            for r in v.reasons:
                pb.add(REASON, 1.0, node=node, gpu=v.gpu, reason=r.code)
        return pb.points


class HealthAnalyzer(Analyzer):
    """Judges every GPU from its telemetry rows; remembers the last kernel's trace per GPU for its findings."""

    name = "health"
    kinds = frozenset({"telemetry", "kernels"})

    def __init__(self, settings: HealthSettings | None = None) -> None:
        self.s = settings or HealthSettings()
        thresholds = HealthThresholds(**self.s.model_dump(exclude={"max_gpus"}))
        self._judges: dict[str, HealthJudge] = {}
        self._thresholds = thresholds
        self._seen: OrderedDict[tuple[str, str], int] = OrderedDict()  # (node, gpu) -> newest ts
        self._status: dict[tuple[str, str], str] = {}
        self._traces: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._names: dict[tuple[str, str], str] = {}  # (node, GPU key) -> its index (the device column)
        self._newest = 0

    def update(self, item: EventBatch) -> None:
        """Telemetry: one GpuSample per (node, GPU, time) into its node's judge. Kernels: their trace IDs."""
        if item.kind == "kernels":
            self._kernels(item.batch)
            return
        b = item.batch.filter(pc.is_in(item.batch.column("metric"), _read()))  # the rules' readings only
        cols = {
            c: b.column(c).to_pylist() for c in ("ts_ns", "node", "device", "metric", "value", "gpu_uuid", "source")
        }
        attrs = b.column("attributes").to_pylist()
        samples: dict[tuple[str, str, int], GpuSample] = {}
        xids: list[tuple[str, str, int, XidSeen]] = []
        for i, metric in enumerate(cols["metric"]):
            node, device, ts = cols["node"][i], cols["device"][i], cols["ts_ns"][i]
            a = dict(attrs[i] or ())
            gpu = a.get(ATTR_PCI) or f"{cols['source'][i] or item.source}:{device}"  # the GPU, whoever reads it
            if metric == XID_ERRORS:
                self._names.setdefault((node, gpu), device)
                xids.append((node, gpu, ts, _xid(a, cols["value"][i])))
                continue
            self._names[(node, gpu)] = device
            s = samples.get((node, gpu, ts))
            if s is None:
                s = samples[(node, gpu, ts)] = GpuSample(GpuIdentity(gpu, uuid=cols["gpu_uuid"][i] or ""))
            key = SERIES_ATTRIBUTE.get(metric)
            own = ((key, a[key]),) if key is not None and key in a else ()
            s.readings.append(Reading(metric, float(cols["value"][i]), own))
        touched: set[tuple[str, str]] = set()
        for (node, gpu, ts), sample in sorted(samples.items(), key=lambda kv: kv[0][2]):
            judge = self._judge(node, gpu, ts)
            if judge is not None:
                judge.observe(ts, sample)
                self._newest = max(self._newest, ts)
                touched.add((node, gpu))
        for node, gpu, ts, seen in xids:
            judge = self._judge(node, gpu, ts)
            if judge is not None:
                judge.xid(gpu, seen)
                self._newest = max(self._newest, ts)
                touched.add((node, gpu))
        self._report_changes(touched)

    def _judge(self, node: str, gpu: str, ts: int) -> HealthJudge | None:
        key = (node, gpu)
        if key not in self._seen and len(self._seen) >= self.s.max_gpus:
            (old_node, old_gpu), _ = self._seen.popitem(last=False)
            self._judges[old_node].forget(old_gpu)
            self._status.pop((old_node, old_gpu), None)
            self._names.pop((old_node, old_gpu), None)
        self._seen[key] = max(ts, self._seen.pop(key, ts))
        judge = self._judges.get(node)
        if judge is None:
            judge = self._judges[node] = HealthJudge(self._thresholds, max_gpus=self.s.max_gpus)
        return judge

    def _kernels(self, b: pa.RecordBatch) -> None:
        """Each GPU's last trace ID in the batch, the GPUs in the order of their last kernel (a GPU at a time)."""
        if b.num_rows == 0 or "trace_id" not in b.schema.names:
            return
        cols = ("node", "device", "trace_id")
        rows = pa.table([*(b.column(k) for k in cols), pa.array(np.arange(b.num_rows))], names=[*cols, "at"])
        traced = pc.fill_null(pc.not_equal(rows["trace_id"], ""), False)
        rows = rows.filter(pc.and_(rows["device"].is_valid(), traced))
        last = rows.group_by(["node", "device"], use_threads=False).aggregate([("at", "max")])
        picked = b.select(list(cols)).take(np.sort(last.column("at_max").to_numpy())).to_pydict()
        for node, device, trace in zip(*picked.values(), strict=True):
            self._traces.pop((node, device), None)
            self._traces[(node, device)] = trace
        while len(self._traces) > self.s.max_gpus:
            self._traces.popitem(last=False)

    def _named(self, node: str, v: GpuHealth) -> tuple[str, str, GpuHealth]:
        """(node, GPU key, verdict), the verdict named by its index (the ``device`` its rows carry)."""
        return node, v.gpu, replace(v, gpu=self._names.get((node, v.gpu), v.gpu))

    def _verdicts(self) -> list[tuple[str, str, GpuHealth]]:
        return [
            self._named(node, v) for node, judge in sorted(self._judges.items()) for v in judge.verdicts(self._newest)
        ]

    def _report_changes(self, touched: set[tuple[str, str]]) -> None:
        """A finding for each GPU of this update whose status changed."""
        changed = [self._named(node, self._judges[node].verdict(gpu, self._newest)) for node, gpu in sorted(touched)]
        for node, key, v in changed:
            before = self._status.get((node, key))
            self._status[(node, key)] = v.status
            if before == v.status or (before is None and v.status in ("healthy", "unknown")):
                continue
            why = "; ".join(f"{r.code}: {r.detail}" for r in v.reasons) or "no problem left"
            self.emit(
                Finding(
                    ts_ns=self._seen.get((node, key), self._newest),
                    node=node,
                    analyzer=self.name,
                    subject=f"gpu {v.gpu}",
                    severity=_SEVERITY[v.status],
                    confidence=1.0,
                    summary=f"gpu {v.gpu}: {before or 'unknown'} -> {v.status} ({why})",
                    evidence={"gpu": v.gpu, "uuid": v.uuid, "status": v.status, "previous": before, **v.to_dict()},
                    trace_id=self._traces.get((node, v.gpu)),
                )
            )

    def snapshot(self) -> HealthResult:
        """Every GPU's verdict now."""
        return HealthResult(tuple((node, v) for node, _, v in self._verdicts()))


def _xid(attrs: dict[str, str], count: float) -> XidSeen:
    """An XID row (the ``xid`` source's) as the judge takes it, with the catalogue's severity."""
    code = int(attrs.get("xid", "0") or 0)
    last = attrs.get(ATTR_XID_LAST, "")
    x = lookup(code)
    return XidSeen(code, x.severity, x.description, int(count), int(last) if last.isdigit() else None)


def create(s: HealthSettings, hints: AgentHints, max_models: int) -> HealthAnalyzer:
    """The analyzer for its settings."""
    return HealthAnalyzer(s)
