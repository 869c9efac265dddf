"""Start-up of ``aaco --version`` and ``aaco --help`` against ``python -c pass`` (the interpreter's floor).

Each round runs the three commands once, in turn (interleaved, so drift in the machine's load touches
all three alike), as subprocesses timed by wall clock; the figures are medians over the rounds, in
seconds, with each command's ratio to ``python -c pass``. The ``aaco`` commands run as
``python -m aaco.agent`` under the same interpreter, so the console script's wrapper is not timed.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

COMMANDS: dict[str, list[str]] = {
    "python_pass": [sys.executable, "-c", "pass"],
    "aaco_version": [sys.executable, "-m", "aaco.agent", "--version"],
    "aaco_help": [sys.executable, "-m", "aaco.agent", "--help"],
}


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    """Time the commands over interleaved rounds and print the medians and ratios as one JSON line."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7, help="Rounds (at least 5).")
    args = parser.parse_args()
    rounds = max(5, args.rounds)
    for cmd in COMMANDS.values():  # warm the page cache and .pyc files; not timed
        _wall(cmd)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(rounds):
        for name, cmd in COMMANDS.items():
            times[name].append(_wall(cmd))
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    floor = medians["python_pass"]
    doc = {
        "rounds": rounds,
        "median_s": {name: round(v, 4) for name, v in medians.items()},
        "ratio_to_python_pass": {name: round(v / floor, 2) for name, v in medians.items() if name != "python_pass"},
    }
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
