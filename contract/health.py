"""A GPU's health verdict, ``healthy | warning | unhealthy``, with its reasons (docs/health.md).

``HealthJudge`` takes the samples of a GPU's health readings over time (``contract.telemetry``) and
the XID errors the kernel logged for it, and says, per GPU, what is wrong. The rules follow DCGM's
health watches (``dcgm_gpu_hardware_limits.h``, ``DcgmHealthWatch.cpp``), AMD's bad pages counting as retired pages;
each threshold is a field of ``HealthThresholds`` (the ``health`` configuration).

- *Unhealthy:* an uncorrected ECC error since the driver loaded (any block); a row the GPU could not remap;
  ``max_retired_pages`` pages retired (DCGM: 63); a page retirement pending with
  ``retired_pages_soft_limit`` pages retired already (DCGM: 15); a critical XID (the catalogue's
  action is a GPU reset, a reboot or support) within ``xid_max_age_s``; the GPU lost (its backend
  no longer sees it).
- *Warning:* a row remapping or a page retirement waiting for a reset; PCIe replays rising faster than
  ``pcie_replays_per_minute`` (DCGM: 8); corrected ECC errors rising faster than
  ``corrected_per_hour``; thermal slowdown; an application XID (the catalogue says restart the
  application) within ``xid_max_age_s``.

Rates need two samples at least ``min_rate_window_s`` apart; a counter that goes down (a driver
reload) starts over. A GPU its backend reads is judged on what it reports: one without ECC or a row
remapper (a consumer board) is healthy when nothing else is wrong. ``unknown`` is for a GPU never
read (and the node's status when no GPU could be read).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt

from aaco.contract.config_base import StrictModel
from aaco.contract.telemetry import (
    ECC_CORRECTED,
    ECC_UNCORRECTED,
    PCIE_REPLAYS,
    RETIRED_PAGES,
    RETIRED_PAGES_PENDING,
    ROW_REMAP_FAILURE,
    ROW_REMAP_PENDING,
    THROTTLE,
    UP,
    GpuSample,
)

Status = Literal["healthy", "warning", "unhealthy", "unknown"]
STATUSES: Final[tuple[Status, ...]] = ("healthy", "warning", "unhealthy", "unknown")
_RANK: Final = {"unknown": 0, "healthy": 1, "warning": 2, "unhealthy": 3}
_RATED: Final = (PCIE_REPLAYS, ECC_CORRECTED)  # the counters the rate rules read
# every reading a rule reads (a GPU's aaco.gpu.up makes it known even when it reports none of the others)
RULE_READINGS: Final = frozenset(
    {ECC_UNCORRECTED, ECC_CORRECTED, RETIRED_PAGES, RETIRED_PAGES_PENDING, ROW_REMAP_PENDING, ROW_REMAP_FAILURE}
    | {PCIE_REPLAYS, THROTTLE, UP}
)
_STEPS: Final = 8  # points kept per rate window: one per min_rate_window_s / 8 (a faster sample replaces the last)
_HISTORY: Final = 4 * _STEPS  # points kept per GPU: four windows


class HealthThresholds(StrictModel):
    """When a GPU is unhealthy or in warning (docs/health.md); the defaults are DCGM's where it has one."""

    max_retired_pages: PositiveInt = Field(63, description="Retired pages that make a GPU unhealthy (DCGM: 63).")
    retired_pages_soft_limit: PositiveInt = Field(
        15, description="Retired pages beyond which one more pending retirement is unhealthy (DCGM: 15)."
    )
    pcie_replays_per_minute: NonNegativeFloat = Field(
        8.0, description="PCIe replays per minute beyond which the link is in warning (DCGM: 8)."
    )
    corrected_per_hour: NonNegativeFloat = Field(
        100.0, description="Corrected ECC errors per hour beyond which the GPU is in warning."
    )
    min_rate_window_s: PositiveFloat = Field(
        60.0, description="Rates are measured over samples at least this far apart."
    )
    xid_max_age_s: PositiveFloat = Field(
        86_400.0, description="An XID older than this no longer counts (a reset or repair is assumed since)."
    )
    thermal_slowdown: bool = Field(True, description="Thermal slowdown (a thermal throttle) is a warning.")


