"""Shipping sealed lake parts to a store: each part exactly once, in order, bounded, counted.

The store here is a local directory through pyarrow's LocalFileSystem (the same calls as S3);
tests/integration/test_lake_s3.py runs the agent against a real S3 store.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pytest

from aaco.contract.schemas import SCHEMAS, EventBatch, conform
from aaco.contract.stats import EVENTS_DROPPED, Stats
from aaco.contract.stores import open_store
from aaco.exporters.lake import LakeConfig, LakeExporter
from aaco.exporters.lake_ship import (
    BACKLOG_PARTS,
    DROPPED_PARTS,
    REMOVED_PARTS,
    UPLOAD_FAILURES,
    UPLOADED_PARTS,
    Shipper,
    UploadSettings,
)

DAY_NS = 86_400 * 10**9
T0 = 1_790_000_000 * 10**9


def kernels(start: int, n: int, node: str = "n1") -> EventBatch:
    starts = [T0 + start + i * 1000 for i in range(n)]
    return EventBatch(
        "kernels",
        conform(
            "kernels",
            {
                "start_ns": starts,
                "end_ns": [s + 500 for s in starts],
                "node": [node] * n,
                "pid": [1] * n,
                "tid": [1] * n,
                "device": ["0"] * n,
                "stream": [0] * n,
                "name": [f"k{start + i}" for i in range(n)],
                "kind": ["kernel"] * n,
                "correlation_id": list(range(start, start + n)),
                "source": ["test"] * n,
            },
        ),
        "test",
    )


def lake(tmp_path: Path, stats: Stats, **upload: object) -> LakeExporter:
    config = LakeConfig(path=tmp_path / "local", remote=f"file://{tmp_path / 'store'}", upload=UploadSettings(**upload))
    return LakeExporter(config, stats, node="n1", versions={"gpu_driver": "amdgpu 6.8", "os_kernel": "6.1"})


def remote_rows(tmp_path: Path, kind: str = "kernels") -> pa.Table:
    return ds.dataset(tmp_path / "store" / kind, format="parquet", partitioning="hive").to_table()


def remote_parts(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "store").rglob("part-*.parquet"))


def test_each_sealed_part_ships_once_under_a_deterministic_key(tmp_path):
    stats = Stats()
    lx = lake(tmp_path, stats)
    lx.start()
    for i in range(3):
        lx.export(kernels(i * 10, 10))
        assert lx.force_flush(10.0)
    lx.shutdown(10.0)
    got = remote_rows(tmp_path)
    assert got.num_rows == 30 and len(set(got["correlation_id"].to_pylist())) == 30
    lake_id = (tmp_path / "local" / "checkpoints" / "lake-id").read_text()
    names = [p.name for p in remote_parts(tmp_path) if "kernels" in p.parts]
    assert names == [f"part-{lake_id}-{i:06d}.parquet" for i in range(3)]
    assert stats.get(UPLOADED_PARTS) == 4  # three kernel parts and the versions row
    assert stats.get(BACKLOG_PARTS) == 0
    versions = remote_rows(tmp_path, "versions")
    assert versions["gpu_driver"].to_pylist() == ["amdgpu 6.8"] and versions["node"].to_pylist() == ["n1"]


def test_a_crash_between_upload_and_mark_ships_the_part_again_to_the_same_key(tmp_path):
    stats = Stats()
    lx = lake(tmp_path, stats)
    lx.start()
    lx.export(kernels(0, 10))
    assert lx.force_flush(10.0)
    lx.shutdown(5.0)
    shipped = tmp_path / "local" / "checkpoints" / "shipped.json"
    shipped.unlink()  # as if killed after the uploads, before the marks were written
    again = lake(tmp_path, Stats())
    again.start()
    again.shutdown(10.0)
    assert remote_rows(tmp_path).num_rows == 10  # the same keys were written again: no row twice
    assert len([p for p in remote_parts(tmp_path) if "kernels" in p.parts]) == 1


def test_the_versions_row_is_written_again_only_when_something_changed(tmp_path):
    for _ in range(2):
        lx = lake(tmp_path, Stats())
        lx.start()
        lx.shutdown(5.0)
    assert remote_rows(tmp_path, "versions").num_rows == 1
    config = LakeConfig(path=tmp_path / "local", remote=f"file://{tmp_path / 'store'}")
    upgraded = LakeExporter(config, Stats(), node="n1", versions={"gpu_driver": "amdgpu 6.10"})
    upgraded.start()
    upgraded.shutdown(5.0)
    assert sorted(remote_rows(tmp_path, "versions")["gpu_driver"].to_pylist()) == ["amdgpu 6.10", "amdgpu 6.8"]


class _Handler(pafs.FileSystemHandler):
    """A local store whose writes fail while ``down`` is set (a store that is unreachable)."""

    def __init__(self, root: Path) -> None:
        self.local = pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem())
        self.down = False
        self.refuse: set[str] = set()  # names whose writes fail
        self.writes = 0

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __hash__(self) -> int:
        return id(self)

    def get_type_name(self) -> str:
        return "flaky"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths):  # type: ignore[no-untyped-def]
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):  # type: ignore[no-untyped-def]
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):  # type: ignore[no-untyped-def]
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):  # type: ignore[no-untyped-def]
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):  # type: ignore[no-untyped-def]
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):  # type: ignore[no-untyped-def]
        self.local.delete_dir_contents("", accept_root_dir=True)

    def delete_file(self, path):  # type: ignore[no-untyped-def]
        self.local.delete_file(path)

    def move(self, src, dest):  # type: ignore[no-untyped-def]
        self.local.move(src, dest)

    def copy_file(self, src, dest):  # type: ignore[no-untyped-def]
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):  # type: ignore[no-untyped-def]
        return self.local.open_input_stream(path)

    def open_input_file(self, path):  # type: ignore[no-untyped-def]
        return self.local.open_input_file(path)

    def open_output_stream(self, path, metadata):  # type: ignore[no-untyped-def]
        if self.down or path.rsplit("/", 1)[-1] in self.refuse:
            raise OSError("connection refused (the store is down)")
        self.writes += 1
        parent = path.rsplit("/", 1)[0]
        self.local.create_dir(parent, recursive=True)
        return self.local.open_output_stream(path)

    def open_append_stream(self, path, metadata):  # type: ignore[no-untyped-def]
        raise OSError("no appends")


def flaky_shipper(tmp_path: Path, stats: Stats, **settings: object) -> tuple[Shipper, _Handler]:
    from aaco.contract.stores import Store

    (tmp_path / "store").mkdir(exist_ok=True)
    handler = _Handler(tmp_path / "store")
    store = Store("flaky://store", pafs.PyFileSystem(handler), "")
    root = tmp_path / "local"
    (root / "checkpoints").mkdir(parents=True, exist_ok=True)
    base = {"retry_initial_s": 0.01, "retry_max_s": 0.05, "interval_s": 0.05}
    return Shipper(root, store, UploadSettings(**{**base, **settings}), stats, tuple(SCHEMAS)), handler


def write_part(root: Path, seq: int, size: int = 1000, node: str = "n1") -> Path:
    d = root / "kernels" / "date=2026-11-27" / f"node={node}"
    d.mkdir(parents=True, exist_ok=True)
    p = d / f"part-{seq:06d}.parquet"
    p.write_bytes(os.urandom(size))
    return p


def test_a_store_that_is_down_is_retried_with_backoff_and_nothing_is_lost_or_repeated(tmp_path):
    stats = Stats()
    shipper, handler = flaky_shipper(tmp_path, stats)
    shipper.load()
    for seq in range(3):
        write_part(tmp_path / "local", seq)
    handler.down = True
    assert not shipper.ship_once()
    assert not shipper.ship_once()
    assert stats.get(UPLOAD_FAILURES) == 6 and stats.get(BACKLOG_PARTS) == 3  # three parts failed, twice
    assert 0.005 <= shipper.backoff_s() <= 0.02  # the second failure: twice the first wait, jittered
    handler.down = False
    assert shipper.drain(5.0)
    assert handler.writes == 3 and stats.get(UPLOADED_PARTS) == 3 and stats.get(BACKLOG_PARTS) == 0
    assert shipper.ship_once() and handler.writes == 3  # nothing ships twice
    assert shipper.backoff_s() == shipper.settings.interval_s


def test_a_part_that_failed_holds_its_directory_mark_while_other_directories_move_on(tmp_path):
    stats = Stats()
    shipper, handler = flaky_shipper(tmp_path, stats, workers=4)
    shipper.load()
    for seq in range(4):
        write_part(tmp_path / "local", seq, node="n1")
        write_part(tmp_path / "local", seq, node="n2")
    n1 = tmp_path / "local" / "kernels" / "date=2026-11-27" / "node=n1"
    handler.refuse = {f"part-{shipper.lake_id}-000001.parquet"}  # the second part of each directory fails
    assert not shipper.ship_once()
    assert shipper.mark(n1) == 0  # parts 2 and 3 of n1 may have uploaded: the mark stays before the failure
    handler.refuse = set()
    assert shipper.drain(5.0)
    assert shipper.mark(n1) == 3 and shipper.mark(n1.parent / "node=n2") == 3
    assert len(list((tmp_path / "store").rglob("part-*.parquet"))) == 8  # re-uploads replaced, never added


def test_drain_gives_up_at_its_deadline_and_keeps_the_backlog(tmp_path):
    stats = Stats()
    shipper, handler = flaky_shipper(tmp_path, stats)
    shipper.load()
    write_part(tmp_path / "local", 0)
    handler.down = True
    started = time.monotonic()
    assert not shipper.drain(0.3)
    assert time.monotonic() - started < 5
    assert (tmp_path / "local" / "kernels" / "date=2026-11-27" / "node=n1" / "part-000000.parquet").exists()
    assert stats.get(UPLOAD_FAILURES) >= 2


def test_a_full_backlog_drops_the_oldest_parts_counted(tmp_path):
    stats = Stats()
    shipper, handler = flaky_shipper(tmp_path, stats, max_backlog_mib=1)
    shipper.load()
    paths = []
    for seq in range(4):
        paths.append(write_part(tmp_path / "local", seq, size=400_000))
        os.utime(paths[-1], (1000 + seq, 1000 + seq))
    handler.down = True
    shipper.ship_once()
    assert stats.get(DROPPED_PARTS) == 2
    assert [p.exists() for p in paths] == [False, False, True, True]
    assert stats.get(EVENTS_DROPPED, component="exporter:lake_upload", reason="backlog_full") == 0  # not Parquet
    assert shipper.mark(paths[0].parent) == 1  # the dropped sequence numbers are never used again
    handler.down = False
    assert shipper.drain(5.0) and handler.writes == 2


def test_retention_removes_only_shipped_parts_and_the_lake_never_reuses_their_numbers(tmp_path):
    stats = Stats()
    lx = lake(tmp_path, stats, retention_h=0)
    lx.start()
    lx.export(kernels(0, 5))
    assert lx.force_flush(10.0)
    local = tmp_path / "local" / "kernels"
    assert lx.shipper is not None
    lx.shipper.ship_once()  # retention runs after a pass: the shipped part is gone locally
    assert list(local.rglob("part-*.parquet")) == []
    assert stats.get(REMOVED_PARTS) >= 1
    lx.export(kernels(100, 5))
    assert lx.force_flush(10.0)
    lx.shutdown(5.0)
    again = lake(tmp_path, Stats(), retention_h=0)
    again.start()
    again.export(kernels(200, 5))
    again.shutdown(10.0)
    got = remote_rows(tmp_path)
    assert got.num_rows == 15 and len(set(got["correlation_id"].to_pylist())) == 15
    lake_id = (tmp_path / "local" / "checkpoints" / "lake-id").read_text()
    assert [p.name for p in remote_parts(tmp_path) if "kernels" in p.parts] == [
        f"part-{lake_id}-{i:06d}.parquet" for i in range(3)
    ]


def test_the_store_url_decides_the_filesystem(tmp_path):
    assert not open_store(str(tmp_path)).remote
    assert open_store(f"file://{tmp_path}").base == str(tmp_path)
    s3 = open_store("s3://bucket/a/b/", env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_REGION": "eu-west-1"})
    assert s3.remote and s3.base == "bucket/a/b" and s3.key("kernels/x.parquet") == "bucket/a/b/kernels/x.parquet"
    assert s3.fs.region == "eu-west-1"


@pytest.mark.parametrize("url", ["ftp://x/y", "s3://"])
def test_a_url_of_no_store_is_refused(url):
    from aaco.contract.stores import StoreError

    with pytest.raises(StoreError):
        open_store(url)
