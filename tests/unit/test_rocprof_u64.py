"""rocprofv3 JSON in full range: unsigned 64-bit ids, numbers past 64 bits, numbers ijson cannot convert.

Also the shared pieces (``u64``): the value readers, the time window, ``NumberGuard``,
``U64Column``, and ``model_names.model_from_command``.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path

import ijson
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from aaco.agent.sources.traces import u64 as u
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.model_names import model_from_command
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.contract.clock import EPOCH_CEIL_NS, EPOCH_FLOOR_NS, ClockOffset
from tests.support import tracegen

from .test_rocprof_json import CLOCK, build, totals, write

U63, U64 = 1 << 63, 1 << 64
INF = float("inf")  # written as 1e999 (write_raw)


def parse(path: Path, clock: ClockOffset | None = None):
    tf = identify(path)
    return list(parse_any(tf, context_for(tf, node="n", source="rocprofv3", **({"clock": clock} if clock else {}))))


def skipped(parts) -> Counter:
    return sum((p.skipped for p in parts), start=Counter())


# --- the helpers ---------------------------------------------------------------------------------


def test_value_readers():
    assert u.as_int(U64 + 5) == U64 + 5 and u.as_int(Decimal("12.9")) == 12 and u.as_int(-3) == -3
    assert u.as_int(Decimal("1E+999")) is u.OUT_OF_RANGE and u.as_int(float("inf")) is u.OUT_OF_RANGE
    assert u.as_int("12") is None and u.as_int(True) is None and u.as_int(None) is None
    assert u.u64(U64 - 1) == U64 - 1 and u.u64(-1) == U64 - 1  # a negative int is the same 64 bits
    assert u.u64(U64) is u.OUT_OF_RANGE and u.u64(-(1 << 63) - 1) is u.OUT_OF_RANGE and u.u64(2**80) is u.OUT_OF_RANGE
    col = u.int64_column([U63, None, 7, U64 - 1])
    assert col.to_pylist() == [-(1 << 63), None, 7, -1]
    assert col.to_numpy(zero_copy_only=False)[[0, 2, 3]].astype(np.int64).view(np.uint64).tolist() == [U63, 7, U64 - 1]


def test_time_window():
    off = 1_700_000_000_000_000_000
    w = u.TimeWindow(off)
    assert w.lo == 0 and w.hi == EPOCH_CEIL_NS - off  # raw 0 (boot) is 2023 here: all of 1990.. is possible
    assert u.TimeWindow(10**15).lo == EPOCH_FLOOR_NS - 10**15
    assert w.reason(None, 5) == "missing_value"
    assert w.reason(1, U64) == "int_out_of_range" and w.reason(u.OUT_OF_RANGE, 1) == "int_out_of_range"
    assert w.reason(-5, 10) == "bad_time" and w.reason(10**9, 10**9 - 1) == "bad_time"
    assert w.reason(10**9, 2 * 10**9) is None
    assert w.reason(U63, U63 + 1) == "time_out_of_range"  # a valid uint64, 292 years of uptime
    assert u.TimeWindow(0).reason(10**15, 10**15 + 1) == "time_out_of_range"  # 1970
    mask = w.mask(np.array([0, 10**9, U63], np.uint64), np.array([1, 2 * 10**9, U63 + 1], np.uint64))
    assert mask.tolist() == [True, True, False]


def test_u64_column_from_every_csv_type():
    col = u.U64Column(pa.chunked_array([pa.array([1, None, -2], pa.int64())]))
    assert col.bits.tolist() == [1, 0, -2] and col.valid.tolist() == [True, False, True]
    assert col.negative.tolist() == [False, False, True] and not col.over.any()
    assert col.arrow().to_pylist() == [1, None, -2]
    col = u.U64Column(pa.array([U63, U64 - 1, None], pa.uint64()))
    assert col.unsigned.tolist()[:2] == [U63, U64 - 1] and not col.negative.any()
    assert col.arrow(np.array([True, True, False])).to_pylist() == [-(1 << 63), -1]
    col = u.U64Column(pa.array([Decimal(-1), Decimal(U63), Decimal(U64 + 5), None], pa.decimal128(38, 0)))
    assert col.over.tolist() == [False, False, True, False] and col.valid.tolist() == [True, True, False, False]
    assert col.negative.tolist() == [True, False, False, False] and col.bits.tolist()[:2] == [-1, -(1 << 63)]


def test_number_guard_keeps_offsets_and_strings(monkeypatch):
    long_int = b"1" + b"0" * 5000
    doc = (
        b'{"a": '
        + long_int
        + b', "b": -'
        + long_int
        + b', "c": 1.5e99999999999999999999, "s": "x'
        + b"7" * 900
        + b'y", "keep": "2e5 and 123", "n": 17332996360099338395}'
    )
    for block in (5, 64, 1000, 1 << 20):
        monkeypatch.setattr(u.NumberGuard, "BLOCK", block)
        out = u.NumberGuard(io.BytesIO(doc)).read()
        assert len(out) == len(doc)
        parsed = json.loads(out)
        assert parsed["a"] == float("inf") and parsed["b"] == float("-inf") and parsed["c"] == float("inf")
        assert parsed["s"].startswith("x1e999 ") and parsed["s"].endswith("y")  # inside a string: text only
        assert parsed["keep"] == "2e5 and 123" and parsed["n"] == 17332996360099338395
        g = u.NumberGuard(io.BytesIO(doc))
        pieces = list(iter(lambda g=g: g.read(7), b""))  # short reads allowed, as from a raw file
        assert b"".join(pieces) == out and g.tell() == len(doc) and max(map(len, pieces)) == 7


def test_model_from_command():
    assert model_from_command(["python3", "train.py", "--x"]) == "train"
    assert model_from_command(["/usr/bin/python3.11", "-u", "-W", "ignore", "/w/llama_train.py"]) == "llama_train"
    assert model_from_command(["torchrun", "--nproc_per_node=8", "train.py"]) == "train"
    assert model_from_command(["mpirun", "-np", "8", "python", "bench.py"]) == "bench"
    assert model_from_command(["python", "-m", "pkg.finetune", "--lr", "3"]) == "finetune"
    assert model_from_command(["accelerate", "launch", "sft.py"]) == "sft"
    assert model_from_command(["/opt/app/resnet_bench", "-n", "3"]) == "resnet_bench"
    assert model_from_command("env CUDA=1 ./serve --port 8") == "serve"
    assert model_from_command(["python3", "-c", "print(1)"]) == "python3"
    assert model_from_command([]) is None and model_from_command(None) is None


# --- the parser ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[list, dict]:
    path = tmp_path_factory.mktemp("big") / "results.json"
    truth = tracegen.rocprofv3_json(path, 3_000, 120, big_ids=True, odd_values=True, seed=5)
    return parse(path), truth


def test_ids_at_or_above_2_63_join_and_map(big):
    parts, truth = big
    kernels, copies = totals(parts)
    assert skipped(parts) == Counter()
    assert kernels.num_rows == truth["kernels"] and copies.num_rows == truth["copies"]
    assert pc.sum(pc.subtract(kernels["end_ns"], kernels["start_ns"])).as_py() == truth["kernel_ns"]
    corr = kernels["correlation_id"].to_numpy().astype(np.int64).view(np.uint64)
    assert corr.tolist() == [truth["ids"]["corr"] + i for i in range(1, truth["kernels"] + 1)]
    assert Counter(kernels["device"].to_pylist()) == {"0": 1_500, "1": 1_500}  # agent handles near 2**64
    assert set(copies["device"].to_pylist()) == {"0", "1"}  # the GPU side of each copy
    assert set(kernels["launch_name"].to_pylist()) == {"hipLaunchKernel"}  # joined on uint64 ids
    assert set(copies["launch_name"].to_pylist()) == {"hipMemcpyAsync"}
    assert kernels["name"][5].as_py() == "kernel5(float*)"  # kernel ids from 2**63 + 17
    queues = kernels["queue_id"].to_numpy().astype(np.int64).view(np.uint64)
    assert set(queues.tolist()) == {truth["ids"]["queue"] + q for q in range(4)}
    assert set(kernels["tid"].to_numpy().astype(np.int64).view(np.uint64).tolist()) == {truth["ids"]["tid"]}
    assert parts[0].model == "train_llm" and parts[0].anchor_raw_ns == truth["fini_time"]
    assert all(p.model is None and p.anchor_raw_ns is None for p in parts[1:])


def write_raw(path: Path, doc: dict) -> Path:
    """``doc`` as JSON text; infinite floats become the number ``1e999`` (what a C writer can print)."""
    path.write_text(json.dumps(doc, indent=1).replace("-Infinity", "-1e999").replace("Infinity", "1e999"))
    return path


def values_case(tmp_path: Path, edit) -> tuple[list, int]:
    doc, truth = build(40, copies=0)
    proc = doc["rocprofiler-sdk-tool"][0]
    edit(proc, proc["buffer_records"]["kernel_dispatch"])
    return parse(write_raw(tmp_path / "r.json", doc), CLOCK), truth["n"]


def test_values_past_64_bits_in_needed_fields_skip_the_record(tmp_path):
    def edit(proc, recs):
        recs[0]["correlation_id"]["internal"] = U64 + 5
        recs[1]["dispatch_info"]["grid_size"]["x"] = 2**80
        recs[2]["dispatch_info"]["queue_id"]["handle"] = -(1 << 63) - 1
        recs[3]["start_timestamp"] = INF
        recs[4]["end_timestamp"] = U64
        recs[5]["start_timestamp"] = -1
        recs[6]["start_timestamp"], recs[6]["end_timestamp"] = U63, U63 + 10  # uint64, but 292 years of uptime
        recs[7]["dispatch_info"]["agent_id"]["handle"] = -1  # fits 64 bits: 2**64 - 1, an unknown agent
        recs[8]["thread_id"] = "557"  # not a number: no thread id, the record stays

    parts, n = values_case(tmp_path, edit)
    kernels, _ = totals(parts)
    assert skipped(parts) == {"int_out_of_range": 5, "bad_time": 1, "time_out_of_range": 1}
    assert kernels.num_rows == n - 7
    assert f"agent{U64 - 1}" in kernels["device"].to_pylist()


def test_anything_in_fields_nobody_reads_loses_nothing(tmp_path):
    odd = [U64 + 5, 2**80, -1, INF, -INF, "text", None, [1, {"a": 2**70}], True, 1.5]

    def edit(proc, recs):
        for k, a in enumerate(proc["agents"]):
            a["hive_id"] = odd[k % len(odd)]
            a["gpu_id"] = 2**90
        for k, s in enumerate(proc["kernel_symbols"]):
            s["code_object_id"] = odd[k % len(odd)]
            s["kernel_object"] = -INF
        proc["code_objects"] = [{"code_object_id": v, "load_base": 2**100} for v in odd]
        proc["metadata"]["unknown"] = odd
        for k, r in enumerate(recs):
            r["correlation_id"]["external"] = odd[k % len(odd)]
            r["dispatch_info"]["dispatch_id"] = odd[(k + 1) % len(odd)]
            r["dispatch_info"]["private_segment_size"] = 2**64
            r["new_field"] = {"x": odd[(k + 2) % len(odd)]}

    parts, n = values_case(tmp_path, edit)
    kernels, _ = totals(parts)
    assert kernels.num_rows == n and skipped(parts) == Counter()


def test_numbers_ijson_cannot_convert_do_not_crash(tmp_path):
    """A 5000-digit integer or a 20-digit exponent crashes ijson's C backend (a segfault): run in a child."""
    doc, truth = build(30, copies=0)
    text = json.dumps(doc, indent=1).replace(
        '"simd_count": 304', '"simd_count": 1' + "0" * 5000 + ', "w": -2e99999999999999999999'
    )
    path = tmp_path / "r.json"
    path.write_text(text)
    code = (
        "import sys; from pathlib import Path\n"
        "from tests.unit.test_rocprof_u64 import parse, totals, skipped, CLOCK\n"
        "parts = parse(Path(sys.argv[1]), CLOCK); k, _ = totals(parts)\n"
        "print(k.num_rows, dict(skipped(parts)))\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, cwd=root, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[0] == str(truth["n"]) and proc.stdout.strip().endswith("{}")
    assert ijson.backend == "yajl2_c"  # the backend the guard is for


def test_anchor_falls_back_to_the_last_host_record(tmp_path):
    doc, _ = build(20, copies=0)
    proc = doc["rocprofiler-sdk-tool"][0]
    del proc["metadata"]["fini_time"]
    proc["metadata"]["command"] = "python3 /srv/resnet50_infer.py --batch 8"
    last = max(r["end_timestamp"] for r in proc["buffer_records"]["hip_api"] + proc["buffer_records"]["marker_api"])
    parts = parse(write(tmp_path / "r.json", doc), CLOCK)
    assert parts[0].anchor_raw_ns == last and parts[0].model == "resnet50_infer"
