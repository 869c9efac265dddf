"""rocprofv3 CSV: the real sample, both column layouts, companions, the incremental decoder."""

from __future__ import annotations

import csv
import gzip
import io
import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from aaco.agent.sources.traces import rocprofv3_csv
from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.detect import identify, sniff
from aaco.agent.sources.traces.limits import TraceLimitError, TraceLimits
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.agent.sources.traces.rocprofv3_csv import Rocprofv3CsvDecoder, companions, read_agent_info
from aaco.contract.clock import ClockOffset
from aaco.contract.schemas import conform

OFFSET = 1_700_000_000_000_000_000
CLOCK = ClockOffset(OFFSET, 10, "test")


def ctx(**kw) -> TraceContext:
    return TraceContext("node-a", "ident", "run-1", "model-x", "rocprofv3", CLOCK, **kw)


def sample_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def kernels_of(parts) -> pa.Table:
    tables = [conform("kernels", p.kernels) for p in parts]
    return pa.Table.from_batches(tables)


def total_ns(t: pa.Table) -> int:
    return pc.sum(pc.subtract(t["end_ns"], t["start_ns"])).as_py() or 0


# --- the documented layouts (rocprofiler-sdk source/docs, generateCSV.cpp) -----------------------

# 18 columns, ROCm 6.3/6.4 (numeric Agent_Id = node id, Private/Group_Segment_Size)
LAYOUT_18 = (
    '"Kind","Agent_Id","Queue_Id","Thread_Id","Dispatch_Id","Kernel_Id","Kernel_Name","Correlation_Id",'
    '"Start_Timestamp","End_Timestamp","Private_Segment_Size","Group_Segment_Size","Workgroup_Size_X",'
    '"Workgroup_Size_Y","Workgroup_Size_Z","Grid_Size_X","Grid_Size_Y","Grid_Size_Z"\n'
    '"KERNEL_DISPATCH",4,1,74441,1,2,"__amd_rocclr_initHeap",14,1614963487781917,1614963487791997,0,0,256,1,1,256,1,1\n'
    '"KERNEL_DISPATCH",4,1,74441,2,11,"simple_add_kernel(float*, float const*, int)",15,'
    "1614963487800000,1614963487808280,0,0,1024,1,1,1048576,1,1\n"
)
# 16 columns, the first rocprofv3 release
LAYOUT_16 = (
    '"Kind","Agent_Id","Queue_Id","Kernel_Id","Kernel_Name","Correlation_Id","Start_Timestamp","End_Timestamp",'
    '"Private_Segment_Size","Group_Segment_Size","Workgroup_Size_X","Workgroup_Size_Y","Workgroup_Size_Z",'
    '"Grid_Size_X","Grid_Size_Y","Grid_Size_Z"\n'
    '"KERNEL_DISPATCH",4,1,2,"__omp_offloading_32_2f3c6__QMnorm_modPnorm_l26",1,5329321973213203,5329321973322123,'
    "0,4360,256,1,1,233472,1,1\n"
)
AGENT_INFO_HEADER = (
    '"Node_Id","Logical_Node_Id","Agent_Type","Cpu_Cores_Count","Simd_Count","Cpu_Core_Id_Base","Simd_Id_Base",'
    '"Max_Waves_Per_Simd","Lds_Size_In_Kb","Gds_Size_In_Kb","Num_Gws","Wave_Front_Size","Num_Xcc","Cu_Count",'
    '"Array_Count","Num_Shader_Banks","Simd_Arrays_Per_Engine","Cu_Per_Simd_Array","Simd_Per_Cu",'
    '"Max_Slots_Scratch_Cu","Gfx_Target_Version","Vendor_Id","Device_Id","Location_Id","Domain",'
    '"Drm_Render_Minor","Num_Sdma_Engines","Num_Sdma_Xgmi_Engines","Num_Sdma_Queues_Per_Engine","Num_Cp_Queues",'
    '"Max_Engine_Clk_Ccompute","Max_Engine_Clk_Fcompute","Sdma_Fw_Version","Fw_Version","Capability",'
    '"Cu_Per_Engine","Max_Waves_Per_Cu","Family_Id","Workgroup_Max_Size","Grid_Max_Size","Local_Mem_Size",'
    '"Hive_Id","Gpu_Id","Workgroup_Max_Dim_X","Workgroup_Max_Dim_Y","Workgroup_Max_Dim_Z","Grid_Max_Dim_X",'
    '"Grid_Max_Dim_Y","Grid_Max_Dim_Z","Name","Vendor_Name","Product_Name","Model_Name"\n'
)


