"""rocprofv3 JSON ingest: rows/s of the streaming parser against a whole-file ``orjson`` parse, same file, same run.

The file: ``tracegen.rocprofv3_json`` writes ``--dispatches`` kernel dispatches (default 200,000),
each with its hipLaunchKernel record, and ``--copies`` memory copies with their hipMemcpyAsync,
indented as rocprofiler-sdk writes it, every id and handle at or above 2**63 (all below 2**64:
orjson cannot parse a larger integer), in a temporary directory. Measured, interleaved
``--rounds`` times, each in a fresh child process (so peak memory is its own):

- baseline: ``orjson.loads`` of the whole file's bytes (read included): a document tree, no rows;
- aaco: ``parsers.parse_any`` of the same file, in a process that keeps pandas out as the agent does:
  the whole-file fast path (``rocprofv3_json_fast``: the record arrays read by Arrow's JSON reader, pass 1
  over the rest), ``kernels`` chunks with launches joined, devices mapped, times converted.

Reported: medians of the in-child wall time of the work alone (imports excluded), rows/s for
both (rows = dispatches + copies), the ratio aaco rows/s / orjson rows/s, and the peak RSS the
work added in the child (``ru_maxrss`` after minus before; orjson holds the whole tree, the parser
one chunk). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import tracegen  # noqa: E402 - the generators live with the tests


def child(mode: str, path: Path) -> None:
    """Run one measurement in this process and print ``{"s": ..., "rows": ..., "rss_mb": ...}``."""
    if mode == "orjson":
        import orjson

        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        doc = orjson.loads(path.read_bytes())
        rows = sum(
            len(p["buffer_records"]["kernel_dispatch"]) + len(p["buffer_records"]["memory_copy"])
            for p in doc["rocprofiler-sdk-tool"]
        )
    else:
        from aaco.agent.cli.runner import keep_pandas_out
        from aaco.agent.sources.traces.detect import identify
        from aaco.agent.sources.traces.parse import context_for, parse_any
        from aaco.contract.clock import boottime_offset

        keep_pandas_out()  # as aaco replay and the agent do: pyarrow's conversions never import pandas
        tf = identify(path)
        ctx = context_for(tf, node="bench", source="bench", clock=boottime_offset())
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        rows = sum(p.kernels.num_rows for p in parse_any(tf, ctx))
    elapsed = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    print(json.dumps({"s": elapsed, "rows": rows, "rss_mb": rss / 1024}))


def measure(mode: str, path: Path) -> dict[str, float]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", mode, str(path)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dispatches", type=int, default=200_000)
    ap.add_argument("--copies", type=int, default=2_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "4242_results.json"
        truth = tracegen.rocprofv3_json(path, args.dispatches, args.copies, big_ids=True, seed=3)
        rows = truth["kernels"] + truth["copies"]
        base, aaco = [], []
        for _ in range(args.rounds):
            base.append(measure("orjson", path))
            aaco.append(measure("aaco", path))
        size = path.stat().st_size
    if any(r["rows"] != rows for r in base + aaco):
        raise SystemExit(f"row counts differ from the {rows} written: {base + aaco}")
    base_s = statistics.median(r["s"] for r in base)
    aaco_s = statistics.median(r["s"] for r in aaco)
    print(
        json.dumps(
            {
                "benchmark": "rocprofv3_json_ingest",
                "dispatches": truth["kernels"],
                "copies": truth["copies"],
                "rows": rows,
                "mb": round(size / 1e6, 1),
                "orjson_s": round(base_s, 3),
                "aaco_parse_s": round(aaco_s, 3),
                "orjson_rows_per_s": round(rows / base_s),
                "aaco_rows_per_s": round(rows / aaco_s),
                "ratio_aaco_vs_orjson": round(base_s / aaco_s, 3),
                "orjson_peak_rss_added_mb": round(max(r["rss_mb"] for r in base)),
                "aaco_peak_rss_added_mb": round(max(r["rss_mb"] for r in aaco)),
                "rounds": args.rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
