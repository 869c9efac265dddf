"""A trace recorded on another boot lands at its real date through ``aaco replay`` and the lake."""

from __future__ import annotations

import json
import os

import pytest

from tests.support import tracegen

from .helpers import read_lake, run_aaco

pytestmark = pytest.mark.integration

MTIME = 1_709_294_400 * 10**9  # 2024-03-01T12:00:00Z: the trace was written then, on a machine long rebooted


def clock_of(out, name: str) -> dict:
    records = json.loads((out / "sources.json").read_text())["sources"]
    [rec] = [r for r in records if os.path.basename(r["subject"]) == name]
    return rec["clock"]


def raw_times(path) -> list[tuple[int, int]]:
    """(start, end) of every dispatch and copy, as the file stores them (CLOCK_BOOTTIME ns)."""
    records = json.loads(path.read_text())["rocprofiler-sdk-tool"][0]["buffer_records"]
    return sorted(
        (r["start_timestamp"], r["end_timestamp"]) for k in ("kernel_dispatch", "memory_copy") for r in records[k]
    )


def test_a_trace_from_another_boot_lands_at_its_real_date(tmp_path, aaco_bin):
    trace = tmp_path / "4242_results.json"
    info = tracegen.rocprofv3_json(trace, 40, 4)  # raw times of this boot; its metadata fini_time anchors it
    os.utime(trace, ns=(MTIME, MTIME))  # ... but the file says it was written in March 2024
    out = tmp_path / "lake"
    proc = run_aaco(aaco_bin, "replay", str(trace), "--out", str(out), "--log-level", "warning")
    assert proc.returncode == 0, proc.stderr
    assert "re-anchored" in proc.stderr and "file-anchor:rocprofv3_json" in proc.stderr
    offset = MTIME - info["fini_time"]
    kernels = read_lake(out, "kernels")
    got = sorted(zip(kernels["start_ns"].to_pylist(), kernels["end_ns"].to_pylist(), strict=True))
    assert got == [(s + offset, e + offset) for s, e in raw_times(trace)]
    assert max(e for _, e in got) <= MTIME
    assert min(s for s, _ in got) > MTIME - 3600 * 10**9  # the whole run in the hour before the file was written
    assert clock_of(out, trace.name) == {
        "offset_ns": offset,
        "uncertainty_ns": 10 * 10**9,
        "method": "file-anchor:rocprofv3_json",
    }
    assert set(kernels["model"].to_pylist()) == {"train_llm"}  # no iterations: the model its command line names


def test_an_explicit_offset_wins(tmp_path, aaco_bin):
    trace = tmp_path / "4242_results.json"
    tracegen.rocprofv3_json(trace, 10)
    os.utime(trace, ns=(MTIME, MTIME))
    given = 1_600_000_000 * 10**9
    out = tmp_path / "lake"
    proc = run_aaco(aaco_bin, "replay", str(trace), "--out", str(out), "--clock-offset", str(given))
    assert proc.returncode == 0, proc.stderr
    assert "re-anchored" not in proc.stderr
    kernels = read_lake(out, "kernels")
    got = sorted(zip(kernels["start_ns"].to_pylist(), kernels["end_ns"].to_pylist(), strict=True))
    assert got == [(s + given, e + given) for s, e in raw_times(trace)]
    assert clock_of(out, trace.name) == {"offset_ns": given, "uncertainty_ns": 0, "method": "explicit"}
