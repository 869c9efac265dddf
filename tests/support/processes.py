"""Processes to profile in tests: plain Python sleepers named by their script (``python train_sleeper.py``)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def sleepers(folder: Path, count: int, name: str = "train_sleeper") -> Iterator[list[int]]:
    """``count`` processes running ``folder/<name>.py`` (a 300 s sleep), killed on exit: their pids."""
    script = folder / f"{name}.py"
    script.write_text("import time\ntime.sleep(300)\n")
    procs = [subprocess.Popen([sys.executable, str(script)]) for _ in range(count)]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()