@dataclass(frozen=True)
class Reason:
    """Why a GPU is not healthy: a short code, its severity, and what was seen."""

    code: str
    status: Status
    detail: str

    def to_dict(self) -> dict[str, str]:
        """JSON form."""
        return {"code": self.code, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class XidSeen:
    """The XID errors of one code the kernel logged for a GPU: how many, the last one's time, its catalogue entry."""

    code: int
    severity: str  # critical | warning | info (contract.xid)
    description: str
    count: int
    last_ns: int | None  # None: the log line had no absolute time (counted as recent)


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's verdict."""

    gpu: str
    uuid: str
    status: Status
    reasons: tuple[Reason, ...]

    def to_dict(self) -> dict[str, object]:
        """``{"gpu", "uuid", "status", "reasons": [...]}``."""
        return {
            "gpu": self.gpu,
            "uuid": self.uuid,
            "status": self.status,
            "reasons": [r.to_dict() for r in self.reasons],
        }


@dataclass
class _Gpu:
    uuid: str = ""
    latest: dict[tuple[str, str], float] | None = None  # the newest sample's readings, (metric, attribute) -> value
    # the rate rules' counters over time, (ts, metric -> sum over its series), one point per _STEPS of the window
    counters: deque[tuple[int, dict[str, float]]] = field(default_factory=lambda: deque(maxlen=_HISTORY))
    xids: dict[int, XidSeen] = field(default_factory=dict)


def _values(sample: GpuSample) -> dict[tuple[str, str], float]:
    return {(r.metric, ",".join(v for _, v in r.attrs)): r.value for r in sample.readings}


class HealthJudge:
    """Per GPU (by index), its recent health readings and XIDs, and the verdict they give."""

    def __init__(self, thresholds: HealthThresholds | None = None, max_gpus: int = 256) -> None:
        self.t = thresholds or HealthThresholds()
        self._gpus: dict[str, _Gpu] = {}
        self._max = max_gpus
        self.dropped = 0  # GPUs beyond max_gpus

    def _gpu(self, index: str) -> _Gpu | None:
        g = self._gpus.get(index)
        if g is None:
            if len(self._gpus) >= self._max:
                self.dropped += 1
                return None
            g = self._gpus[index] = _Gpu()
        return g

    def observe(self, ts_ns: int, sample: GpuSample) -> None:
        """Take in one sample of one GPU."""
        g = self._gpu(sample.gpu.index)
        if g is None:
            return
        g.uuid = sample.gpu.uuid or g.uuid
        g.latest = _values(sample)
        sums: dict[str, float] = {}
        for (metric, _), value in g.latest.items():
            if metric in _RATED:
                sums[metric] = sums.get(metric, 0.0) + value
        if not sums:
            return
        step_ns = self.t.min_rate_window_s * 1e9 / _STEPS
        if len(g.counters) >= 2 and ts_ns - g.counters[-2][0] < step_ns:
            g.counters[-1] = (ts_ns, sums)  # too close to the point before: the newest value replaces the last
        else:
            g.counters.append((ts_ns, sums))

    def xid(self, index: str, seen: XidSeen) -> None:
        """The XIDs of one code logged for GPU ``index`` (replaces what was known of that code)."""
        g = self._gpu(index)
        if g is not None:
            g.xids[seen.code] = seen

    def forget(self, index: str) -> None:
        """Leave GPU ``index`` out from now on (its caller's bound)."""
        self._gpus.pop(index, None)

    def verdicts(self, now_ns: int) -> list[GpuHealth]:
        """Every GPU's verdict, by index."""
        return [self.verdict(i, now_ns) for i in sorted(self._gpus, key=_index_key)]

    def verdict(self, index: str, now_ns: int) -> GpuHealth:
        """The verdict of GPU ``index`` now (``now_ns`` ages its XIDs)."""
        g = self._gpus.get(index) or _Gpu()
        reasons = [*self._latest(g), *self._rates(g), *self._xids(g, now_ns)]
        status: Status = "healthy" if g.xids or g.latest is not None else "unknown"
        for r in reasons:
            if _RANK[r.status] > _RANK[status]:
                status = r.status
        return GpuHealth(index, g.uuid, status, tuple(sorted(reasons, key=lambda r: -_RANK[r.status])))

    def _latest(self, g: _Gpu) -> Iterable[Reason]:
        v = g.latest
        if v is None:
            return
        if v.get((UP, "")) == 0.0:
            yield Reason("gpu_lost", "unhealthy", "the GPU no longer answers its telemetry backend")
            return
        for (metric, block), n in sorted(v.items()):
            if metric == ECC_UNCORRECTED and n > 0:
                where = f" in {block}" if block else ""
                yield Reason(
                    "ecc_uncorrected", "unhealthy", f"{n:g} uncorrected ECC error(s){where} since the driver loaded"
                )
        if v.get((ROW_REMAP_FAILURE, ""), 0.0) > 0:
            yield Reason("row_remap_failure", "unhealthy", "a memory row could not be remapped (no spare rows left)")
        if v.get((ROW_REMAP_PENDING, ""), 0.0) > 0:
            yield Reason("row_remap_pending", "warning", "a row remapping waits for a GPU reset")
        retired = sum(n for (metric, _), n in v.items() if metric == RETIRED_PAGES)
        pending = v.get((RETIRED_PAGES_PENDING, ""), 0.0)
        if retired >= self.t.max_retired_pages:
            yield Reason(
                "retired_pages_limit", "unhealthy", f"{retired:g} pages retired (limit {self.t.max_retired_pages})"
            )
        elif pending > 0 and retired >= self.t.retired_pages_soft_limit:
            yield Reason(
                "retired_pages_pending",
                "unhealthy",
                f"a page retirement pending with {retired:g} pages retired (limit {self.t.retired_pages_soft_limit})",
            )
        elif pending > 0:
            yield Reason("retired_pages_pending", "warning", "a page retirement waits for a GPU reset")
        if self.t.thermal_slowdown and v.get((THROTTLE, "thermal"), 0.0) > 0:
            yield Reason("thermal_slowdown", "warning", "the GPU slows down to cool (thermal throttle active)")

    def _rates(self, g: _Gpu) -> Iterable[Reason]:
        for metric, limit, per_s, code, what in (
            (PCIE_REPLAYS, self.t.pcie_replays_per_minute, 60.0, "pcie_replays_rising", "PCIe replays per minute"),
            (ECC_CORRECTED, self.t.corrected_per_hour, 3600.0, "ecc_corrected_rising", "corrected ECC errors per hour"),
        ):
            rate = self._rate(g, metric)
            if rate is not None and rate * per_s > limit:
                yield Reason(code, "warning", f"{rate * per_s:.3g} {what} (limit {limit:g})")

    def _rate(self, g: _Gpu, metric: str) -> float | None:
        """Per second, over the longest span of the kept points with no counter reset, if long enough."""
        points = [(ts, sums[metric]) for ts, sums in g.counters if metric in sums]
        if len(points) < 2:
            return None
        end_ts, end = points[-1]
        start_ts, start = end_ts, end
        for ts, n in reversed(points[:-1]):
            if n > start:  # a reset between: the span starts after it
                break
            start_ts, start = ts, n
        span_s = (end_ts - start_ts) / 1e9
        return (end - start) / span_s if span_s >= self.t.min_rate_window_s else None

    def _xids(self, g: _Gpu, now_ns: int) -> Iterable[Reason]:
        horizon = now_ns - self.t.xid_max_age_s * 1e9
        for code, x in sorted(g.xids.items()):
            if x.last_ns is not None and x.last_ns < horizon:
                continue
            status: Status | None = {"critical": "unhealthy", "warning": "warning"}.get(x.severity)  # type: ignore[assignment]
            if status is not None:
                yield Reason(f"xid_{code}", status, f"XID {code} ({x.description}) logged {x.count} time(s)")


def _index_key(index: str) -> tuple[int, str]:
    return (int(index), "") if index.isdigit() else (1 << 30, index)


def overall(verdicts: Iterable[GpuHealth]) -> Status:
    """The node's status: its worst GPU's (``unknown`` with no GPU, or only unknown ones)."""
    worst: Status = "unknown"
    for v in verdicts:
        if _RANK[v.status] > _RANK[worst]:
            worst = v.status
    return worst