def agent_row(node: int, kind: str, name: str, product: str) -> str:
    fields = [str(node), str(node), f'"{kind}"'] + ["0"] * 46 + [f'"{name}"', '"AMD"', f'"{product}"', '""']
    return ",".join(fields) + "\n"


# four CPU nodes then four GPUs, as on an MI300A node (node ids 4..7 are GPUs 0..3)
AGENT_INFO = (
    AGENT_INFO_HEADER
    + "".join(
        agent_row(i, "CPU", "AMD Instinct MI300A Accelerator", "AMD Instinct MI300A Accelerator") for i in range(4)
    )
    + "".join(agent_row(i, "GPU", "gfx942", "AMD Instinct MI300A") for i in range(4, 8))
)
MEMORY_COPY = (
    '"Kind","Direction","Stream_Id","Source_Agent_Id","Destination_Agent_Id","Correlation_Id","Start_Timestamp",'
    '"End_Timestamp"\n'
    '"MEMORY_COPY","MEMORY_COPY_HOST_TO_DEVICE",1,"Agent 0","Agent 4",20,1550151853000000,1550151853001000\n'
    '"MEMORY_COPY","MEMORY_COPY_HOST_TO_DEVICE",1,"Agent 0","Agent 4",21,1550151853002000,1550151853002500\n'
    '"MEMORY_COPY","MEMORY_COPY_DEVICE_TO_HOST",1,"Agent 5","Agent 0",22,1550151853200000,1550151853204000\n'
)
MARKERS = (
    '"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"\n'
    '"MARKER_CORE_API","before hipLaunchKernel",717,717,100,1550151853020000,1550151853020000\n'
    '"MARKER_CONTROL_API","roctxProfilerPause",717,717,101,1550151853020100,1550151853020200\n'
    '"MARKER_CORE_API","step 0",717,717,102,1550151853025000,1550151853080000\n'
    '"MARKER_CORE_API","step 1",717,717,103,1550151853080000,1550151853180000\n'
    '"MARKER_CORE_RANGE_API","epoch",717,0,104,1550151853010000,1550151853190000\n'
)


def hip_trace(rows: list[dict[str, str]]) -> str:
    """A HIP API trace whose hipLaunchKernel calls (thread 900) launched the sample's dispatches."""
    out = ['"Domain","Function","Process_Id","Thread_Id","Correlation_Id","Start_Timestamp","End_Timestamp"']
    out.append('"HIP_RUNTIME_API","hipGetDeviceCount",717,717,1000,1550151852000000,1550151852000100')
    for r in rows:
        start = int(r["Start_Timestamp"]) - 5000
        out.append(f'"HIP_RUNTIME_API","hipLaunchKernel",717,900,{r["Correlation_Id"]},{start},{start + 1200}')
    for corr, start in ((20, 1550151852999000), (21, 1550151853001900), (22, 1550151853199000)):
        out.append(f'"HIP_RUNTIME_API","hipMemcpyAsync",717,717,{corr},{start},{start + 6000}')
    return "\n".join(out) + "\n"


@pytest.fixture
def run_dir(tmp_path, samples) -> Path:
    rows = sample_rows(samples / "rocprofv3/kernel_trace.csv")
    (tmp_path / "1234_kernel_trace.csv").write_bytes((samples / "rocprofv3/kernel_trace.csv").read_bytes())
    (tmp_path / "1234_memory_copy_trace.csv").write_text(MEMORY_COPY)
    (tmp_path / "1234_hip_api_trace.csv").write_text(hip_trace(rows))
    (tmp_path / "1234_marker_api_trace.csv").write_text(MARKERS)
    (tmp_path / "1234_agent_info.csv").write_text(AGENT_INFO)
    return tmp_path


def parse_path(path: Path, **kw):
    tf = identify(path)
    return tf, list(parse_any(tf, context_for(tf, node="node-a", source="rocprofv3", clock=CLOCK, **kw)))


# --- tests ---------------------------------------------------------------------------------------


