"""GPU energy per workload on a shared GPU: measured where the driver counts it, else apportioned (docs/shared-gpus.md).

Apportioning follows Kepler's GPU model: over an interval, the device's energy above its idle
energy (idle power times the interval) is dynamic energy, split among the workloads in proportion
to their activity on the device in that interval (NVML's per-process SM utilisation, amdsmi's
per-process engine usage); the idle energy stays with the device. The parts add up to the dynamic
energy exactly (up to float rounding). Where one workload holds a whole device alone, the device's
counter is that workload's energy, idle included: measured, not apportioned. ``EnergyLedger`` keeps
the running totals per device, workload and method from successive readings of the device's energy
counter, bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Final

APPORTIONED: Final = "apportioned"  # the method label: split by activity
MEASURED: Final = "measured"  # the device's own counter: one workload held the whole device
IDLE: Final = "idle"  # the device's energy up to its idle line (and above it while nothing ran)


def apportion(
    energy_j: float, idle_power_w: float, interval_s: float, activity: Mapping[Hashable, float]
) -> dict[Hashable, float]:
    """The interval's energy above idle split by each workload's activity (negative activity counts as none).

    With no activity at all, nothing is apportioned (every workload gets 0: the GPU idled).
    """
    dynamic = max(0.0, energy_j - max(0.0, idle_power_w) * max(0.0, interval_s))
    weights = {k: max(0.0, a) for k, a in activity.items()}
    total = sum(weights.values())
    if total <= 0.0:
        return dict.fromkeys(weights, 0.0)
    return {k: dynamic * (w / total) for k, w in weights.items()}  # the share first: w * dynamic can underflow


@dataclass
class _Device:
    last_ts_ns: int
    last_energy_j: float
    idle_j: float = 0.0  # the device's energy below its idle line, kept by the device
    dynamic_j: float = 0.0  # apportioned so far
    workloads: OrderedDict[tuple[Hashable, str], float] = field(default_factory=OrderedDict)  # (workload, method)


class EnergyLedger:
    """Running energy per (device, workload, method) from a device's energy counter and its workloads' activity.

    ``observe(device, ts_ns, energy_j, idle_power_w, activity, exclusive)`` takes one reading of the
    device's cumulative energy counter and the workloads' activity since the previous one; with
    ``exclusive`` and one workload, the interval's whole energy is that workload's (``MEASURED``), else
    it is apportioned. A counter that goes down (a driver reload) starts over. At most ``max_workloads``
    per device: the least recently active one is forgotten first, and counted in ``dropped``.
    """

    def __init__(self, max_devices: int = 256, max_workloads: int = 64) -> None:
        self._devices: OrderedDict[str, _Device] = OrderedDict()
        self.max_devices = max_devices
        self.max_workloads = max_workloads
        self.dropped = 0

    def observe(
        self,
        device: Hashable,
        ts_ns: int,
        energy_j: float,
        idle_power_w: float,
        activity: Mapping[Hashable, float],
        exclusive: bool = False,
    ) -> None:
        """Take in one reading (see the class doc)."""
        d = self._devices.pop(device, None)
        if d is None:
            while len(self._devices) >= self.max_devices:
                self._devices.popitem(last=False)
                self.dropped += 1
            self._devices[device] = _Device(ts_ns, energy_j)
            return
        self._devices[device] = d
        interval_s = (ts_ns - d.last_ts_ns) / 1e9
        delta = energy_j - d.last_energy_j
        d.last_ts_ns, d.last_energy_j = ts_ns, energy_j
        if delta < 0 or interval_s <= 0:
            return  # the counter started over, or an old reading: nothing to split
        if exclusive and len(activity) == 1:
            method, parts = MEASURED, dict.fromkeys(activity, delta)
        else:
            method, parts = APPORTIONED, apportion(delta, idle_power_w, interval_s, activity)
        d.idle_j += delta - sum(parts.values())
        for workload, joules in parts.items():
            key = (workload, method)
            if joules <= 0.0 and key not in d.workloads:
                continue
            d.workloads[key] = d.workloads.pop(key, 0.0) + joules
            d.dynamic_j += joules
            while len(d.workloads) > self.max_workloads:
                d.workloads.popitem(last=False)
                self.dropped += 1

    def devices(self) -> list[Hashable]:
        """The devices followed now, least recently read first."""
        return list(self._devices)

    def totals(self, device: Hashable) -> dict[tuple[Hashable, str], float]:
        """Joules per (workload, method) of ``device`` so far."""
        d = self._devices.get(device)
        return dict(d.workloads) if d is not None else {}

    def device_totals(self, device: Hashable) -> tuple[float, float]:
        """(idle, given to workloads) joules of ``device`` so far."""
        d = self._devices.get(device)
        return (d.idle_j, d.dynamic_j) if d is not None else (0.0, 0.0)
