"""``aaco health``: each GPU's health verdict from its backend or a capture, as a Node Problem Detector plugin.

The first line printed is the one-line message Node Problem Detector shows; the exit status is its
convention's: 0 healthy (or warnings only), 1 a GPU unhealthy, 3 unknown (no GPU could be judged).
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from aaco.agent.cli.common import fail, out_console, print_warning
from aaco.contract.errors import AacoError

if TYPE_CHECKING:
    from aaco.contract.health import GpuHealth, HealthJudge, HealthThresholds
    from aaco.contract.telemetry import Snapshot

EXIT: Final = {"healthy": 0, "warning": 0, "unhealthy": 1, "unknown": 3}
KMSG: Final = Path("/dev/kmsg")


def health(
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from-file",
            "-f",
            help="Judge a capture instead of the GPUs: nvidia-smi -q -x XML, amd-smi or rocm-smi JSON, or a "
            "sysfs tree as a ttar archive.",
        ),
    ] = None,
    backend: Annotated[
        str, typer.Option("--backend", "-b", help="auto, amdsmi, amd-smi, rocm-smi, sysfs, nvml or nvidia-smi.")
    ] = "auto",
    kernel_log: Annotated[
        Path | None,
        typer.Option(
            "--kernel-log",
            help="Kernel log to read XID errors from (dmesg, dmesg -T, journalctl -k output; - for stdin). "
            "Default: /dev/kmsg when reading the GPUs and it is readable; none with --from-file.",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="Agent configuration whose analyzers.health section sets the thresholds."),
    ] = None,
    sysfs_root: Annotated[
        Path, typer.Option("--sysfs-root", help="Directory holding class/drm for the sysfs backend.")
    ] = Path("/sys"),
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help='Print {"status", "gpus": [{"gpu", "uuid", "status", "reasons"}], "xids": [...]} (docs/health.md).',
        ),
    ] = False,
    timeout_s: Annotated[float, typer.Option("--timeout", min=0.1, help="Deadline of the backend call, s.")] = 5.0,
) -> None:
    """Say whether each GPU is healthy, in warning or unhealthy, and why (docs/health.md).

    Exit status: 0 healthy or warning, 1 unhealthy, 3 unknown: Node Problem Detector's custom plugin
    convention, so the chart can run it as one.
    """
    from aaco.contract.health import HealthJudge, overall

    judge = HealthJudge(_thresholds(config))
    now = time.time_ns()
    try:
        snap = _snapshot(from_file, backend, sysfs_root, timeout_s)
    except AacoError as exc:
        _unknown(f"unknown: {exc}", as_json)
        return
    for p in snap.problems:
        print_warning(p)
    for gpu in snap.gpus:
        judge.observe(now, gpu)
    log = kernel_log if kernel_log is not None or from_file is not None else _kmsg()
    xids = _xids(judge, log, snap, now) if log is not None else []
    verdicts = judge.verdicts(now)
    status = overall(verdicts)
    if as_json:
        typer.echo(json.dumps({"status": status, "gpus": [v.to_dict() for v in verdicts], "xids": xids}))
    else:
        _print(status, verdicts, xids, {g.gpu.index for g in snap.gpus if g.gpu.parent})
    raise typer.Exit(EXIT[status])


def _thresholds(config: Path | None) -> HealthThresholds | None:
    from aaco.agent.cli.common import load_config_or_exit

    return load_config_or_exit(config).analyzers.health if config is not None else None


def _snapshot(from_file: Path | None, backend: str, sysfs_root: Path, timeout_s: float) -> Snapshot:
    """One sample of every GPU (as ``aaco telemetry``); AacoError when there is none to read."""
    from aaco.agent.sources.smi.backends import BACKENDS, BackendOptions, open_backend
    from aaco.agent.sources.smi.calls import BackendError
    from aaco.agent.sources.smi.values import TelemetryFormatError

    if from_file is not None:
        backend = "file"
    elif backend not in BACKENDS or backend == "file":
        raise fail(AacoError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})", subject="--backend"))
    try:
        source = open_backend(backend, BackendOptions(timeout_s=timeout_s, sysfs_root=sysfs_root, file=from_file))
        try:
            return source.sample()
        finally:
            source.close()
    except TelemetryFormatError as exc:
        raise fail(exc) from None  # a capture that is not one: a usage error, not an unknown GPU
    except BackendError as exc:
        raise AacoError(str(exc)) from None


def _kmsg() -> Path | None:
    """/dev/kmsg when this process may read it (root, or CAP_SYSLOG), else no kernel log."""
    try:
        with KMSG.open("rb", buffering=0):
            return KMSG
    except OSError:
        return None


def _xids(judge: HealthJudge, log: Path, snap: Snapshot, now_ns: int) -> list[dict[str, object]]:
    """Count the log's XID lines per GPU (by PCI bus) into ``judge``; what was counted, for the output."""
    from aaco.agent.sources.smi.kernel_log import read_xids
    from aaco.contract.health import XidSeen
    from aaco.contract.xid import lookup

    by_pci = {g.gpu.pci_bus: g.gpu.index for g in snap.gpus if g.gpu.pci_bus}
    try:
        counter = read_xids(sys.stdin.buffer if str(log) == "-" else log)
    except OSError as exc:
        raise fail(AacoError(f"cannot read the kernel log: {exc.strerror or exc}", subject=str(log))) from None
    out: list[dict[str, object]] = []
    last = counter.last
    for (pci, code), count in sorted(counter.counts.items()):
        x, when = lookup(code), last[(pci, code)].ts_ns
        gpu = by_pci.get(pci, pci)
        judge.xid(gpu, XidSeen(code, x.severity, x.description, count, when))
        recent = when is None or when >= now_ns - judge.t.xid_max_age_s * 1e9
        out.append(
            {"gpu": gpu, "pci_bus": pci, "xid": code, "count": count, "severity": x.severity, "action": x.action}
            | {"description": x.description, "last_ns": when, "in_verdict": recent}
        )
    if counter.malformed:
        print_warning(f"{log}: {counter.malformed} NVRM: Xid line(s) not understood, left out")
    if counter.dropped:
        print_warning(f"{log}: {counter.dropped} XID line(s) beyond {counter.max_keys} (GPU, XID) pairs, left out")
    return out


