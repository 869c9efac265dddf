"""rocpd (SQLite, rocprofv3's default output in ROCm 7): databases built from the published schema.

``tests/support/rocpd_db.py`` writes them (its DDL follows rocprofiler-sdk's ``rocpd_tables.sql`` and
``rocpd_views.sql``), in both generations: ``direct`` (ROCm 7.0) and ``tracked``.
"""

from __future__ import annotations

import gzip
import random
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from aaco.agent.sources.traces import rocpd
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.limits import TraceLimitError, TraceLimits
from aaco.agent.sources.traces.parse import context_for, parse_any
from aaco.agent.sources.traces.u64 import OUT_OF_RANGE as OUT
from aaco.contract.clock import ClockOffset
from aaco.contract.schemas import conform
from tests.support.rocpd_db import UUID, Db

CLOCK = ClockOffset(1_700_000_000_000_000_000, 10, "test")


def build(path: Path, n: int, tracked: bool = False, seed: int = 3) -> dict:
    rng = random.Random(seed)
    db = Db(path, tracked)
    t = 9_000_000_000
    total, names = 0, {}
    for i in range(1, n + 1):
        d = rng.randint(500, 40_000)
        kernel = 1 + i % 5
        db.region("hipLaunchKernel", "HIP_RUNTIME_API", i, t - 2_000, t - 500, 1)
        db.dispatch(i, kernel, 2 if i % 3 == 0 else 3, t, t + d)  # agent rows 2, 3 = GPU 0, GPU 1
        names[f"gemm{kernel}()"] = names.get(f"gemm{kernel}()", 0) + 1
        total += d
        t += d + 100
    db.region("hipMemcpyAsync", "HIP_RUNTIME_API", n + 1, t - 1_000, t + 5_000, 1)
    db.copy(n + 1, "MEMORY_COPY_DEVICE_TO_HOST", 3, 1, t, t + 4_000, 1 << 20)
    db.region("roctxRangePushA", "MARKER_CORE_API", n + 2, 9_000_000_000, t, 1, msg="epoch 0")
    db.region("roctxMarkA", "MARKER_CORE_API", n + 3, 9_000_000_000, 9_000_000_000, 1, msg="a mark")
    db.con.commit()
    db.con.close()
    return {"n": n, "total": total, "names": names}


def parse(path: Path):
    tf = identify(path)
    assert tf.format == "rocpd"
    return list(parse_any(tf, context_for(tf, node="n", source="rocpd", clock=CLOCK)))


def kernels_of(parts) -> pa.Table:
    return pa.Table.from_batches([conform("kernels", p.kernels) for p in parts])


@pytest.mark.parametrize("tracked", [False, True], ids=["direct", "tracked"])
def test_rocpd_exact(tmp_path, monkeypatch, tracked):
    monkeypatch.setattr(rocpd, "CHUNK_ROWS", 400)
    truth = build(tmp_path / "run.db", 1_000, tracked)
    parts = parse(tmp_path / "run.db")
    assert all(p.kernels.num_rows <= 400 for p in parts)
    k = kernels_of(parts)
    kernels = k.filter(pc.equal(k["kind"], "kernel"))
    copies = k.filter(pc.equal(k["kind"], "memcpy"))
    assert kernels.num_rows == truth["n"]
    assert pc.sum(pc.subtract(kernels["end_ns"], kernels["start_ns"])).as_py() == truth["total"]
    assert {c["values"]: c["counts"] for c in pc.value_counts(kernels["name"]).to_pylist()} == truth["names"]
    assert {c["values"]: c["counts"] for c in pc.value_counts(kernels["device"]).to_pylist()} == {"0": 333, "1": 667}
    assert set(kernels["launch_name"].to_pylist()) == {"hipLaunchKernel"}
    assert pc.all(pc.equal(pc.subtract(kernels["start_ns"], kernels["launch_start_ns"]), 2_000)).as_py()
    assert set(kernels["pid"].to_pylist()) == {4242}
    assert set(kernels["tid"].to_pylist()) == {4242}  # the launching thread
    assert kernels["correlation_id"].to_pylist() == list(range(1, 1_001))
    assert kernels["start_ns"][0].as_py() == 9_000_000_000 + CLOCK.offset_ns
    assert copies["name"].to_pylist() == ["MEMORY_COPY_DEVICE_TO_HOST"]
    assert copies["device"].to_pylist() == ["1"] and copies["bytes"].to_pylist() == [1 << 20]
    assert copies["launch_name"].to_pylist() == ["hipMemcpyAsync"]
    its = parts[0].iterations
    assert its["name"].to_pylist() == ["epoch 0"] and sum(p.iterations.num_rows for p in parts) == 1
    assert parts[0].devices["1"]["product_name"] == "AMD Instinct MI300X"
    assert parts[0].pids == (4242,)


