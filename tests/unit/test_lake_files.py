"""The lake's and the quarantine's files are 0640 or tighter, their directories 0750, whatever the umask."""

from __future__ import annotations

import os
import stat

import pytest

from aaco.agent.sources.ingest import Quarantine
from aaco.agent.sources.traces.context import BadRow
from aaco.contract.files import make_dirs, write_bytes_atomic
from aaco.contract.stats import Stats
from aaco.exporters.base import ExportResult
from aaco.exporters.lake import LakeConfig, LakeExporter
from tests.support.modes import loose

from .builders import item, iterations, kernels
from .test_lake import DAY1, DAY2, snapshot


@pytest.fixture
def open_umask():
    """Umask 0 for the test: without an explicit mode every file would be 0666 and every directory 0777."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def test_every_file_and_directory_of_the_lake_is_private(tmp_path, open_umask):
    records = [{"source": "replay", "subject": "x.json"}]
    lx = LakeExporter(LakeConfig(path=tmp_path / "a" / "lake"), Stats(), records=lambda: records)
    lx.start()
    assert lx.export(item("kernels", kernels([DAY1, DAY2]))) is ExportResult.SUCCESS
    assert lx.export(item("iterations", iterations([(DAY1, DAY1 + 10)]))) is ExportResult.SUCCESS
    assert lx.commit()
    assert lx.export_snapshot(snapshot()) is ExportResult.SUCCESS
    lx.shutdown()
    names = {p.name for p in lx.root.rglob("*")}
    assert {"analysis.json", "sources.json", "offsets.json", ".lock"} <= names
    assert len(list(lx.root.rglob("part-*.parquet"))) == 3  # two dates of kernels, one of iterations
    assert loose(tmp_path / "a") == []


def test_files_an_earlier_version_left_loose_are_tightened_when_rewritten(tmp_path, open_umask):
    root = tmp_path / "lake"
    root.mkdir()
    for name in ("analysis.json", ".lock"):
        (root / name).write_text("{}")
        (root / name).chmod(0o666)
    lx = LakeExporter(LakeConfig(path=root), Stats())
    lx.start()
    assert lx.export_snapshot(snapshot()) is ExportResult.SUCCESS
    lx.shutdown()
    assert stat.S_IMODE((root / "analysis.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((root / ".lock").stat().st_mode) == 0o640


def test_quarantine_copies_are_never_looser_than_their_source(tmp_path, open_umask):
    src = tmp_path / "in"
    src.mkdir()
    secret, shared = src / "secret.json", src / "shared.json"
    secret.write_text("[")
    secret.chmod(0o600)
    shared.write_text("[")
    shared.chmod(0o666)
    q = Quarantine(tmp_path / "lake" / "quarantine" / "spool")
    q.file(secret)
    q.file(shared)
    q.rows(shared, [BadRow(3, b"bad,row", "bad_value")])
    assert stat.S_IMODE((q.root / "secret.json").stat().st_mode) == 0o600
    assert stat.S_IMODE((q.root / "shared.json").stat().st_mode) == 0o640
    assert (q.root / "shared.json.bad").read_text() == "3\tbad_value\tbad,row\n"
    assert loose(tmp_path / "lake") == []


def test_the_spool_quarantine_does_not_copy_through_a_link(tmp_path):
    outside = tmp_path / "outside.json"
    outside.write_text("[")
    link = tmp_path / "link.json"
    link.symlink_to(outside)
    q = Quarantine(tmp_path / "q", follow_symlinks=False)
    q.file(link)
    assert not (tmp_path / "q" / "link.json").exists()
    Quarantine(tmp_path / "q").file(link)  # replay: a link named on the command line is the user's own
    assert (tmp_path / "q" / "link.json").read_text() == "["


def test_helpers_never_write_through_a_link_and_make_every_missing_level(tmp_path, open_umask):
    target = tmp_path / "target"
    target.write_text("keep")
    (tmp_path / f".x.json.{os.getpid()}.tmp").symlink_to(target)
    with pytest.raises(OSError):
        write_bytes_atomic(tmp_path / "x.json", b"{}")
    assert target.read_text() == "keep"
    make_dirs(tmp_path / "a" / "b" / "c")
    assert loose(tmp_path / "a") == []
