"""CLOCK_BOOTTIME traces from another boot: an implausible conversion is found and re-anchored, consistently."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pyarrow as pa
import pytest

from aaco.agent.sources.traces.clock_anchor import (
    ANCHOR_UNCERTAINTY_NS,
    FUTURE_SLACK_NS,
    PAST_WINDOW_NS,
    BootClockCheck,
    implausible,
)
from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.agent.sources.traces.parsed import ParsedTrace
from aaco.contract.clock import EPOCH_FLOOR_NS, ClockOffset, boottime_offset

S = 10**9
MTIME = 1_709_294_400 * S  # 2024-03-01T12:00:00Z: when the file was written
NOW = 1_764_000_000 * S  # late 2025: when it is replayed
HOST = ClockOffset(NOW - 3600 * S, 40, "boottime-bracket")  # this host booted an hour ago
RAW = 9 * 86400 * S  # nine days into the recording machine's uptime: converts to nine days after now


def chunk(raw: list[int], *, launch: list[int | None] | None = None, its: tuple[int, ...] = (), **kw) -> ParsedTrace:
    """A chunk of kernels of ``raw`` start times (100 ns long) and iterations, converted with the host offset."""
    off = HOST.offset_ns

    def times(values, plus: int = 0) -> pa.Array:
        return pa.array([None if v is None else v + plus + off for v in values], pa.int64())

    kernels = pa.table(
        {
            "start_ns": times(raw),
            "end_ns": times(raw, 100),
            "launch_start_ns": times(launch or [None] * len(raw)),
            "name": pa.array([f"k{i}" for i in range(len(raw))]),
        }
    )
    iterations = pa.table({"start_ns": times(its), "end_ns": times(its, 500)})
    return ParsedTrace("rocprofv3_json", kernels, iterations, HOST, **kw)


def check(parts: list[ParsedTrace], *, fmt: str = "rocprofv3_json", clock: ClockOffset = HOST) -> list[ParsedTrace]:
    tf = TraceFile(Path("/traces/4242_results.json"), fmt, "0" * 24, MTIME, 1)
    ctx = TraceContext("n", "id", "run", "model", "src", clock=clock)
    return list(BootClockCheck(tf, ctx, now_ns=NOW).apply(iter(parts)))


def starts(p: ParsedTrace) -> list[int]:
    return p.kernels["start_ns"].to_pylist()


def test_implausible():
    assert implausible(NOW + FUTURE_SLACK_NS + 1, MTIME, NOW) == "after now"
    assert implausible(MTIME + FUTURE_SLACK_NS + 1, MTIME, NOW) == "after the file was last written"
    assert implausible(MTIME - PAST_WINDOW_NS - 1, MTIME, NOW) == "more than a day before the file was last written"
    assert implausible(MTIME - 3600 * S, MTIME, NOW) is None
    assert implausible(MTIME + FUTURE_SLACK_NS, MTIME, NOW) is None
    assert implausible(MTIME - 30 * 86400 * S, 0, NOW) is None  # no mtime: only the future can be judged


def test_the_files_anchor_maps_to_its_mtime():
    anchor = RAW + 10**6 + 7 * S  # fini_time: the run ended 7 s after its last kernel
    parts = check(
        [chunk([RAW, RAW + 10**6], launch=[RAW - 50, None], its=(RAW - 1000,), anchor_raw_ns=anchor), chunk([RAW + 5])]
    )
    offset = MTIME - anchor
    assert [p.clock for p in parts] == [ClockOffset(offset, ANCHOR_UNCERTAINTY_NS, "file-anchor:rocprofv3_json")] * 2
    assert starts(parts[0]) == [RAW + offset, RAW + 10**6 + offset]
    assert parts[0].kernels["end_ns"].to_pylist() == [RAW + 100 + offset, RAW + 10**6 + 100 + offset]
    assert parts[0].kernels["launch_start_ns"].to_pylist() == [RAW - 50 + offset, None]
    assert parts[0].iterations.to_pylist() == [{"start_ns": RAW - 1000 + offset, "end_ns": RAW - 500 + offset}]
    assert starts(parts[1]) == [RAW + 5 + offset]  # every chunk by the same amount
    assert parts[0].kernels["name"].to_pylist() == ["k0", "k1"]


def test_without_an_anchor_the_newest_event_of_the_first_chunk_is_the_mtime():
    parts = check([chunk([RAW, RAW + 300], its=(RAW + 200,))])  # the iteration ends last: RAW + 700
    assert parts[0].clock.method == "file-mtime"
    assert parts[0].iterations["end_ns"].to_pylist() == [MTIME]
    assert starts(parts[0]) == [MTIME - 700, MTIME - 400]


def test_events_long_before_the_file_was_written_are_another_boot():
    raw = MTIME - HOST.offset_ns - 40 * 86400 * S  # converts to 40 days before the mtime
    assert check([chunk([raw])])[0].clock.method == "file-mtime"


def test_plausible_explicit_and_self_anchored_traces_are_left_alone():
    plausible = MTIME - 3600 * S - HOST.offset_ns  # an hour before the file was written
    for parts, kw in (
        ([chunk([plausible])], {}),
        ([chunk([RAW])], {"clock": ClockOffset(HOST.offset_ns, 0, "explicit")}),
        ([chunk([RAW])], {"fmt": "kineto"}),
    ):
        before = starts(parts[0])
        out = check(parts, **kw)
        assert out[0].clock == HOST and starts(out[0]) == before, kw


def test_leading_chunks_without_events_wait_for_the_decision():
    parts = check([chunk([], anchor_raw_ns=RAW + 100), chunk([RAW])])
    assert [p.clock.method for p in parts] == ["file-anchor:rocprofv3_json"] * 2
    assert starts(parts[1]) == [MTIME - 100]


def test_rows_shifted_out_of_range_are_counted():
    old = RAW - (MTIME - EPOCH_FLOOR_NS) - 86400 * S  # lands before 1990 once anchored
    parts = check([chunk([old, RAW], launch=[old, RAW - 10])])
    assert parts[0].clock.method == "file-mtime"
    assert starts(parts[0]) == [MTIME - 100]
    assert parts[0].kernels["launch_start_ns"].to_pylist() == [MTIME - 110]
    assert parts[0].skipped["time_out_of_range"] == 1


def test_warns_once_per_file(caplog):
    with caplog.at_level(logging.WARNING, logger="aaco.sources.clock"):
        check([chunk([RAW]), chunk([RAW + 1]), chunk([RAW + 2])])
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "4242_results.json" in lines[0] and "file-mtime" in lines[0]


def test_a_real_csv_from_another_boot_lands_at_its_mtime(tmp_path, samples):
    header, _, body = (samples / "rocprofv3/kernel_trace.csv").read_bytes().partition(b"\n")
    names = header.decode().replace('"', "").split(",")
    s_col, e_col = names.index("Start_Timestamp"), names.index("End_Timestamp")
    base = time.clock_gettime_ns(time.CLOCK_BOOTTIME) + 3 * 86400 * S  # three days past this boot's uptime
    lines = []
    for i, line in enumerate(body.decode().strip().splitlines()):
        cells = line.split(",")
        shift = len(cells) - len(names)  # the kernel name holds commas: count columns from the end
        cells[s_col + shift], cells[e_col + shift] = str(base + i * 1000), str(base + i * 1000 + 600)
        lines.append(",".join(cells))
    p = tmp_path / "other_boot_kernel_trace.csv"
    p.write_text(header.decode() + "\n" + "\n".join(lines) + "\n")
    os.utime(p, ns=(MTIME, MTIME))
    tf = identify(p)
    parts = list(parse_any(tf, context_for(tf, node="n", source="s", clock=boottime_offset())))
    ends = [e for part in parts for e in part.kernels["end_ns"].to_pylist()]
    assert len(ends) == len(lines)
    assert max(ends) == MTIME
    assert min(ends) == MTIME - (len(lines) - 1) * 1000
    assert parts[0].clock.method in ("file-mtime", "file-anchor:rocprofv3_kernel_csv")


@pytest.mark.parametrize("method", ["test", "explicit"])
def test_csv_with_a_given_offset_is_not_reanchored(tmp_path, samples, method):
    p = tmp_path / "k_kernel_trace.csv"
    p.write_bytes((samples / "rocprofv3/kernel_trace.csv").read_bytes())
    os.utime(p, ns=(MTIME, MTIME))
    tf = identify(p)
    clock = ClockOffset(1_600_000_000 * S, 0, method)
    parts = list(parse_any(tf, context_for(tf, node="n", source="s", clock=clock)))
    assert all(part.clock == clock for part in parts)
