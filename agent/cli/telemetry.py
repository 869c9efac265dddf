"""``aaco telemetry``: one snapshot of every GPU's telemetry, from a backend or a captured file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from aaco.agent.cli.common import fail, out_console, print_warning, table
from aaco.contract.errors import AacoError

if TYPE_CHECKING:  # the smi package imports every source (~0.4 s): imported when the command runs
    from aaco.contract.telemetry import Snapshot


def readings(snap: Snapshot) -> list[dict[str, object]]:
    """The ``--json`` form: ``{"device", "metric", "value", "unit", "attributes"}`` per reading."""
    from aaco.contract.telemetry import to_table

    table = to_table(snap.gpus, ts_ns=0, node="", source="")
    out = []
    for row in table.select(["device", "metric", "value", "unit", "gpu_uuid", "attributes"]).to_pylist():
        attrs = dict(row["attributes"] or ())
        if row["gpu_uuid"]:
            attrs["gpu_uuid"] = row["gpu_uuid"]
        out.append(
            {
                "device": row["device"],
                "metric": row["metric"],
                "value": row["value"],
                "unit": row["unit"],
                "attributes": attrs,
            }
        )
    return out


def telemetry(
    backend: Annotated[
        str,
        typer.Option(
            "--backend",
            "-b",
            help="auto, amdsmi, amd-smi, rocm-smi, sysfs, nvml, nvidia-smi or file (auto: the best present; "
            "file with --from-file).",
        ),
    ] = "auto",
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from-file",
            "-f",
            help="Read a capture instead of the GPUs: amd-smi or rocm-smi JSON, nvidia-smi -q -x XML, "
            "or a sysfs tree as a ttar archive.",
        ),
    ] = None,
    sysfs_root: Annotated[
        Path,
        typer.Option(
            "--sysfs-root", help="Directory holding class/drm for the sysfs backend (/host/sys in a container)."
        ),
    ] = Path("/sys"),
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list of readings.")] = False,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Deadline of the backend call, seconds.")
    ] = 5.0,
) -> None:
    """Print one snapshot of GPU telemetry: clocks, power, temperature, utilisation, memory, throttling, errors.

    Values are in base units (ratios 0..1, bytes, W, J, Celsius, Hz) under their OpenTelemetry names.
    """
    from aaco.agent.sources.smi.backends import BACKENDS, BackendOptions, open_backend
    from aaco.agent.sources.smi.calls import BackendError
    from aaco.agent.sources.smi.values import TelemetryFormatError

    try:
        if backend not in BACKENDS:
            raise AacoError(f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})", subject="--backend")
        if from_file is not None and backend not in ("auto", "file"):
            raise AacoError(
                f"--from-file reads a capture; it cannot be combined with --backend {backend}", subject="--from-file"
            )
        if backend == "file" and from_file is None:
            raise AacoError("the file backend needs --from-file", subject="--backend")
        if from_file is not None:
            backend = "file"
        opts = BackendOptions(timeout_s=timeout_s, sysfs_root=sysfs_root, file=from_file)
        source = open_backend(backend, opts)
        try:
            snap = source.sample()
        finally:
            source.close()
    except (BackendError, TelemetryFormatError, AacoError) as exc:
        raise fail(exc) from None
    for p in snap.problems:
        print_warning(p)
    rows = readings(snap)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        return
    out_console.print(f"GPU telemetry ({snap.format})", highlight=False)
    for device, title, group in by_gpu(rows):
        out = table(
            "metric", "value", "unit", right={"value"}, title=f"GPU {device}: {title}" if title else f"GPU {device}"
        )
        for r in group:
            out.add_row(*r)
        out_console.print()
        out_console.print(out)


def by_gpu(rows: list[dict[str, object]]) -> list[tuple[str, str, list[tuple[str, str, str]]]]:
    """Readings per GPU, in order: (device, model and bus id, [(metric and its series attributes, value, unit)])."""
    groups: dict[str, tuple[str, list[tuple[str, str, str]]]] = {}
    for r in rows:
        attrs = dict(r["attributes"])  # type: ignore[call-overload]
        who = [str(attrs.pop(k)) for k in ("hw.model", "pci.bus_id") if attrs.get(k)]
        for k in ("hw.vendor", "gpu_uuid"):
            attrs.pop(k, None)
        metric = " ".join([str(r["metric"]), *(f"{k}={v}" for k, v in attrs.items())])
        device = str(r["device"])
        _, readings = groups.setdefault(device, (", ".join(who), []))
        readings.append((metric, _number(float(r["value"])), str(r["unit"])))  # type: ignore[arg-type]
    return [(device, title, readings) for device, (title, readings) in groups.items()]


def _number(v: float) -> str:
    """A whole number in full (bytes, hertz), anything else to 6 significant digits."""
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else f"{v:.6g}"
