"""NVIDIA XID errors from the kernel log, live: the ``xid`` source (docs/health.md).

It follows ``/dev/kmsg`` (or a log file) with ``smi.kernel_log.KernelLogTail`` and publishes, every
``interval_s``, one ``telemetry`` row per GPU and XID: the count since the agent started reading
(the kernel's ring buffer included, so XIDs logged before the agent started count, with their own
times), the last one's time in the ``aaco.xid.last_ns`` attribute. The GPU is numbered as NVIDIA
numbers it, by PCI address among the NVIDIA display and 3D controllers in ``sysfs_root``; one the
source cannot place keeps its PCI address as its name. The health analyzer turns the rows into
verdicts; the telemetry analyzer into ``aaco_gpu_xid_errors_total{gpu,xid}``. Reading
``/dev/kmsg`` needs root or CAP_SYSLOG: without it the source says so once and stops.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Final, Literal

from pydantic import Field, PositiveFloat

from aaco.agent.sources.base import Source, SourceContext
from aaco.agent.sources.smi.kernel_log import KMSG, KernelLogTail
from aaco.contract.config_base import StrictModel
from aaco.contract.telemetry import (
    ATTR_XID_LAST,
    XID_ERRORS,
    GpuIdentity,
    GpuSample,
    Reading,
    normalize_pci,
    to_table,
)

log = logging.getLogger("aaco.sources.xid")
NVIDIA: Final = "0x10de"
GPU_CLASSES: Final = ("0x0300", "0x0302")  # VGA and 3D controllers (an NVSwitch is a bridge: not a GPU)


class XidSourceConfig(StrictModel):
    """NVIDIA XID errors from the kernel log (/dev/kmsg or a log file), per GPU and XID (docs/health.md)."""

    type: Literal["xid"] = "xid"
    name: str | None = Field(None, description="Source name in metrics and logs (default: the type).")
    path: Path = Field(KMSG, description="The kernel log: /dev/kmsg (root or CAP_SYSLOG), or a file to follow.")
    interval_s: PositiveFloat = Field(5.0, description="How often the log is read and the counts published.")
    sysfs_root: Path = Field(
        Path("/sys"), description="Directory holding bus/pci, to number the GPUs as NVIDIA does (/host/sys in a pod)."
    )


def gpu_indices(sysfs_root: Path) -> dict[str, str]:
    """PCI address -> NVIDIA's index (the GPUs in PCI order, as nvidia-smi and NVML number them)."""
    found = []
    for dev in (sysfs_root / "bus" / "pci" / "devices").glob("*"):
        try:
            vendor = (dev / "vendor").read_text().strip()
            cls = (dev / "class").read_text().strip()
        except OSError:
            continue
        if vendor == NVIDIA and cls[:6] in GPU_CLASSES:
            found.append(normalize_pci(dev.name))
    return {pci: str(i) for i, pci in enumerate(sorted(found))}


class XidSource(Source):
    """Follows the kernel log and publishes the XID counts per GPU and XID."""

    type = "xid"

    def __init__(self, config: XidSourceConfig, name: str) -> None:
        super().__init__(name)
        self.config = config
        self.tail = KernelLogTail(config.path)
        self.indices: dict[str, str] = {}

    def run(self, ctx: SourceContext) -> None:
        """Read, publish, wait; an unreadable log is fatal the first time, a problem later."""
        cfg = self.config
        self.indices = gpu_indices(cfg.sysfs_root)
        log.info(
            "%s: XIDs from %s every %gs (%d NVIDIA GPUs by PCI address)",
            self.name,
            cfg.path,
            cfg.interval_s,
            len(self.indices),
        )
        read_once = False
        try:
            while True:
                try:
                    self.tail.poll()
                    read_once = True
                except OSError as exc:
                    why = exc.strerror or str(exc)
                    hint = " (needs root or CAP_SYSLOG)" if cfg.path == KMSG and exc.errno in (1, 13) else ""
                    ctx.problem(
                        self.name,
                        str(cfg.path),
                        "unreadable",
                        f"cannot read: {why}{hint}",
                        fatal=not read_once,
                        count=1,
                    )
                    if not read_once:
                        return
                self.publish(ctx)
                if ctx.sleep(cfg.interval_s):
                    return
        finally:
            self.tail.close()

    def publish(self, ctx: SourceContext) -> int:
        """One row per (GPU, XID) counted so far; the rows published."""
        c = self.tail.counter
        samples: dict[str, GpuSample] = {}
        last = c.last
        for (pci, code), count in sorted(c.counts.items()):
            gpu = self.indices.get(pci, pci)
            s = samples.get(gpu)
            if s is None:
                s = samples[gpu] = GpuSample(GpuIdentity(gpu, pci_bus=pci, vendor="nvidia"))
            when = last[(pci, code)].ts_ns
            attrs = tuple(sorted(((ATTR_XID_LAST, "" if when is None else str(when)), ("xid", str(code)))))
            s.readings.append(Reading(XID_ERRORS, float(count), attrs))
        if not samples:
            return 0
        table = to_table(samples.values(), ts_ns=time.time_ns(), node=ctx.node, source=self.name)
        ctx.publish(self.name, "telemetry", table, durable=False, live=True)
        if c.malformed or c.dropped:
            ctx.problem(
                self.name,
                str(self.config.path),
                "malformed",
                f"{c.malformed} XID line(s) not understood, {c.dropped} beyond the (GPU, XID) bound, left out",
                fatal=False,
            )
        return table.num_rows


def create(config: XidSourceConfig, name: str) -> XidSource:
    """Factory used by the source registry."""
    return XidSource(config, name)