def test_rocpd_gzip(tmp_path):
    truth = build(tmp_path / "run.db", 50)
    (tmp_path / "run.db.gz").write_bytes(gzip.compress((tmp_path / "run.db").read_bytes()))
    (tmp_path / "run.db").unlink()
    k = kernels_of(parse(tmp_path / "run.db.gz"))
    assert k.filter(pc.equal(k["kind"], "kernel")).num_rows == truth["n"]


def test_rocpd_bad_rows_counted(tmp_path):
    build(tmp_path / "run.db", 20)
    con = sqlite3.connect(tmp_path / "run.db")
    con.execute(f'UPDATE rocpd_kernel_dispatch{UUID} SET "end" = start - 1 WHERE id = 3')
    con.execute(f"UPDATE rocpd_kernel_dispatch{UUID} SET start = 'junk' WHERE id = 4")
    con.commit()
    con.close()
    parts = parse(tmp_path / "run.db")
    k = kernels_of(parts)
    assert k.filter(pc.equal(k["kind"], "kernel")).num_rows == 18
    skipped = sum((p.skipped for p in parts), start=type(parts[0].skipped)())
    assert skipped == {"bad_time": 1, "missing_value": 1}


def test_sqlite_without_rocpd_tables_is_not_rocpd(tmp_path):
    con = sqlite3.connect(tmp_path / "other.db")
    con.execute("CREATE TABLE t (x)")
    con.commit()
    con.close()
    from aaco.agent.sources.traces.detect import sniff
    from aaco.agent.sources.traces.files import read_head

    assert sniff(read_head(tmp_path / "other.db")) is None


# --- every number in full (u64) -----------------------------------------------------------------

U63 = 1 << 63


def test_rocpd_ids_at_or_above_2_63_as_sqlite_stores_them(tmp_path):
    """Bound as the int64 of the same bits, or written as a literal past int64 (SQLite keeps a REAL)."""
    truth = build(tmp_path / "run.db", 200)
    con = sqlite3.connect(tmp_path / "run.db")
    con.execute(f"UPDATE rocpd_event{UUID} SET correlation_id = correlation_id + (-9223372036854775807 - 1)")
    con.execute(
        f"UPDATE rocpd_event{UUID} SET correlation_id = 17332996360099338395 WHERE correlation_id = ?", (7 - U63,)
    )
    con.execute(f"UPDATE rocpd_kernel_dispatch{UUID} SET queue_id = -1, stream_id = ? WHERE id <= 100", (-U63,))
    con.commit()
    assert con.execute(f"SELECT typeof(correlation_id) FROM rocpd_event{UUID} WHERE id = 13").fetchone() == ("real",)
    con.close()
    parts = parse(tmp_path / "run.db")
    k = kernels_of(parts)
    kernels = k.filter(pc.equal(k["kind"], "kernel"))
    assert kernels.num_rows == truth["n"] and sum((p.skipped for p in parts), start=type(parts[0].skipped)()) == {}
    corr = kernels["correlation_id"].to_numpy().astype("int64").view("uint64").tolist()
    assert corr[:6] == [U63 + i for i in range(1, 7)] and corr[6] == int(17332996360099338395.0)
    assert kernels["launch_name"].null_count == 0  # every dispatch joined its launch on the uint64 id
    assert set(kernels["queue_id"].to_pylist()[:100]) == {-1} and set(kernels["stream"].to_pylist()[:100]) == {-U63}


