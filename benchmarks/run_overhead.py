"""The agent's cost on the workload it observes: iteration latency with the full pipeline vs ONNX
Runtime with its profiler alone (the agent's own cost, goal <= 1.05) and vs plain ONNX Runtime (the
whole cost of observation), measured in the same run.

All three run the same cycles — a new session, 3 warmup runs, then the timed runs — and time every
``session.run`` the same way (perf_counter around the call). The configurations are interleaved in
rounds so that machine noise spreads over all three; the figure is the ratio of medians, with a 95 %
bootstrap confidence interval (latency on a shared 2-core machine is bimodal, and the interval says
how far the point estimate can be trusted).

- plain: ONNX Runtime, profiling off;
- profiler: ONNX Runtime with its profiler on (what the agent needs from it);
- agent: ``aaco agent``'s full pipeline in-process — the ``ort`` source running the cycles back to
  back, correlator, analyzers, Parquet lake, Prometheus endpoint scraped every second.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np

from aaco.agent.config import load_config
from aaco.agent.service import AgentService
from aaco.agent.sources.ort.models import default_model_path
from aaco.agent.sources.ort.session import resolve_provider
from aaco.agent.sources.ort.workload import OrtWorkload


def bare(model: Path, provider: str, profile: bool, cycles: int, iterations: int, workdir: Path) -> list[int]:
    out: list[int] = []
    for _ in range(cycles):
        res = OrtWorkload(model, provider, 3, iterations, profile, workdir=workdir).run_cycle()
        out += res.latencies_ns
        if res.profile_path:
            res.profile_path.unlink(missing_ok=True)
    return out


def with_agent(model: Path, provider: str, cycles: int, iterations: int, workdir: Path, port: int) -> list[int]:
    cfg = load_config(
        None,
        {
            "node": "bench",
            "sources": [
                {
                    "type": "ort",
                    "model": str(model),
                    "provider": provider,
                    "iterations": iterations,
                    "warmup": 3,
                    "cycles": cycles,
                    "interval_s": 0,
                }
            ],
            "exporters": {"prometheus": {"port": port}, "lake": {"path": str(workdir / "lake")}},
            "pipeline": {"snapshot_interval_s": 1},
        },
        env={},
    )
    svc = AgentService(cfg)
    svc.start()
    source = svc.sources["ort"]
    stop = threading.Event()

    def scrape() -> None:
        while not stop.wait(1.0):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{svc.exporters[1].port}/metrics", timeout=2) as r:
                    r.read()
            except OSError:
                pass

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    while not svc.sources_done():
        time.sleep(0.05)
    stop.set()
    svc.shutdown()
    return list(source.wall_latencies_ns)


def ratio_ci(num: list[int], den: list[int], n: int = 2000, seed: int = 1) -> tuple[float, float]:
    """95 % bootstrap interval of median(num) / median(den)."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    ratios = np.median(rng.choice(a, (n, a.size)), axis=1) / np.median(rng.choice(b, (n, b.size)), axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="ONNX model (default: light_resnet50)")
    ap.add_argument("--provider", default="auto")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--cycles", type=int, default=2, help="cycles per configuration per round")
    ap.add_argument("--iterations", type=int, default=20, help="timed iterations per cycle")
    args = ap.parse_args()
    model = args.model or default_model_path()
    provider = resolve_provider(args.provider)
    lat: dict[str, list[int]] = {"plain": [], "profiler": [], "agent": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        bare(model, provider, False, 1, 5, work)  # warm the page cache and ORT's kernels once
        for r in range(args.rounds):
            order = ["plain", "profiler", "agent"]
            order = order[r % 3 :] + order[: r % 3]  # rotate so no configuration always goes first
            for name in order:
                if name == "agent":
                    lat[name] += with_agent(model, provider, args.cycles, args.iterations, work / f"a{r}", 0)
                else:
                    lat[name] += bare(model, provider, name == "profiler", args.cycles, args.iterations, work)
    med = {k: statistics.median(v) / 1e6 for k, v in lat.items()}
    mean = {k: statistics.fmean(v) / 1e6 for k, v in lat.items()}
    vs_prof = med["agent"] / med["profiler"]
    print(
        json.dumps(
            {
                "benchmark": "run_overhead",
                "model": model.name,
                "provider": provider,
                "iterations_per_config": {k: len(v) for k, v in lat.items()},
                "median_ms": {k: round(v, 3) for k, v in med.items()},
                "mean_ms": {k: round(v, 3) for k, v in mean.items()},
                "p95_ms": {k: round(float(np.percentile(v, 95)) / 1e6, 3) for k, v in lat.items()},
                "ratio_agent_vs_profiler": round(vs_prof, 4),
                "ratio_agent_vs_profiler_ci95": [round(x, 4) for x in ratio_ci(lat["agent"], lat["profiler"])],
                "ratio_agent_vs_plain": round(med["agent"] / med["plain"], 4),
                "ratio_agent_vs_plain_ci95": [round(x, 4) for x in ratio_ci(lat["agent"], lat["plain"])],
                "ratio_profiler_vs_plain": round(med["profiler"] / med["plain"], 4),
                "goal_agent_vs_profiler": 1.05,
                "goal_met": vs_prof <= 1.05,
            }
        )
    )


if __name__ == "__main__":
    main()
