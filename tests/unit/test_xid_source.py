"""The ``xid`` source: a real kernel log followed as it grows, GPUs numbered by PCI address, into verdicts."""

from __future__ import annotations

import calendar
from pathlib import Path

from aaco.agent.sources.smi.kernel_log import KernelLogTail, read_xids
from aaco.agent.sources.xid import XidSource, XidSourceConfig, gpu_indices
from aaco.analyzers.health import HEALTH, HealthAnalyzer, HealthSettings
from aaco.analyzers.telemetry import TelemetryAnalyzer
from aaco.contract import telemetry as m
from tests.conftest import ROOT

from .test_source_supervision import context

LOGS = ROOT / "tests" / "data" / "kernel-log"
XID79 = LOGS / "gpud-sxid-readme-xid79.log"  # one XID 79 on 0000:91:00, seconds since boot
XID119 = LOGS / "dmesg-with-xid-119.log"  # five XID 119 on 0000:9b:00, dmesg -T of February 2025


def pci_tree(root: Path, devices: dict[str, tuple[str, str]]) -> Path:
    """A sysfs bus/pci/devices tree: address -> (vendor, class)."""
    for address, (vendor, cls) in devices.items():
        d = root / "bus" / "pci" / "devices" / address
        d.mkdir(parents=True)
        (d / "vendor").write_text(vendor + "\n")
        (d / "class").write_text(cls + "\n")
    return root


def test_gpus_are_numbered_in_pci_order_among_nvidia_gpus_only(tmp_path):
    root = pci_tree(
        tmp_path,
        {
            "0000:9b:00.0": ("0x10de", "0x030200"),
            "0000:18:00.0": ("0x10de", "0x030200"),
            "0000:05:00.0": ("0x10de", "0x068000"),  # an NVSwitch: a bridge, not a GPU
            "0000:01:00.0": ("0x1002", "0x038000"),  # another vendor
            "0000:91:00.0": ("0x10de", "0x030000"),
        },
    )
    assert gpu_indices(root) == {"0000:18:00.0": "0", "0000:91:00.0": "1", "0000:9b:00.0": "2"}
    assert gpu_indices(tmp_path / "missing") == {}


def test_a_log_followed_as_it_grows_gives_every_line_once(tmp_path):
    lines = XID119.read_bytes().splitlines(keepends=True)
    log = tmp_path / "kern.log"
    log.write_bytes(b"".join(lines[:5]) + lines[5][:20])  # a line still being written
    tail = KernelLogTail(log)
    tail.poll()
    first = dict(tail.counter.counts)
    with log.open("ab") as fh:
        fh.write(lines[5][20:] + b"".join(lines[6:]))
    tail.poll()
    assert tail.counter.counts == read_xids(XID119).counts == {("0000:9b:00.0", 119): 5}
    assert sum(first.values()) == sum(1 for line in lines[:5] if b"Xid" in line)
    log.write_bytes(lines[2])  # rotated: a new, shorter file
    tail.poll()
    assert tail.counter.counts == {("0000:9b:00.0", 119): 6}
    tail.close()


def test_the_source_publishes_counts_per_gpu_that_make_verdicts_and_metrics(tmp_path):
    log = tmp_path / "kern.log"
    log.write_bytes(XID79.read_bytes() + XID119.read_bytes())
    sysfs = pci_tree(tmp_path / "sys", {"0000:91:00.0": ("0x10de", "0x030200")})
    src = XidSource(XidSourceConfig(path=log, sysfs_root=sysfs), "xid")
    src.indices = gpu_indices(sysfs)
    ctx = context(tmp_path)
    src.tail.poll()
    assert src.publish(ctx) == 2
    item = ctx.bus.get(0)
    rows = item.batch.to_pylist()
    got = {(r["device"], dict(r["attributes"])["xid"]): r["value"] for r in rows}
    assert got == {("0", "79"): 1.0, ("0000:9b:00.0", "119"): 5.0}  # 0000:9b:00 is not in this tree
    last = {dict(r["attributes"])["xid"]: dict(r["attributes"])[m.ATTR_XID_LAST] for r in rows}
    feb_23 = calendar.timegm((2025, 2, 23, 16, 30, 13)) * 10**9
    assert last["79"] == "" and abs(int(last["119"]) - feb_23) <= 86_400 * 10**9  # read in the host's zone
    health = HealthAnalyzer(HealthSettings(xid_max_age_s=1e10))
    health.update(item)
    status = {p.labels["gpu"]: p.labels["status"] for p in health.snapshot().points() if p.metric is HEALTH and p.value}
    assert status == {"0": "unhealthy", "0000:9b:00.0": "unhealthy"}
    (f0, f1) = sorted(health.drain_findings(), key=lambda f: f.subject)
    assert "xid_79" in f0.summary and "xid_119" in f1.summary
    telemetry = TelemetryAnalyzer()
    telemetry.update(item)
    series = {(p.labels["gpu"], p.labels["xid"]): p.value for p in telemetry.snapshot().points() if "xid" in p.labels}
    assert series == {("0", "79"): 1.0, ("0000:9b:00.0", "119"): 5.0}


def test_an_unreadable_log_is_fatal_and_said_once(tmp_path):
    src = XidSource(XidSourceConfig(path=tmp_path / "missing.log", sysfs_root=tmp_path), "xid")
    ctx = context(tmp_path)
    src.run(ctx)
    (p,) = ctx.journal.problems
    assert p.fatal and p.reason == "unreadable" and "missing.log" in p.subject
