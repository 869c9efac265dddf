"""The analysis of an 8-rank training job: ``aaco replay`` + ``aaco fleet jobs`` against Holistic Trace Analysis 0.5.0.

The repository holds two real ranks of one job (HTA's ``trace_filter`` sample, ranks 0 and 1 of 128:
``tests/data/kineto-multirank``) and no real set of 8, so 8 rank files are made from them
(``tests/support/rank_copies.py``): rank r is real rank r % 2 with ``distributedInfo`` rewritten to
rank r of world size 8, nothing else changed. On those 8 files, rounds interleaved:

- aaco: ``aaco replay`` of the 8 files into a fresh lake (parse, job naming, correlator, analyzers,
  Parquet), then ``aaco fleet jobs --json`` over that lake (DuckDB selects the job's rows, the jobs
  analyzer computes HTA's figures and stragglers);
- hta: HTA's ``TraceAnalysis(trace_dir=...)`` (its parse of the 8 ranks), ``get_comm_comp_overlap``,
  ``get_temporal_breakdown`` and ``get_potential_stragglers`` (its straggler analysis,
  ``hta/analyzers/straggler_analysis.py``), all on their defaults.

Two measures, both reported, as ``benchmarks/ingest.py`` does:

- end to end: each side as processes, wall time (interpreter start-up and imports included): the
  two ``aaco`` commands one after the other, as a user runs them (the replay's defaults), against
  one Python process running HTA. The children run with Python's bytecode cache, as an installed
  package has it (``PYTHONDONTWRITEBYTECODE`` is dropped for them; a round not counted compiles
  first);
- in process: the replay pipeline (``AgentService``, from start to a flushed lake) plus the fleet's
  ``jobs`` on that lake, against HTA's four calls, in this process, imports done on both sides. The
  replay's source has ``critical_path: off`` here, so both sides do the same analyses (by default the
  replay also finds the critical path of every rank's steps, which HTA's side does not); the
  default's time is reported beside it (``aaco_in_process_default_s``).

Medians of ``--rounds``; the ratios are aaco / hta (goal: 0.5 or less, at least twice as fast). The
answers are compared too: AACO's per-rank percentages rounded as HTA rounds them, and the stragglers.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.rank_copies import write_rank_copies  # noqa: E402 - the rank copies live with the tests

AACO = str(Path(sys.executable).parent / "aaco")
HTA_SCRIPT = """
import json, logging, sys
from hta.trace_analysis import TraceAnalysis
logging.getLogger("hta").setLevel(logging.WARNING)
a = TraceAnalysis(trace_dir=sys.argv[1])
o = a.get_comm_comp_overlap(visualize=False)
b = a.get_temporal_breakdown(visualize=False)
s = a.get_potential_stragglers(visualize=False)
print(json.dumps({"stragglers": [int(r) for r in s], "ranks": len(b)}))
"""


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(cache)}


def _run(args: list[str], env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{args[:3]} failed: {proc.stderr[-2000:]}")
    return wall, proc.stdout


def aaco_processes(files: list[Path], lake: Path, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """Wall seconds of ``aaco replay`` then ``aaco fleet jobs --json``, and the answer."""
    replay_s, _ = _run([AACO, "replay", *map(str, files), "--out", str(lake), "--no-progress"], env)
    jobs_s, out = _run([AACO, "fleet", "jobs", "--lake", str(lake), "--json"], env)
    return replay_s + jobs_s, json.loads(out)


def hta_process(trace_dir: Path, env: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """Wall seconds of one Python process running HTA's parse, overlap, breakdown and stragglers."""
    wall, out = _run([sys.executable, "-c", HTA_SCRIPT, str(trace_dir)], env)
    return wall, json.loads(out.strip().splitlines()[-1])


def aaco_in_process(files: list[Path], lake: Path, **source: Any) -> tuple[float, dict[str, Any]]:
    """The replay pipeline from start to a flushed lake, then the fleet's jobs on it (imports done)."""
    from aaco.agent.config import load_config
    from aaco.agent.fleet import jobs
    from aaco.agent.fleet.lake import FleetLake
    from aaco.agent.service import AgentService

    cfg = load_config(
        None,
        {
            "sources": [{"type": "replay", "paths": [str(f) for f in files], **source}],
            "exporters": {"prometheus": {"enabled": False}, "lake": {"path": str(lake)}},
        },
        env={},
    )
    svc = AgentService(cfg)
    t0 = time.perf_counter()
    svc.start()
    while not svc.sources_done():
        time.sleep(0.005)
    svc.shutdown()
    with FleetLake.open(str(lake)).connect() as con:
        answer = jobs.jobs(con)
    return time.perf_counter() - t0, answer


