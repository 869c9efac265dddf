"""The Parquet lake: hive partitions, flush triggers, sequence numbers, analysis.json, failures."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from aaco.analyzers.latency import LatencyAnalyzer
from aaco.contract.schemas import SCHEMAS, EventBatch, conform
from aaco.contract.snapshot import AnalysisSnapshot
from aaco.contract.stats import EVENTS_EMITTED, EVENTS_RECEIVED, EXPORT_ERRORS, Stats
from aaco.exporters.base import ExportResult
from aaco.exporters.lake import LakeConfig, LakeExporter, write_json_atomic

from .builders import NODE, item, iterations, kernels

DAY1 = 1_700_000_000_000_000_000  # 2023-11-14T22:13:20Z
DAY2 = DAY1 + 2 * 86_400 * 10**9  # 2023-11-16
DATE1, DATE2 = "2023-11-14", "2023-11-16"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def stats():
    return Stats()


def make(tmp_path: Path, stats: Stats, clock=None, **cfg) -> LakeExporter:
    config = LakeConfig(path=tmp_path / "lake", **cfg)
    lx = LakeExporter(config, stats, clock=clock or FakeClock())
    lx.start()
    return lx


def parts(root: Path, kind: str = "kernels") -> list[Path]:
    return sorted((root / kind).rglob("part-*.parquet"))


def kb(starts, **cols) -> EventBatch:
    return item("kernels", kernels(starts, **cols))


def test_start_creates_layout(tmp_path, stats):
    lx = make(tmp_path, stats)
    for sub in (*SCHEMAS, "checkpoints"):
        assert (lx.root / sub).is_dir()


def test_write_hive_partitions_readable_by_pyarrow_dataset(tmp_path, stats):
    lx = make(tmp_path, stats)
    assert lx.export(kb([DAY1, DAY1 + 10, DAY1 + 20], name=["a", "b", "c"])) is ExportResult.SUCCESS
    assert parts(lx.root) == []  # buffered
    assert lx.force_flush()
    (p,) = parts(lx.root)
    assert p.relative_to(lx.root).as_posix() == f"kernels/date={DATE1}/node={NODE}/part-000000.parquet"
    # date and node live only in the hive path, not inside the part
    full = SCHEMAS["kernels"]
    assert pq.read_schema(p) == full.remove(full.get_field_index("node"))
    t = ds.dataset(lx.root / "kernels", partitioning="hive").to_table()
    assert t.num_rows == 3
    assert sorted(t.column("name").to_pylist()) == ["a", "b", "c"]
    assert set(t.column("date").to_pylist()) == {DATE1}
    assert set(t.column("node").to_pylist()) == {NODE}
    assert stats.get(EVENTS_RECEIVED, component="exporter:lake") == 3
    assert stats.get(EVENTS_EMITTED, component="exporter:lake") == 3


def test_rows_across_two_dates_and_nodes_go_to_separate_partitions(tmp_path, stats):
    lx = make(tmp_path, stats)
    lx.export(kb([DAY1, DAY2, DAY1, DAY2], name=["a", "b", "c", "d"], node=[NODE, NODE, NODE, "node-b"]))
    lx.force_flush()
    rel = sorted(p.parent.relative_to(lx.root).as_posix() for p in parts(lx.root))
    assert rel == [
        f"kernels/date={DATE1}/node={NODE}",
        f"kernels/date={DATE2}/node={NODE}",
        f"kernels/date={DATE2}/node=node-b",
    ]
    d1 = pq.read_table(lx.root / "kernels" / f"date={DATE1}" / f"node={NODE}")
    assert sorted(d1.column("name").to_pylist()) == ["a", "c"]
    t = ds.dataset(lx.root / "kernels", partitioning="hive").to_table()
    assert t.num_rows == 4
    by_name = {r["name"]: (r["date"], r["node"]) for r in t.to_pylist()}
    assert by_name == {"a": (DATE1, NODE), "b": (DATE2, NODE), "c": (DATE1, NODE), "d": (DATE2, "node-b")}


def test_each_kind_uses_its_time_column(tmp_path, stats):
    lx = make(tmp_path, stats)
    lx.export(item("iterations", iterations([(DAY2, DAY2 + 5)])))
    tel = conform(
        "telemetry",
        {
            "ts_ns": pa.array([DAY1], pa.int64()),
            "node": [NODE],
            "device": ["0"],
            "metric": ["hw.power"],
            "value": pa.array([250.0]),
            "unit": ["W"],
        },
    )
    lx.export(item("telemetry", tel))
    lx.force_flush()
    assert [p.parent.parent.name for p in parts(lx.root, "iterations")] == [f"date={DATE2}"]
    assert [p.parent.parent.name for p in parts(lx.root, "telemetry")] == [f"date={DATE1}"]
    t = ds.dataset(lx.root / "telemetry", partitioning="hive").to_table()
    assert t.column("value").to_pylist() == [250.0]


def test_flush_rows_triggers_a_write(tmp_path, stats):
    lx = make(tmp_path, stats, flush_rows=5)
    lx.export(kb([DAY1] * 3))
    assert parts(lx.root) == []
    lx.export(kb([DAY1] * 2))
    (p,) = parts(lx.root)
    assert pq.read_table(p).num_rows == 5
    # another partition's buffer is not written with it
    lx.export(kb([DAY2]))
    assert len(parts(lx.root)) == 1


def test_flush_interval_triggers_on_export_and_tick(tmp_path, stats, clock):
    lx = make(tmp_path, stats, clock=clock, flush_interval_s=10)
    lx.export(kb([DAY1]))
    lx.tick()
    assert parts(lx.root) == []
    clock.now += 9.9
    lx.tick()
    assert parts(lx.root) == []
    clock.now += 0.1
    lx.tick()
    assert len(parts(lx.root)) == 1
    # an export after the interval writes every buffer, its own included
    lx.export(kb([DAY2]))
    assert len(parts(lx.root)) == 1
    clock.now += 10
    lx.export(kb([DAY1]))
    assert len(parts(lx.root)) == 3


def test_sequence_numbers_continue(tmp_path, stats):
    lx = make(tmp_path, stats)
    for _ in range(3):
        lx.export(kb([DAY1]))
        lx.force_flush()
    assert [p.name for p in parts(lx.root)] == ["part-000000.parquet", "part-000001.parquet", "part-000002.parquet"]
    lx.shutdown()
    # a restart (a new exporter on the same directory) continues after the existing parts
    lx2 = make(tmp_path, Stats())
    lx2.export(kb([DAY1]))
    lx2.force_flush()
    assert [p.name for p in parts(lx2.root)][-1] == "part-000003.parquet"
    t = ds.dataset(lx2.root / "kernels", partitioning="hive").to_table()
    assert t.num_rows == 4


def test_existing_name_is_never_overwritten(tmp_path, stats):
    lx = make(tmp_path, stats)
    lx.export(kb([DAY1]))
    lx.force_flush()
    # a second writer creates the next name behind this exporter's back
    d = parts(lx.root)[0].parent
    shutil.copy(d / "part-000000.parquet", d / "part-000001.parquet")
    lx.export(kb([DAY1, DAY1]))
    lx.force_flush()
    assert sorted(p.name for p in d.iterdir()) == ["part-000000.parquet", "part-000001.parquet", "part-000002.parquet"]
    assert pq.read_table(d / "part-000002.parquet").num_rows == 2
    assert pq.read_table(d / "part-000001.parquet").num_rows == 1


def test_no_temporary_files_left(tmp_path, stats):
    lx = make(tmp_path, stats)
    lx.export(kb([DAY1]))
    lx.force_flush()
    assert [p.name for p in lx.root.rglob(".*")] == [".lock"]  # the lake's lock, not a temporary file


def test_unsafe_node_names_are_uri_encoded_in_paths(tmp_path, stats):
    lx = make(tmp_path, stats)
    lx.export(kb([DAY1], node=["../evil/node"]))
    lx.force_flush()
    (p,) = parts(lx.root)
    assert p.parent.name == "node=..%2Fevil%2Fnode"  # no path separator can escape the partition
    assert p.is_relative_to(lx.root / "kernels")
    t = ds.dataset(lx.root / "kernels", partitioning="hive").to_table()
    assert t.column("node").to_pylist() == ["../evil/node"]


def test_node_with_unsafe_characters_reads_back_unchanged(tmp_path, stats):
    lx = make(tmp_path, stats)
    lx.export(kb([DAY1], node=["rack/7"]))
    lx.force_flush()
    t = ds.dataset(lx.root / "kernels", partitioning="hive").to_table()
    assert t.column("node").to_pylist() == ["rack/7"]


def test_numeric_node_name_lake_is_readable(tmp_path, stats):
    # pyarrow's hive inference types an all-digit key as an integer; what matters is that the lake
    # reads (a node column inside the files would clash with it) and the value is the node's.
    lx = make(tmp_path, stats)
    lx.export(kb([DAY1], node=["7"]))
    lx.force_flush()
    t = ds.dataset(lx.root / "kernels", partitioning="hive").to_table()
    assert [str(v) for v in t.column("node").to_pylist()] == ["7"]


def test_unwritable_directory_counts_error_and_keeps_rows(tmp_path, stats):
    lx = make(tmp_path, stats)
    # a file where the kind's directory belongs: no partition can be created under it
    shutil.rmtree(lx.root / "kernels")
    (lx.root / "kernels").write_text("in the way")
    assert lx.export(kb([DAY1, DAY1])) is ExportResult.SUCCESS  # only buffered so far
    assert lx.force_flush() is False
    assert stats.get(EXPORT_ERRORS, exporter="lake") == 1
    assert stats.get(EVENTS_EMITTED, component="exporter:lake") == 0
    lx.export(kb([DAY1]))
    assert lx.force_flush() is False
    assert stats.get(EXPORT_ERRORS, exporter="lake") == 2
    # once the directory can be written, nothing was lost
    (lx.root / "kernels").unlink()
    assert lx.force_flush() is True
    t = ds.dataset(lx.root / "kernels", partitioning="hive").to_table()
    assert t.num_rows == 3
    assert stats.get(EVENTS_EMITTED, component="exporter:lake") == 3


def test_unwritable_directory_on_export_returns_failure(tmp_path, stats):
    lx = make(tmp_path, stats, flush_rows=1)
    shutil.rmtree(lx.root / "kernels")
    (lx.root / "kernels").write_text("in the way")
    assert lx.export(kb([DAY1])) is ExportResult.FAILURE
    assert stats.get(EXPORT_ERRORS, exporter="lake") == 1


def snapshot() -> AnalysisSnapshot:
    a = LatencyAnalyzer()
    a.update(item("iterations", iterations([(0, 2_000_000)], model="resnet")))
    return AnalysisSnapshot(ts_ns=123, node=NODE, results={"latency": a.snapshot()})


def test_export_snapshot_writes_analysis_json(tmp_path, stats):
    records = [{"source": "replay", "subject": "x.json"}]
    lx = LakeExporter(LakeConfig(path=tmp_path / "lake"), stats, records=lambda: records)
    assert lx.export_snapshot(snapshot()) is ExportResult.FAILURE  # not started
    lx.start()
    assert lx.export_snapshot(snapshot()) is ExportResult.SUCCESS
    doc = json.loads((lx.root / "analysis.json").read_text())
    assert doc["generated_at_ns"] == 123
    assert doc["node"] == NODE
    assert doc["latency"]["models"]["resnet"]["mean_s"] == pytest.approx(0.002)
    assert json.loads((lx.root / "sources.json").read_text()) == {"sources": records}
    # replaced atomically: no temporary file is left beside it
    assert sorted(p.name for p in lx.root.iterdir() if p.is_file()) == [".lock", "analysis.json", "sources.json"]


def test_export_snapshot_failure_counts_error(tmp_path, stats):
    lx = make(tmp_path, stats)
    (lx.root / "analysis.json").mkdir()  # os.replace cannot put a file over a directory
    assert lx.export_snapshot(snapshot()) is ExportResult.FAILURE
    assert stats.get(EXPORT_ERRORS, exporter="lake") == 1


def test_write_json_atomic_replaces(tmp_path):
    p = tmp_path / "doc.json"
    write_json_atomic(p, {"a": 1})
    write_json_atomic(p, {"a": 2, "path": Path("/x")})
    assert json.loads(p.read_text()) == {"a": 2, "path": "/x"}
    assert [x.name for x in tmp_path.iterdir()] == ["doc.json"]


def test_json_documents_are_indented_json_with_numpy_numbers_and_no_nan(tmp_path):
    import numpy as np

    p = tmp_path / "doc.json"
    write_json_atomic(p, {"n": np.int64(3), "x": np.float32(0.5), "bad": float("nan"), 7: "key", "at": Path("/x")})
    text = p.read_text()
    assert text.endswith("}\n") and '\n  "n": 3' in text
    assert json.loads(text) == {"n": 3, "x": 0.5, "bad": None, "7": "key", "at": "/x"}
    write_json_atomic(p, {"big": 2**70})  # beyond orjson: the standard library writes it
    assert json.loads(p.read_text()) == {"big": 2**70}


def test_sources_json_is_written_when_it_changes(tmp_path, stats):
    records = [{"source": "replay", "subject": "x.json"}]
    lx = LakeExporter(LakeConfig(path=tmp_path / "lake"), stats, records=lambda: records)
    lx.start()
    lx.export_snapshot(snapshot())
    sources = lx.root / "sources.json"
    sources.write_text("{}")  # stands for the file as written: not written again while the records stay
    lx.export_snapshot(snapshot())
    assert sources.read_text() == "{}"
    records.append({"source": "smi", "subject": "sysfs"})
    lx.export_snapshot(snapshot())
    assert json.loads(sources.read_text()) == {"sources": records}


def test_shutdown_flushes_and_is_idempotent(tmp_path, stats):
    lx = make(tmp_path, stats)
    lx.export(kb([DAY1]))
    lx.shutdown()
    assert len(parts(lx.root)) == 1
    lx.shutdown()
    assert len(parts(lx.root)) == 1
    assert lx.export(kb([DAY1])) is ExportResult.FAILURE


def test_shutdown_before_start_is_safe(tmp_path, stats):
    lx = LakeExporter(LakeConfig(path=tmp_path / "lake"), stats)
    lx.shutdown()
    lx.shutdown()
    assert not (tmp_path / "lake").exists()
    assert lx.export(kb([DAY1])) is ExportResult.FAILURE


def test_empty_batch_is_success_and_writes_nothing(tmp_path, stats):
    lx = make(tmp_path, stats)
    assert lx.export(kb([])) is ExportResult.SUCCESS
    assert lx.force_flush() is True
    assert parts(lx.root) == []


def test_times_and_ids_are_delta_packed_names_dictionary_coded(tmp_path, stats):
    lx = make(tmp_path, stats)
    starts = [DAY1 + 997 * i * i for i in range(5000)]  # distinct, increasing, uneven gaps
    names = [f"kernel_{i % 7}" for i in range(5000)]
    corr = [2**63 - 2_500 + i for i in range(5000)]
    batch = kernels(starts, name=names, correlation_id=[c - 2**64 if c >= 2**63 else c for c in corr])
    lx.export(item("kernels", batch))
    assert lx.force_flush()
    (p,) = parts(lx.root)
    meta = pq.ParquetFile(p).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    for col in ("start_ns", "end_ns", "correlation_id", "launch_start_ns"):
        assert "DELTA_BINARY_PACKED" in encodings[col] and "RLE_DICTIONARY" not in encodings[col], col
    for col in ("name", "device", "source", "pid"):
        assert "RLE_DICTIONARY" in encodings[col], col
    back = pq.read_table(p)
    assert back["start_ns"].to_pylist() == starts and back["name"].to_pylist() == names
    assert back["correlation_id"].to_numpy().view("uint64").tolist() == corr


@pytest.mark.parametrize("url", ["http://x/y", "ftp://host/lake", Path("hdfs://nn/lake"), "s3://", "s3:///prefix"])
def test_a_url_no_store_reaches_is_an_error_not_a_directory(url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"is not a lake location|no bucket in the URL"):
        LakeConfig(path=url)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("url", "remote"),
    [
        ("s3://bucket/lake", "s3://bucket/lake"),
        (Path("s3://bucket/lake"), "s3://bucket/lake"),  # a URL that went through a Path keeps one slash
        ("gs://b/p", "gs://b/p"),
        ("abfs://c@acct.dfs.core.windows.net/p", "abfs://c@acct.dfs.core.windows.net/p"),
    ],
)
def test_an_object_store_path_is_the_remote_with_a_local_copy(url, remote):
    config = LakeConfig(path=url)
    assert config.remote == remote and config.path == Path("aaco-data")
    both = LakeConfig(path="/var/lib/aaco", remote=url)
    assert both.remote == remote and both.path == Path("/var/lib/aaco")
    with pytest.raises(ValueError, match="give the URL once"):
        LakeConfig(path=url, remote="s3://other/lake")


def test_a_file_url_is_its_local_path(tmp_path):
    assert LakeConfig(path=f"file://{tmp_path}/a%20lake").path == tmp_path / "a lake"
    assert LakeConfig(path=Path(f"file://{tmp_path}")).path == tmp_path
    assert LakeConfig(path="aaco-data").path == Path("aaco-data")
