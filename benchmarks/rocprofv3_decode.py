"""The rocprofv3 CSV parser's speed against a bare ``pyarrow.csv.read_csv`` of the same file, same run.

The file: rows of the real sample (``examples/data/rocprofv3/kernel_trace.csv``) repeated with
shifted timestamps and fresh correlation ids, ``--rows`` of them (default 1,000,000), written to a
temporary directory. Measured, interleaved ``--rounds`` times:

- baseline: ``pyarrow.csv.read_csv(path)`` (type inference, every column, multi-threaded);
- aaco: ``parsers.parse_any`` of the same file: blocks of lines through ``Rocprofv3CsvDecoder``
  into ``kernels`` columns in Unix-epoch ns, yielded as ``ParsedTrace`` chunks.

The figure is the ratio of medians, baseline time / aaco time (>= 0.5 is the goal: at least half
the bare parse speed). Prints one JSON line.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow.csv as pacsv

from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.clock import ClockOffset

SAMPLE = Path(__file__).resolve().parents[1] / "examples" / "data" / "rocprofv3" / "kernel_trace.csv"


def build(path: Path, rows: int) -> None:
    with SAMPLE.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        base = list(reader)
    span = max(int(r[10]) for r in base) - min(int(r[9]) for r in base) + 1_000
    with path.open("w", newline="") as out:
        w = csv.writer(out, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        w.writerow(header)
        for i in range(rows):
            r = list(base[i % len(base)])
            shift = (i // len(base)) * span
            r[8] = str(i + 1)
            r[9] = str(int(r[9]) + shift)
            r[10] = str(int(r[10]) + shift)
            w.writerow(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench_kernel_trace.csv"
        build(path, args.rows)
        tf = identify(path)
        # an epoch offset that puts the sample's BOOTTIME stamps in 2023 (offset 0 would be 1970: out of range)
        ctx = context_for(tf, node="bench", source="bench", clock=ClockOffset(1_700_000_000 * 10**9, 0, "bench"))
        base_t, aaco_t = [], []
        rows = 0
        for _ in range(args.rounds):
            t = time.perf_counter()
            table = pacsv.read_csv(path)
            base_t.append(time.perf_counter() - t)
            assert table.num_rows == args.rows
            t = time.perf_counter()
            rows = sum(p.kernels.num_rows for p in parse_any(tf, ctx))
            aaco_t.append(time.perf_counter() - t)
            assert rows == args.rows
        size = path.stat().st_size
    base_m, aaco_m = statistics.median(base_t), statistics.median(aaco_t)
    print(
        json.dumps(
            {
                "benchmark": "rocprofv3_decode",
                "rows": rows,
                "bytes": size,
                "baseline_read_csv_s": round(base_m, 4),
                "aaco_parse_s": round(aaco_m, 4),
                "ratio_speed_vs_bare": round(base_m / aaco_m, 3),
                "aaco_rows_per_s": round(rows / aaco_m),
                "goal": ">= 0.5",
                "rounds": args.rounds,
            }
        )
    )


if __name__ == "__main__":
    main()