def test_rocpd_values_past_64_bits_and_times_out_of_range(tmp_path):
    build(tmp_path / "run.db", 30)
    con = sqlite3.connect(tmp_path / "run.db")
    con.execute(f"UPDATE rocpd_kernel_dispatch{UUID} SET queue_id = 1e30 WHERE id = 2")
    con.execute(f"UPDATE rocpd_kernel_dispatch{UUID} SET grid_size_x = 18446744073709551621 WHERE id = 3")
    con.execute(
        f'UPDATE rocpd_kernel_dispatch{UUID} SET start = 3000000000000000000, "end" = 3000000000000000009 WHERE id = 4'
    )  # converts to 2118
    con.execute(f"UPDATE rocpd_kernel_dispatch{UUID} SET start = 9223372036854775807 WHERE id = 5")
    con.execute(f"UPDATE rocpd_kernel_dispatch{UUID} SET private_segment_size = 1e300, dispatch_id = -1 WHERE id = 6")
    con.commit()
    con.close()
    parts = parse(tmp_path / "run.db")
    k = kernels_of(parts)
    assert k.filter(pc.equal(k["kind"], "kernel")).num_rows == 30 - 4  # row 6: columns nobody reads
    skipped = sum((p.skipped for p in parts), start=type(parts[0].skipped)())
    assert skipped == {"int_out_of_range": 2, "time_out_of_range": 1, "bad_time": 1}


def test_rocpd_model_and_anchor_from_the_process_table(tmp_path):
    build(tmp_path / "run.db", 10)
    con = sqlite3.connect(tmp_path / "run.db")
    con.execute(f"UPDATE rocpd_info_process{UUID} SET command = 'python3 /w/bert_train.py --epochs 3', fini = 12345")
    con.commit()
    con.close()
    parts = parse(tmp_path / "run.db")
    assert parts[0].model == "bert_train" and parts[0].anchor_raw_ns == 12345
    assert all(p.model is None and p.anchor_raw_ns is None for p in parts[1:])


def test_rocpd_sqlite_values():
    from aaco.agent.sources.traces.rocpd_rows import sql_int, sql_u64

    assert sql_u64(-1) == (1 << 64) - 1 and sql_u64(" 18446744073709551615 ") == (1 << 64) - 1
    assert sql_u64("18446744073709551616") is OUT and sql_u64(1e30) is OUT and sql_u64(float("nan")) is None
    assert sql_int("junk") is None and sql_int(b"\x01") is None and sql_int(12.7) == 12


def test_rocpd_read_within_the_files_limits(tmp_path):
    truth = build(tmp_path / "run.db", 300)
    raw = (tmp_path / "run.db").read_bytes()
    gz = tmp_path / "run.db.gz"
    gz.write_bytes(gzip.compress(raw))
    tf = identify(gz)
    ctx = context_for(tf, node="n", source="rocpd", clock=CLOCK)
    k = kernels_of(list(rocpd.parse_rocpd(gz, ctx, limits=TraceLimits(max_file_bytes=len(raw)))))
    assert k.filter(pc.equal(k["kind"], "kernel")).num_rows == truth["n"]
    with pytest.raises(TraceLimitError) as exc:
        list(rocpd.parse_rocpd(gz, ctx, limits=TraceLimits(max_file_bytes=len(raw) - 1)))
    assert exc.value.limit == "max_file_bytes"
    ratio = len(raw) // len(gz.read_bytes())
    with pytest.raises(TraceLimitError) as exc:
        list(rocpd.parse_rocpd(gz, ctx, limits=TraceLimits(max_gzip_ratio=ratio - 1, gzip_grace_bytes=1)))
    assert exc.value.limit == "max_gzip_ratio"
    with pytest.raises(TraceLimitError):  # uncompressed: the size on disk, before SQLite opens it
        list(rocpd.parse_rocpd(tmp_path / "run.db", ctx, max_bytes=len(raw) - 1))