def _print(status: str, verdicts: list[GpuHealth], xids: list[dict[str, object]], logical: set[str]) -> None:
    """The one-line message first (Node Problem Detector's), then a line per GPU and reason, then the XIDs."""
    bad = [v for v in verdicts if v.status in ("unhealthy", "warning")]
    if not verdicts:
        head = "unknown: no GPU found"
    elif not bad:
        parts = sum(1 for v in verdicts if v.gpu in logical)  # MIG devices and partitions of the GPUs
        carved = f" and {parts} MIG device(s) or partition(s)" if parts else ""
        head = f"{status}: {len(verdicts) - parts} GPU(s){carved}, no problem found"
    else:
        head = f"{status}: " + "; ".join(
            f"GPU {v.gpu} {v.status} ({', '.join(r.code for r in v.reasons)})" for v in bad
        )
    out_console.print(head, markup=False, highlight=False)
    for v in verdicts:
        uuid = f" {v.uuid}" if v.uuid else ""
        out_console.print(f"GPU {v.gpu}{uuid}: {v.status}", markup=False, highlight=False)
        for r in v.reasons:
            out_console.print(f"  {r.status}: {r.code}: {r.detail}", markup=False, highlight=False)
    for x in xids:
        when = x["last_ns"]
        at = (
            "" if when is None else f", last {datetime.fromtimestamp(int(when) / 1e9, timezone.utc):%Y-%m-%d %H:%M:%SZ}"
        )  # type: ignore[call-overload]
        old = "" if x["in_verdict"] else " (older than xid_max_age_s: not in the verdict)"
        what = f"{x['severity']} ({x['description']}; {x['action'] or 'no action given'})"
        line = f"XID {x['xid']} on GPU {x['gpu']}: {x['count']} time(s){at}, {what}{old}"
        out_console.print(line, markup=False, highlight=False)


def _unknown(message: str, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps({"status": "unknown", "gpus": [], "message": message}))
    else:
        out_console.print(message, markup=False, highlight=False)
    raise typer.Exit(EXIT["unknown"])
