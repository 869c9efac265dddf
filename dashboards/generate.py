"""Generate the Grafana JSON of the AACO dashboards from their code.

    python -m dashboards.generate            # write dashboards/*.json
    python -m dashboards.generate --check    # exit 1 listing the stale files (a test runs the same check)
    python -m dashboards.generate --traces-plugin jaeger --out DIR   # variants for a Jaeger trace store

The checked-in JSON is generated for Tempo; after changing a dashboard run the first command, then
``python deploy/helm/sync_chart_files.py`` so the Helm chart carries the same files.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from . import agent_health, fleet, gpu_health, gpu_node, jobs, scheduler, serving, shared_gpus, workload
from .lib import TRACE_PLUGINS, Spec, build

HERE: Final = Path(__file__).resolve().parent

# File name (without .json) -> the dashboard's spec.
DASHBOARDS: Final[dict[str, Callable[[str], Spec]]] = {
    "gpu-node": gpu_node.spec,
    "workload": workload.spec,
    "scheduler": scheduler.spec,
    "fleet": fleet.spec,
    "agent-health": agent_health.spec,
    "serving": serving.spec,
    "jobs": jobs.spec,
    "gpu-health": gpu_health.spec,
    "shared-gpus": shared_gpus.spec,
}


def models(traces_plugin: str = "tempo") -> dict[str, dict[str, Any]]:
    """Every dashboard's JSON model, by file name."""
    return {f"{name}.json": build(make(traces_plugin), traces_plugin) for name, make in DASHBOARDS.items()}


def render(traces_plugin: str = "tempo") -> dict[str, str]:
    """Every dashboard's file content, by file name (stable: same code, same bytes)."""
    return {name: json.dumps(doc, indent=2, ensure_ascii=False) + "\n" for name, doc in models(traces_plugin).items()}


def stale(out: Path, traces_plugin: str = "tempo") -> list[str]:
    """The files of ``out`` that differ from what the code generates (missing ones included)."""
    problems = []
    for name, text in render(traces_plugin).items():
        path = out / name
        if not path.is_file():
            problems.append(f"{path}: missing")
        elif path.read_text() != text:
            problems.append(f"{path}: differs from its code")
    return problems


def main(argv: list[str] | None = None) -> int:
    """Command line: write the dashboards, or check them."""
    parser = argparse.ArgumentParser(prog="python -m dashboards.generate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="compare only; exit 1 when a file is stale")
    parser.add_argument("--out", type=Path, default=HERE, help="where the JSON goes (default: dashboards/)")
    parser.add_argument(
        "--traces-plugin", choices=TRACE_PLUGINS, default="tempo", help="type of the traces datasource variable"
    )
    args = parser.parse_args(argv)
    if args.check:
        problems = stale(args.out, args.traces_plugin)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("stale: run python -m dashboards.generate", file=sys.stderr)
            return 1
        print(f"{len(DASHBOARDS)} dashboards current")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in render(args.traces_plugin).items():
        path = args.out / name
        if not path.is_file() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