def test_real_sample_exact(samples):
    path = samples / "rocprofv3/kernel_trace.csv"
    rows = sample_rows(path)
    tf, parts = parse_path(path)
    assert tf.format == "rocprofv3_kernel_csv"
    k = kernels_of(parts)
    assert k.num_rows == 9 == len(rows)
    expected = sum(int(r["End_Timestamp"]) - int(r["Start_Timestamp"]) for r in rows)
    assert total_ns(k) == expected == 96_160
    assert sorted(k["start_ns"].to_pylist()) == sorted(int(r["Start_Timestamp"]) + OFFSET for r in rows)
    assert set(k["kind"].to_pylist()) == {"kernel"}
    assert set(k["name"].to_pylist()) == {r["Kernel_Name"] for r in rows}
    assert k["correlation_id"].to_pylist() == [int(r["Correlation_Id"]) for r in rows]
    assert set(k["tid"].to_pylist()) == {834304}
    assert k["device"].to_pylist() == ["Agent 4"] * 9  # no agent_info beside it: the tool's label
    assert k["grid_x"].to_pylist() == [1024] * 9 and k["workgroup_x"].to_pylist() == [64] * 9
    assert k["stream"].to_pylist()[:5] == [1, 1, 1, 1, 2]
    assert set(k["run_id"].to_pylist()) == {parts[0].kernels["run_id"][0].as_py()}
    assert parts[0].clock == CLOCK
    assert not any(p.skipped for p in parts) and not any(p.bad_rows for p in parts)


def test_gzip_by_content(samples, tmp_path):
    p = tmp_path / "trace.bin"
    p.write_bytes(gzip.compress((samples / "rocprofv3/kernel_trace.csv").read_bytes()))
    tf, parts = parse_path(p)
    assert tf.format == "rocprofv3_kernel_csv"
    assert kernels_of(parts).num_rows == 9


@pytest.mark.parametrize(("text", "names", "durations"), [(LAYOUT_18, 2, 10_080 + 8_280), (LAYOUT_16, 1, 108_920)])
def test_older_layouts(tmp_path, text, names, durations):
    (tmp_path / "77_kernel_trace.csv").write_text(text)
    (tmp_path / "77_agent_info.csv").write_text(AGENT_INFO)
    tf, parts = parse_path(tmp_path / "77_kernel_trace.csv")
    assert tf.format == "rocprofv3_kernel_csv"
    k = kernels_of(parts)
    assert k.num_rows == names
    assert total_ns(k) == durations
    assert set(k["device"].to_pylist()) == {"0"}  # numeric Agent_Id 4 = node 4 = the first GPU
    assert parts[0].devices["0"]["product_name"] == "AMD Instinct MI300A"
    assert k["pid"].to_pylist() == [77] * names  # the pid prefix rocprofv3 gives its files


def test_companions_found_by_prefix(run_dir):
    found = companions(run_dir / "1234_kernel_trace.csv")
    assert set(found) == {
        "kernel_trace.csv",
        "memory_copy_trace.csv",
        "hip_api_trace.csv",
        "marker_api_trace.csv",
        "agent_info.csv",
    }


def test_kernels_with_launches_and_devices(run_dir, samples):
    rows = sample_rows(samples / "rocprofv3/kernel_trace.csv")
    _, parts = parse_path(run_dir / "1234_kernel_trace.csv")
    k = kernels_of(parts)
    assert k.num_rows == 9
    assert k["device"].to_pylist() == ["0"] * 9  # "Agent 4" -> node 4 -> GPU 0 (agent_info)
    assert parts[0].devices == {
        "0": {
            "type": "GPU",
            "name": "gfx942",
            "product_name": "AMD Instinct MI300A",
            "node_id": 4,
            "logical_node_id": 4,
            "label": "Agent 4",
        }
    }
    assert k["launch_name"].to_pylist() == ["hipLaunchKernel"] * 9
    assert k["tid"].to_pylist() == [900] * 9  # the launching thread, not the dispatch record's
    assert k["pid"].to_pylist() == [717] * 9
    starts = [int(r["Start_Timestamp"]) for r in rows]
    assert k["launch_start_ns"].to_pylist() == [s - 5000 + OFFSET for s in starts]
    assert k["launch_end_ns"].to_pylist() == [s - 3800 + OFFSET for s in starts]


def test_memory_copies(run_dir):
    tf, parts = parse_path(run_dir / "1234_memory_copy_trace.csv")
    assert tf.format == "rocprofv3_memcpy_csv"
    k = kernels_of(parts)
    assert k["kind"].to_pylist() == ["memcpy"] * 3
    assert k["name"].to_pylist() == ["MEMORY_COPY_HOST_TO_DEVICE"] * 2 + ["MEMORY_COPY_DEVICE_TO_HOST"]
    assert k["device"].to_pylist() == ["0", "0", "1"]  # the GPU side: destination, destination, source
    assert total_ns(k) == 1000 + 500 + 4000
    assert k["launch_name"].to_pylist() == ["hipMemcpyAsync"] * 3
    assert k["correlation_id"].to_pylist() == [20, 21, 22]


