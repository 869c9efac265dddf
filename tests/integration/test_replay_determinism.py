"""A replay is deterministic: the same trace sends the same spans on a quiet machine and on a slowed one.

The span rate budget of a replay runs on the kernels' own clock (``exporters.otlp.rate_clock: trace``),
so how many kernels are summarised depends on the trace alone. Here the trace holds more kernels a
second than the budget allows, so kernels are summarised; one replay runs alone, the other pinned to
one CPU beside a busy loop pinned there too, and the real receiver gets the same spans from both.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter

import pytest

from tests.support import tracegen
from tests.support.otlp_receivers import GrpcReceiver

pytestmark = pytest.mark.integration

KERNELS, PER_STEP, GAP_US, RATE = 24_000, 1000, 80, 4_000  # 12,500 kernels a second of trace time, over 2 s


def spans_of(aaco_bin, tmp_path, trace, name, prefix=()):
    with GrpcReceiver() as rx:
        env = {"AACO_EXPORTERS_OTLP_MAX_SPANS_PER_SECOND": str(RATE)}
        args = ["replay", str(trace), "--out", str(tmp_path / name), "--otlp-endpoint", f"http://127.0.0.1:{rx.port}"]
        proc = subprocess.run(
            [*prefix, aaco_bin, *args],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, **env},
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        return {(s.trace_id, s.span_id, s.parent_span_id, s.name) for _, s in rx.got.spans()}, proc.stderr


def test_the_same_trace_sends_the_same_spans_on_a_quiet_and_a_slowed_machine(tmp_path, aaco_bin, samples):
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is needed to pin the replay beside a busy loop")
    trace = tmp_path / "steps.json"
    tracegen.kineto(samples, trace, KERNELS, per_step=PER_STEP, gap_us=GAP_US)
    quiet, said = spans_of(aaco_bin, tmp_path, trace, "quiet")
    hog = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", "while True: pass"])
    try:
        slowed, _ = spans_of(aaco_bin, tmp_path, trace, "slowed", prefix=("taskset", "-c", "0"))
    finally:
        hog.kill()
        hog.wait()
    assert quiet == slowed
    kinds = Counter(name for *_, name in quiet)
    assert kinds["ProfilerStep"] == KERNELS // PER_STEP
    kernels = sum(1 for *_, parent, name in quiet if parent and name != "cudaLaunchKernel")
    assert 0 < kernels < KERNELS  # the budget summarised some: the case where a wall clock would differ
    summarised = KERNELS - kernels
    assert f"{summarised} summarised on their root spans" in said
    assert "max_spans_per_second (of the kernels' own time)" in said
