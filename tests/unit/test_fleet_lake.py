"""Opening a fleet lake: which files are parts, the versions table, and the errors that name the lake and the fix."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from aaco.agent.fleet.lake import FleetError, FleetLake, list_parts, store_error
from aaco.contract.schemas import SCHEMAS
from aaco.contract.stores import Store
from aaco.contract.versions import SCHEMA as VERSIONS
from aaco.contract.versions import row as versions_row
from tests.conftest import get_free_port


def write(fs: pafs.FileSystem, path: str, table: pa.Table) -> None:
    fs.create_dir(path.rsplit("/", 1)[0])
    with fs.open_output_stream(path) as out:
        pq.write_table(table, out)


def iterations(n: int) -> pa.Table:
    rows = [{"start_ns": i, "end_ns": i + 10, "node": "x", "model": "m"} for i in range(n)]
    return pa.Table.from_pylist(rows, schema=SCHEMAS["iterations"]).drop_columns(["node"])


def test_only_date_node_part_paths_are_parts():
    fs = pafs._MockFileSystem()
    store = Store("s3://bkt/lake", fs, "bkt/lake")
    good = [
        "bkt/lake/iterations/date=2025-01-01/node=a/part-000001.parquet",
        "bkt/lake/iterations/date=2025-01-02/node=b/part-3f2a-000002.parquet",
    ]
    stray = [
        "bkt/lake/iterations/date=2025-01-01/node=a/.part-000003.parquet.tmp",  # an upload in progress
        "bkt/lake/iterations/date=2025-01-01/part-000004.parquet",  # no node partition
        "bkt/lake/iterations/date=2025-01-01/node=a/deeper/part-000005.parquet",
        "bkt/lake/iterations/date=2025-01-01/node=a/part-000006.json",
        "bkt/lake/iterationsold/date=2025-01-01/node=a/part-000007.parquet",  # another kind's prefix
    ]
    for path in good + stray:
        write(fs, path, iterations(1))
    assert list_parts(store, "iterations") == sorted(good)
    assert list_parts(store, "kernels") == []


def test_a_local_lake_reads_its_parts_and_versions_with_node_from_the_path(tmp_path):
    fs = pafs.LocalFileSystem()
    write(fs, f"{tmp_path}/iterations/date=2025-01-01/node=a/part-000001.parquet", iterations(3))
    write(fs, f"{tmp_path}/iterations/date=2025-01-01/node=b/part-000001.parquet", iterations(2))
    (tmp_path / "iterations" / "date=2025-01-01" / "node=a" / "notes.txt").write_text("not a part")
    lake = FleetLake.open(f"file://{tmp_path}")
    with lake.connect() as con:
        assert con.sql("SELECT node, count(*) FROM iterations GROUP BY node ORDER BY node").fetchall() == [
            ("a", 3),
            ("b", 2),
        ]
        assert con.sql("SELECT count(*) FROM versions").fetchall() == [(0,)]
        assert con.sql("SELECT count(*) FROM kernels").fetchall() == [(0,)]
    assert lake.tables["versions"].schema.names[: len(VERSIONS) - 1] == [n for n in VERSIONS.names if n != "node"]
    rows = versions_row(5, "a", {"gpu_driver": "6.8.5"}).drop_columns(["node"])
    write(fs, f"{tmp_path}/versions/date=2025-01-01/node=a/part-000001.parquet", rows)
    with FleetLake.open(str(tmp_path)).connect(since_ns=1) as con:
        # versions are not cut by --since (a row from before the window is still in force); events are
        assert con.sql("SELECT node, ts_ns, gpu_driver FROM versions").fetchall() == [("a", 5, "6.8.5")]
        assert con.sql("SELECT count(*) FROM iterations").fetchall() == [(0,)]


def test_a_local_lake_read_by_duckdb_itself_equals_its_arrow_datasets(tmp_path):
    """Parts of older schemas (a column missing), a node named like a number, a quote in the path."""
    fs = pafs.LocalFileSystem()
    base = tmp_path / "it's"
    old = iterations(2).drop_columns(["model"])  # an agent from before the column
    write(fs, f"{base}/iterations/date=2025-01-01/node=007/part-000001.parquet", old)
    write(fs, f"{base}/iterations/date=2025-01-02/node=b/part-000001.parquet", iterations(3))
    write(fs, f"{base}/kernels/date=2025-01-02/node=b/part-000001.parquet", old.select(["start_ns", "end_ns"]))
    lake = FleetLake.open(str(base))
    assert set(lake.files) == {"iterations", "kernels"}
    arrow = FleetLake(lake.url, lake.tables)  # the same datasets through DuckDB's Arrow scan
    for kind in ("iterations", "kernels"):
        with lake.connect() as native, arrow.connect() as through_arrow:
            sql = f"SELECT * FROM {kind} ORDER BY node, start_ns"
            got = native.sql(sql).arrow().read_all()
            assert got.schema.names == through_arrow.sql(sql).arrow().read_all().schema.names
            assert got.to_pylist() == through_arrow.sql(sql).arrow().read_all().to_pylist()
    with lake.connect() as con:
        assert con.sql("SELECT node, date, model FROM iterations ORDER BY node, start_ns").fetchall() == [
            ("007", "2025-01-01", None),
            ("007", "2025-01-01", None),
            ("b", "2025-01-02", "m"),
            ("b", "2025-01-02", "m"),
            ("b", "2025-01-02", "m"),
        ]


def test_a_missing_directory_or_bucket_and_an_empty_one_are_named(tmp_path):
    with pytest.raises(FleetError, match="no such lake directory"):
        FleetLake.open(str(tmp_path / "nope"))
    with pytest.raises(FleetError, match="not a lake"):
        FleetLake.open(str(tmp_path))
    with pytest.raises(FleetError, match="is not a lake location"):
        FleetLake.open("ftp://host/lake")
    with pytest.raises(FleetError, match="no bucket in the URL"):
        FleetLake.open("s3:///lake")


@pytest.mark.parametrize(
    ("said", "means", "hint"),
    [
        (
            "When listing objects under key 'lake/kernels/' in bucket 'b': AWS Error NETWORK_CONNECTION during "
            "ListObjectsV2 operation: curlCode: 7, Could not connect to server",
            "cannot reach the store (NETWORK_CONNECTION)",
            "AWS_ENDPOINT_URL",
        ),
        (
            "When listing objects under key 'lake/kernels/' in bucket 'b': AWS Error SIGNATURE_DOES_NOT_MATCH "
            "during ListObjectsV2 operation: The request signature we calculated does not match",
            "the store refused the credentials (SIGNATURE_DOES_NOT_MATCH)",
            "AWS_SECRET_ACCESS_KEY",
        ),
        (
            "When listing objects under key 'lake/kernels/' in bucket 'b': AWS Error INVALID_ACCESS_KEY_ID during "
            "ListObjectsV2 operation: The access key ID you provided does not exist in our records.",
            "the store refused the credentials (INVALID_ACCESS_KEY_ID)",
            "AWS_ACCESS_KEY_ID",
        ),
        ("disk on fire", "cannot read the lake: disk on fire", "the store's settings"),
    ],
)
def test_store_failures_say_what_to_fix(said, means, hint):
    err = store_error("s3://b/lake", OSError(said))
    assert str(err).startswith(f"s3://b/lake: {means}") and hint in err.hint
    assert "\n" not in str(err)


def test_an_endpoint_nobody_serves_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{get_free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    with pytest.raises(FleetError, match=r"^s3://bkt/lake: cannot reach the store \(NETWORK_CONNECTION\)"):
        FleetLake.open("s3://bkt/lake")