def test_marker_ranges_are_iterations(run_dir):
    tf, parts = parse_path(run_dir / "1234_marker_api_trace.csv")
    assert tf.format == "rocprofv3_api_csv"
    assert sum(p.kernels.num_rows for p in parts) == 0
    its = pa.Table.from_batches([conform("iterations", parts[0].iterations)])
    assert its["name"].to_pylist() == ["epoch", "step 0", "step 1"]  # marks and control calls are not ranges
    assert its["iteration"].to_pylist() == [0, 1, 2]
    assert its["end_ns"][1].as_py() - its["start_ns"][1].as_py() == 55_000_000 // 1000
    assert its["pid"].to_pylist() == [717] * 3
    assert len(set(its["trace_id"].to_pylist())) == 3
    _, again = parse_path(run_dir / "1234_marker_api_trace.csv")
    assert again[0].iterations["trace_id"].to_pylist() == its["trace_id"].to_pylist()  # deterministic


def test_hip_and_agent_files_alone_give_no_events(run_dir):
    for name in ("1234_hip_api_trace.csv", "1234_agent_info.csv"):
        _, parts = parse_path(run_dir / name)
        assert sum(p.kernels.num_rows + p.iterations.num_rows for p in parts) == 0


def test_directory_yields_every_event_once(run_dir):
    kinds: dict[str, int] = {}
    iterations = 0
    for path in sorted(run_dir.iterdir()):
        _, parts = parse_path(path)
        for p in parts:
            for kind in p.kernels["kind"].to_pylist():
                kinds[kind] = kinds.get(kind, 0) + 1
            iterations += p.iterations.num_rows
    assert kinds == {"kernel": 9, "memcpy": 3}
    assert iterations == 3


def test_agent_info_type_indexes():
    agents = read_agent_info(AGENT_INFO.encode())
    assert agents.resolve_label("Agent 6") == "2"
    assert agents.resolve_label("GPU 3") == "3"
    assert agents.resolve_label("6") == "2"
    assert agents.resolve_label("Agent 1") == "cpu1"
    assert agents.resolve_label("Agent 99") == "Agent 99"


def test_sniff_api_and_agent_files():
    assert sniff(MARKERS.encode()) == "rocprofv3_api_csv"
    assert sniff(AGENT_INFO.encode()) == "rocprofv3_agent_info_csv"
    assert sniff(MEMORY_COPY.encode()) == "rocprofv3_memcpy_csv"
    assert sniff(LAYOUT_16.encode()) == "rocprofv3_kernel_csv"


def test_decoder_chunks_equal_whole(samples):
    data = (samples / "rocprofv3/kernel_trace.csv").read_bytes()
    header_end = data.index(b"\n") + 1
    dec = Rocprofv3CsvDecoder(data[:header_end], ctx(pid=5))
    whole = dec.decode(data[header_end:], header_end).table
    body = data[header_end:]
    cuts = [0]
    for i, b in enumerate(body):
        if b == 10 and len(cuts) < 4:
            cuts.append(i + 1)
    cuts.append(len(body))
    pieces = [dec.decode(body[a:b], header_end + a).table for a, b in itertools.pairwise(cuts)]
    joined = pa.concat_tables(pieces)
    assert joined.to_pylist() == whole.to_pylist()
    assert whole["pid"].to_pylist() == [5] * 9


def test_decoder_reports_bad_rows_with_offsets(samples):
    data = (samples / "rocprofv3/kernel_trace.csv").read_bytes()
    lines = data.split(b"\n")
    lines.insert(3, b"\x00\x01\x02 binary junk \xff\xfe")
    lines.insert(6, lines[5].replace(b",1024,1024,1", b",1024,x024,1"))  # a number that is not one
    lines.insert(8, lines[7].replace(b"KERNEL_DISPATCH", b"KERNEL_DISPATCH").rsplit(b",", 4)[0])  # columns cut
    mutated = b"\n".join(lines)
    header_end = mutated.index(b"\n") + 1
    dec = Rocprofv3CsvDecoder(mutated[:header_end], ctx())
    res = dec.decode(mutated[header_end:], header_end)
    assert res.table.num_rows == 9  # every good row kept
    assert sorted(b.reason for b in res.bad_rows) == ["bad_value", "column_count", "not_a_row"]
    assert res.skipped == {"bad_value": 1, "column_count": 1, "not_a_row": 1}
    for bad in res.bad_rows:
        assert mutated[bad.offset : bad.offset + len(bad.line)] == bad.line
        assert bad.offset == 0 or mutated[bad.offset - 1 : bad.offset] == b"\n"


