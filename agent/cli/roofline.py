"""``aaco roofline``: each kernel's work from the lake's hardware counters, and where it sits under the roofline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from aaco.agent.cli.common import AsJson, fail, out_console, print_note, table
from aaco.agent.cli.fleet import LakeUrl, Since, query_lake
from aaco.contract.errors import AacoError

COLUMNS: Final = [
    ("kernel", "kernel"),
    ("calls", "calls"),
    ("GFLOP", "flops"),
    ("HBM MB", "hbm_bytes"),
    ("AI HBM", "ai_hbm"),
    ("AI L2", "ai_l2"),
    ("AI L1", "ai_l1"),
    ("GFLOP/s", "gflops_per_s"),
    ("bound", "bound"),
    ("of roof", "roof_fraction"),
]
_SCALE: Final = {"flops": 1e-9, "hbm_bytes": 1e-6}


def roofline(
    lake: LakeUrl,
    since: Since = None,
    peaks: Annotated[
        Path | None,
        typer.Option(
            "--peaks",
            help="rocprof-compute's measured roofline.csv: place each kernel (memory- or compute-bound, its share "
            "of that roof). Without it, work and intensities only.",
        ),
    ] = None,
    device: Annotated[str, typer.Option("--device", help="The roofline.csv row (its device column) to use.")] = "0",
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            help="Place under a GPU model's published peaks instead (MI100, MI210, MI250X, MI300X, MI325X, MI355X, "
            "A100-SXM4-80GB, H100-SXM5, H200-SXM, B200; docs/counters.md).",
        ),
    ] = None,
    as_json: AsJson = False,
) -> None:
    """Per kernel: FLOPs, bytes at HBM, L2 and L1, arithmetic intensity, GFLOP/s, and its bound (docs/counters.md)."""
    from aaco.agent.fleet.roofline import roofline as compute

    measured = None
    if peaks is not None and gpu is not None:
        raise fail(AacoError("give the measured peaks (--peaks) or a GPU model (--gpu), not both", subject="--gpu"))
    if gpu is not None:
        from aaco.contract.gpu_peaks import PEAKS, peaks_for

        measured = peaks_for(gpu)
        if measured is None:
            raise fail(
                AacoError(f"no GPU model {gpu!r} in the peaks table (known: {', '.join(PEAKS)})", subject="--gpu")
            )
    if peaks is not None:
        from aaco.agent.sources.counters.rocprof_compute import read_peaks

        try:
            found = read_peaks(peaks)
        except AacoError as exc:
            raise fail(exc) from None
        if device not in found:
            raise fail(AacoError(f"no device {device!r} (it has {', '.join(found)})", subject=peaks, hint="--device"))
        measured = found[device]
    doc = query_lake(lake, since, lambda con: compute(con, measured))
    if as_json:
        typer.echo(json.dumps(doc))
        return
    if not doc["kernels"]:
        print_note("roofline: no hardware counters in the lake (a counters source's rows, for the time asked)")
        return
    out = table(*(c for c, _ in COLUMNS), right={c for c, k in COLUMNS if k not in ("kernel", "bound")})
    for row in doc["kernels"]:
        out.add_row(*(_cell(k, row.get(k)) for _, k in COLUMNS))
    out_console.print(out)
    if measured is None:
        print_note("bound and share of roof: give the measured peaks (--peaks roofline.csv) or a GPU model (--gpu)")


def _cell(key: str, v: Any) -> str:
    if v is None:
        return "-"
    if key == "roof_fraction":
        return f"{v:.0%}"
    if isinstance(v, float):
        return f"{v * _SCALE.get(key, 1.0):.4g}"
    return str(v)
