"""rocprofv3 CSV in full range: uint64 ids and handles, values past 64 bits, times outside 1990..2100."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.csv_rows import U64, WIDE
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.agent.sources.traces.rocprofv3_csv import Rocprofv3CsvDecoder
from aaco.contract.clock import ClockOffset
from tests.support.tracegen import HEADER_22

OFFSET = 1_700_000_000_000_000_000
CLOCK = ClockOffset(OFFSET, 10, "test")
U63, U64_ = 1 << 63, 1 << 64
T0 = 1_550_151_853_000_000
API_HEADER = '"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"'


def kernel_line(corr: int | str, start: int | str, end: int | str, **over: object) -> str:
    """A 22-column kernel trace row; ``over`` replaces columns by name."""
    values = {
        "Kind": '"KERNEL_DISPATCH"',
        "Agent_Id": '"Agent 4"',
        "Queue_Id": 1,
        "Stream_Id": 1,
        "Thread_Id": 834304,
        "Dispatch_Id": 1,
        "Kernel_Id": 10,
        "Kernel_Name": '"gemm(float*)"',
        "Correlation_Id": corr,
        "Start_Timestamp": start,
        "End_Timestamp": end,
        "LDS_Block_Size": 0,
        "Scratch_Size": 0,
        "VGPR_Count": 8,
        "Accum_VGPR_Count": 0,
        "SGPR_Count": 16,
        "Workgroup_Size_X": 64,
        "Workgroup_Size_Y": 1,
        "Workgroup_Size_Z": 1,
        "Grid_Size_X": 1024,
        "Grid_Size_Y": 1,
        "Grid_Size_Z": 1,
        **over,
    }
    return ",".join(str(values[c]) for c in HEADER_22.split(",")) + "\n"


def parse_file(path: Path):
    tf = identify(path)
    return list(parse_any(tf, context_for(tf, node="n", source="rocprofv3", clock=CLOCK)))


def kernels(parts) -> pa.Table:
    return pa.concat_tables([p.kernels for p in parts], promote_options="default")


def skipped(parts) -> Counter:
    return sum((p.skipped for p in parts), start=Counter())


def unsigned(col: pa.ChunkedArray) -> list[int]:
    return col.to_numpy().astype(np.int64).view(np.uint64).tolist()


def test_ids_at_or_above_2_63_keep_every_row_and_join(tmp_path):
    corrs = [U63 + i for i in range(1, 201)]
    body = "".join(
        kernel_line(c, T0 + 10_000 * i, T0 + 10_000 * i + 5_000, Queue_Id=U64_ - 1, Stream_Id=U63, Thread_Id=U63 + 7)
        for i, c in enumerate(corrs)
    )
    (tmp_path / "9_kernel_trace.csv").write_text(HEADER_22 + "\n" + body)
    hip = [API_HEADER] + [
        f'"HIP_RUNTIME_API","hipLaunchKernel",717,{U63 + 9},{c},{T0 + 10_000 * i - 3_000},{T0 + 10_000 * i - 1_000}'
        for i, c in enumerate(corrs)
    ]
    (tmp_path / "9_hip_api_trace.csv").write_text("\n".join(hip) + "\n")
    parts = parse_file(tmp_path / "9_kernel_trace.csv")
    k = kernels(parts)
    assert skipped(parts) == Counter() and k.num_rows == 200
    assert unsigned(k["correlation_id"]) == corrs  # the int64 of the same 64 bits
    assert set(unsigned(k["queue_id"])) == {U64_ - 1} and set(unsigned(k["stream"])) == {U63}
    assert set(k["launch_name"].to_pylist()) == {"hipLaunchKernel"}  # joined on the uint64 ids
    assert pc.all(pc.equal(pc.subtract(k["start_ns"], k["launch_start_ns"]), 3_000)).as_py()
    assert set(unsigned(k["tid"])) == {U63 + 9}  # the launching thread, from the HIP trace
    assert parts[0].anchor_raw_ns == T0 + 10_000 * 199 + 5_000 and parts[0].model is None


def decoder() -> Rocprofv3CsvDecoder:
    return Rocprofv3CsvDecoder(HEADER_22.encode() + b"\n", TraceContext("n", "i", "r", "m", "rocprofv3", CLOCK))


def test_widening_happens_only_when_a_value_needs_it():
    dec = decoder()
    ok = "".join(kernel_line(i, T0 + i * 100, T0 + i * 100 + 50) for i in range(1, 50)).encode()
    assert dec.decode(ok, 0).table.num_rows == 49
    assert set(dec.reader.types.values()) <= {pa.int64(), pa.string(), pa.dictionary(pa.int32(), pa.string())}
    big = kernel_line(U63 + 1, T0, T0 + 50).encode()
    res = dec.decode(ok + big, 0)
    assert res.table.num_rows == 50 and dec.reader.types["Correlation_Id"] == U64
    assert unsigned(res.table["correlation_id"])[-1] == U63 + 1
    mixed = kernel_line(-5, T0, T0 + 50).encode() + big  # a negative beside a uint64: decimal128
    res = dec.decode(mixed, 0)
    assert (
        res.table["correlation_id"].to_pylist() == [-5, -(1 << 63) + 1] and dec.reader.types["Correlation_Id"] == WIDE
    )
    assert dec.reader.types["Queue_Id"] == pa.int64()  # untouched columns stay on the fast type


def test_values_past_64_bits_and_bad_times_are_counted():
    rows = [
        kernel_line(1, T0, T0 + 10),
        kernel_line(U64_ + 5, T0, T0 + 10),  # needed, past 64 bits
        kernel_line(3, T0, T0 + 10, Grid_Size_X=2**80),  # needed, past 64 bits (25 digits: decimal128)
        kernel_line(4, T0, T0 + 10, Queue_Id="1" * 45),  # needed, past 38 digits: a bad row of its own
        kernel_line(5, U63 + 1, U63 + 9),  # a uint64 time, 292 years of uptime
        kernel_line(6, T0, T0 - 1),  # end before start
        kernel_line(7, -4, T0),  # negative
        kernel_line(8, T0, T0 + 10, Kernel_Id=2**80, Dispatch_Id=-1, VGPR_Count="1e999", SGPR_Count='"n/a"'),
        kernel_line(9, T0, T0 + 10, Stream_Id=U64_ - 1),
    ]
    res = decoder().decode("".join(rows).encode(), 0)
    assert res.table["correlation_id"].to_pylist() == [1, 8, 9]  # columns nobody reads never lose a row
    assert res.skipped == {"int_out_of_range": 3, "time_out_of_range": 1, "bad_time": 2}
    assert Counter(b.reason for b in res.bad_rows) == res.skipped


def test_times_outside_1990_2100_after_conversion():
    ctx = TraceContext("n", "i", "r", "m", "rocprofv3", ClockOffset(0, 0, "no offset"))
    dec = Rocprofv3CsvDecoder(HEADER_22.encode() + b"\n", ctx)
    late = 4_200_000_000 * 10**9  # 2103
    res = dec.decode((kernel_line(1, T0, T0 + 5) + kernel_line(2, late, late + 5)).encode(), 0)
    assert res.table.num_rows == 0 and res.skipped == {"time_out_of_range": 2}  # 1970 and 2103
    ok = 1_700_000_000 * 10**9
    res = dec.decode(kernel_line(3, ok, ok + 5).encode(), 0)
    assert res.table["start_ns"].to_pylist() == [ok]


def test_api_trace_with_big_ids_and_bad_rows(tmp_path):
    lines = [
        API_HEADER,
        f'"MARKER_CORE_API","step 0",{U63},{U63 + 1},{U64_ - 1},{T0},{T0 + 1_000}',
        f'"MARKER_CORE_API","step 1",717,717,{U64_ + 1},{T0},{T0 + 1_000}',
        f'"MARKER_CORE_API","step 2",717,717,7,{U63},{U63 + 1_000}',
        f'"MARKER_CORE_API","step 3",717,717,8,{T0 + 2_000},{T0 + 3_000}',
    ]
    (tmp_path / "5_marker_api_trace.csv").write_text("\n".join(lines) + "\n")
    parts = parse_file(tmp_path / "5_marker_api_trace.csv")
    its = pa.concat_tables([p.iterations for p in parts])
    assert its["name"].to_pylist() == ["step 0", "step 3"]
    assert skipped(parts) == {"int_out_of_range": 1, "time_out_of_range": 1}
    assert its["pid"].to_pylist()[0] == -(1 << 63)  # the same 64 bits