def test_decoder_checks_values(samples):
    data = (samples / "rocprofv3/kernel_trace.csv").read_bytes()
    lines = data.split(b"\n")
    lines[1] = lines[1].replace(b"1550151853029637,1550151853042437", b"1550151853042437,1550151853029637")
    lines[2] = lines[2].replace(b'"KERNEL_DISPATCH"', b'"MEMORY_COPY"')
    name = b"k" * (2 * 1024 * 1024)
    lines[3] = lines[3].replace(b'"multiply_kernel(float*, float const*, float const*, int, int)"', b'"' + name + b'"')
    lines[4] = lines[4].replace(b",1550151853042437,", b",,")
    mutated = b"\n".join(lines)
    header_end = mutated.index(b"\n") + 1
    res = Rocprofv3CsvDecoder(mutated[:header_end], ctx()).decode(mutated[header_end:], header_end)
    assert res.table.num_rows == 5
    assert res.skipped == {"bad_time": 1, "bad_kind": 1, "name_too_long": 1, "missing_value": 1}
    offsets = {b.reason: b.offset for b in res.bad_rows}
    starts = [0]
    for ln in lines[:-1]:
        starts.append(starts[-1] + len(ln) + 1)
    assert offsets == {
        "bad_time": starts[1],
        "bad_kind": starts[2],
        "name_too_long": starts[3],
        "missing_value": starts[4],
    }


def test_decoder_rejects_other_headers():
    with pytest.raises(ValueError, match="not a rocprofv3 kernel"):
        Rocprofv3CsvDecoder(MARKERS.encode(), ctx())


def test_repeated_header_is_not_damage(samples):
    data = (samples / "rocprofv3/kernel_trace.csv").read_bytes()
    header_end = data.index(b"\n") + 1
    res = Rocprofv3CsvDecoder(data[:header_end], ctx()).decode(data, 0)
    assert res.table.num_rows == 9 and not res.bad_rows and not res.skipped


def test_csv_module_agrees_on_quoted_names(tmp_path):
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_NONNUMERIC, lineterminator="\n")
    header = LAYOUT_18.splitlines()[0]
    names = next(csv.reader([header]))
    w.writerow(names)
    row = ["KERNEL_DISPATCH", 4, 1, 5, 1, 2, 'weird "quoted", name', 3, 100, 250, 0, 0, 64, 1, 1, 64, 1, 1]
    w.writerow(row)
    (tmp_path / "k_kernel_trace.csv").write_text(buf.getvalue())
    _, parts = parse_path(tmp_path / "k_kernel_trace.csv")
    k = kernels_of(parts)
    assert k["name"].to_pylist() == ['weird "quoted", name']
    assert total_ns(k) == 150


# --- the file's limits (limits) ------------------------------------------------------------


def parse_limited(path: Path, limits: TraceLimits, max_bytes: int | None = None) -> list:
    return list(rocprofv3_csv.parse_csv_file(path, ctx(), max_bytes, limits=limits))


def test_gzip_bomb_and_size_limits_are_the_files(samples, tmp_path):
    header, _, body = (samples / "rocprofv3/kernel_trace.csv").read_bytes().partition(b"\n")
    data = header + b"\n" + body * 2_000  # 18,000 rows, about 4 MB, compresses about 100:1
    p = tmp_path / "1_kernel_trace.csv.gz"
    p.write_bytes(gzip.compress(data))
    assert kernels_of(parse_limited(p, TraceLimits())).num_rows == 18_000
    with pytest.raises(TraceLimitError) as exc:
        parse_limited(p, TraceLimits(max_gzip_ratio=20, gzip_grace_bytes=1 << 20))
    assert exc.value.limit == "max_gzip_ratio"
    with pytest.raises(TraceLimitError) as exc:
        parse_limited(p, TraceLimits(), max_bytes=len(data) - 1)  # max_bytes sets max_file_bytes
    assert exc.value.limit == "max_file_bytes"
    assert kernels_of(parse_limited(p, TraceLimits(max_file_bytes=1), max_bytes=len(data))).num_rows == 18_000


def test_a_companion_past_the_limits_is_left_aside(run_dir):
    kernel = run_dir / "1234_kernel_trace.csv"
    hip = run_dir / "1234_hip_api_trace.csv"
    hip.write_bytes(hip.read_bytes() + b" " * (kernel.stat().st_size + 10))
    limits = TraceLimits(max_file_bytes=kernel.stat().st_size + 5)
    k = kernels_of(parse_limited(kernel, limits))
    assert k.num_rows == 9 and k["launch_start_ns"].null_count == 9  # no launches: their file was too large
    k = kernels_of(parse_limited(kernel, TraceLimits()))
    assert k.num_rows == 9 and k["launch_start_ns"].null_count == 0
