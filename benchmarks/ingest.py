"""Ingest speed and memory: ``aaco replay`` into the lake, analyzers on, against a bare CSV parse.

1. A 1,000,000-row rocprofv3 kernel trace (the real sample's rows repeated with shifted times and
   fresh IDs) through the whole ``aaco replay`` command — start-up, parse, correlator, analyzers,
   Parquet lake — against ``pyarrow.csv.read_csv`` of the same file in the same run. Goal: at least
   0.5 of the bare parse speed, peak RSS <= 1 GB.
2. A 200,000-kernel Kineto trace (ProfilerSteps, cudaLaunchKernel + kernel pairs) through
   ``aaco replay``: events/s and peak RSS.

Two measures of the same work, both reported:

- end to end: each run is its own process, measured with ``wait4`` (wall time, peak RSS): the whole
  ``aaco replay`` command (interpreter start-up and imports included, about 0.6 s that do not grow
  with the file) against a process that imports pyarrow and parses;
- throughput: in this process, the replay pipeline from start to a flushed lake (``AgentService``)
  against the ``read_csv`` call alone — start-up excluded on both sides.

The median of ``--rounds`` runs is reported, the rounds of a comparison interleaved (bare, aaco,
bare, aaco, ...). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import tracegen  # noqa: E402 - the generators live with the tests

SAMPLES = ROOT / "examples" / "data"
AACO = str(Path(sys.executable).parent / "aaco")


def measure(args: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one child process; fails loudly if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args[:3]} failed: {err[-2000:]}")
    return wall, usage.ru_maxrss * 1024


def median_runs(args_for: dict[str, object], rounds: int) -> dict[str, tuple[float, int]]:
    """(median wall seconds, peak RSS bytes) of each named command, rounds interleaved (a, b, a, b, ...)."""
    runs: dict[str, list[tuple[float, int]]] = {name: [] for name in args_for}
    for i in range(rounds):
        for name, args in args_for.items():
            runs[name].append(measure(args(i)))  # type: ignore[operator]
    return {n: (statistics.median(w for w, _ in r), max(x for _, x in r)) for n, r in runs.items()}


def in_process(csv_path: Path, lake: Path, rows: int) -> tuple[float, float]:
    """(bare read_csv seconds, replay pipeline seconds) in this process, imports already done."""
    import pyarrow.csv as pacsv

    from aaco.agent.config import load_config
    from aaco.agent.service import AgentService

    t0 = time.perf_counter()
    assert pacsv.read_csv(csv_path).num_rows == rows
    bare = time.perf_counter() - t0
    cfg = load_config(
        None,
        {
            "sources": [{"type": "replay", "paths": [str(csv_path)], "force": True}],
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
    return bare, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--kineto-kernels", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        csv_path = work / "1234_kernel_trace.csv"
        rows, _ = tracegen.rocprofv3_csv(SAMPLES, csv_path, args.rows)
        bare_code = f"import pyarrow.csv as c; t = c.read_csv({str(csv_path)!r}); assert t.num_rows == {rows}"
        timed = median_runs(
            {
                "bare": lambda _i: [sys.executable, "-c", bare_code],
                "aaco": lambda i: [AACO, "replay", str(csv_path), "--out", str(work / f"lake{i}"), "--force"],
            },
            args.rounds,
        )
        (bare_wall, bare_rss), (aaco_wall, aaco_rss) = timed["bare"], timed["aaco"]
        tp = [in_process(csv_path, work / f"tlake{i}", rows) for i in range(args.rounds)]
        tp_bare = statistics.median(b for b, _ in tp)
        tp_aaco = statistics.median(a for _, a in tp)
        kineto_path = work / "trace.json"
        kernels, _ = tracegen.kineto(SAMPLES, kineto_path, args.kineto_kernels)
        events = kernels * 2 + -(-kernels // 1000)  # kernels, their launches, ProfilerSteps
        k_wall, k_rss = median_runs(
            {"kineto": lambda i: [AACO, "replay", str(kineto_path), "--out", str(work / f"klake{i}"), "--force"]},
            args.rounds,
        )["kineto"]
        csv_mb = csv_path.stat().st_size / 1e6
    ratio = bare_wall / aaco_wall
    print(
        json.dumps(
            {
                "benchmark": "ingest",
                "rocprofv3_csv": {
                    "rows": rows,
                    "mb": round(csv_mb, 1),
                    "bare_read_csv_s": round(bare_wall, 3),
                    "aaco_replay_s": round(aaco_wall, 3),
                    "aaco_rows_per_s": round(rows / aaco_wall),
                    "speed_ratio_vs_bare": round(ratio, 3),
                    "aaco_peak_rss_mb": round(aaco_rss / 2**20),
                    "bare_peak_rss_mb": round(bare_rss / 2**20),
                    "throughput_bare_read_csv_s": round(tp_bare, 3),
                    "throughput_aaco_pipeline_s": round(tp_aaco, 3),
                    "throughput_ratio_vs_bare": round(tp_bare / tp_aaco, 3),
                    "goal_ratio": 0.5,
                    "goal_rss_mb": 1024,
                    "goal_met_end_to_end": ratio >= 0.5 and aaco_rss <= 2**30,
                    "goal_met_throughput": tp_bare / tp_aaco >= 0.5 and aaco_rss <= 2**30,
                },
                "kineto": {
                    "kernels": kernels,
                    "events": events,
                    "aaco_replay_s": round(k_wall, 3),
                    "events_per_s": round(events / k_wall),
                    "peak_rss_mb": round(k_rss / 2**20),
                },
            }
        )
    )


if __name__ == "__main__":
    main()