def hta_in_process(trace_dir: Path) -> tuple[float, dict[str, Any], Any, Any]:
    """HTA's parse and its three analyses in this process (imports done): seconds, answer, breakdown, overlap."""
    from hta.trace_analysis import TraceAnalysis

    t0 = time.perf_counter()
    a = TraceAnalysis(trace_dir=str(trace_dir))
    overlap = a.get_comm_comp_overlap(visualize=False)
    breakdown = a.get_temporal_breakdown(visualize=False)
    stragglers = a.get_potential_stragglers(visualize=False)
    wall = time.perf_counter() - t0
    return wall, {"stragglers": [int(r) for r in stragglers], "ranks": len(breakdown)}, breakdown, overlap


def agree(ours: dict[str, Any], breakdown: Any, overlap: Any, stragglers: list[int]) -> bool:
    """AACO's per-rank percentages, rounded to HTA's two decimals, and stragglers are HTA's."""
    (job,) = ours["jobs"]
    b, o = breakdown.set_index("rank"), overlap.set_index("rank")["comp_comm_overlap_pctg"]
    for r in job["ranks"]:
        rank = r["rank"]
        for key, col in (("idle_pct", "idle"), ("compute_pct", "compute"), ("non_compute_pct", "non_compute")):
            if round(r[key], 2) != round(float(b.loc[rank, f"{col}_time_pctg"]), 2):
                return False
        if round(r["comm_comp_overlap_pct"], 2) != round(float(o.loc[rank]), 2):
            return False
    return sorted(job["stragglers"]) == sorted(stragglers) and len(job["ranks"]) == len(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    logging.getLogger("hta").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        files = write_rank_copies(work / "ranks", args.ranks)
        env = _env(work / "pycache")
        aaco_processes(files, work / "warm", env)  # compiles the bytecode: not counted
        hta_process(work / "ranks", env)
        walls: dict[str, list[float]] = {"aaco": [], "hta": []}
        inproc: dict[str, list[float]] = {"aaco": [], "aaco_default": [], "hta": []}
        for i in range(args.rounds):
            wall, ours = aaco_processes(files, work / f"lake{i}", env)
            walls["aaco"].append(wall)
            wall, theirs = hta_process(work / "ranks", env)
            walls["hta"].append(wall)
            assert sorted(ours["jobs"][0]["stragglers"]) == sorted(theirs["stragglers"]), (ours, theirs)
            wall, _ = aaco_in_process(files, work / f"dlake{i}")
            inproc["aaco_default"].append(wall)
            wall, ours = aaco_in_process(files, work / f"tlake{i}", critical_path="off")
            inproc["aaco"].append(wall)
            wall, theirs, breakdown, overlap = hta_in_process(work / "ranks")
            inproc["hta"].append(wall)
            same = agree(ours, breakdown, overlap, theirs["stragglers"])
    e2e = {k: statistics.median(v) for k, v in walls.items()}
    tp = {k: statistics.median(v) for k, v in inproc.items()}
    print(
        json.dumps(
            {
                "benchmark": "jobs_analysis",
                "ranks": args.ranks,
                "rounds": args.rounds,
                "cpus": os.cpu_count(),
                "aaco_replay_and_fleet_jobs_s": round(e2e["aaco"], 3),
                "hta_process_s": round(e2e["hta"], 3),
                "ratio_end_to_end": round(e2e["aaco"] / e2e["hta"], 3),
                "aaco_in_process_s": round(tp["aaco"], 3),
                "hta_in_process_s": round(tp["hta"], 3),
                "ratio_in_process": round(tp["aaco"] / tp["hta"], 3),
                "aaco_in_process_default_s": round(tp["aaco_default"], 3),
                "goal_ratio": 0.5,
                "goal_met_end_to_end": e2e["aaco"] / e2e["hta"] <= 0.5,
                "goal_met_in_process": tp["aaco"] / tp["hta"] <= 0.5,
                "stragglers": ours["jobs"][0]["stragglers"],
                "same_answer_as_hta": same,
            }
        )
    )


if __name__ == "__main__":
    main()
