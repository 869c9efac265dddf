"""The spool's read rule (``spool_policy``): no link out of the spool, only allowed owners' files, checked on the fd."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from aaco.agent.sources.spool_policy import SpoolPolicy, SpoolRefusedError
from aaco.agent.sources.trace_dir import TraceDirConfig, TraceDirSource
from aaco.contract.stats import SOURCE_ERRORS
from tests.conftest import skip_or_fail

from .test_source_supervision import A100, context, drain, poll_until_settled

ROWS = 98  # the A100 Kineto trace's kernels, copies and memsets


@pytest.fixture
def spool(tmp_path: Path) -> Path:
    path = tmp_path / "spool"
    path.mkdir()
    return path


@pytest.fixture
def secret(tmp_path: Path, samples: Path) -> Path:
    """A real trace in a 0700 directory outside the spool, mode 0600: what the spool must not be a door to."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    path = private / "secret_trace.json.gz"
    shutil.copy(samples / "kineto" / A100, path)
    path.chmod(0o600)
    return path


def run(tmp_path: Path, spool: Path, **cfg) -> tuple[int, object]:
    """Two polls of a trace_dir source over ``spool`` under ``cfg``: (kernel rows published, the context)."""
    ctx = context(tmp_path)
    src = TraceDirSource(TraceDirConfig(path=spool, settle_s=0.001, **cfg), "spool")
    poll_until_settled(src, ctx)
    poll_until_settled(src, ctx)  # polled again: a skipped file is counted once
    return drain(ctx), ctx


@pytest.mark.parametrize(("follow", "reason"), [(False, "symlink"), (True, "symlink_outside")])
def test_a_link_out_of_the_spool_is_neither_read_nor_quarantined(tmp_path, spool, secret, follow, reason):
    (spool / "trace.json.gz").symlink_to(secret)
    (spool / "dir").symlink_to(secret.parent, target_is_directory=True)
    rows, ctx = run(tmp_path, spool, follow_symlinks=follow)
    assert rows == 0
    assert ctx.stats.get(SOURCE_ERRORS, source="spool", reason=reason) == 2  # the file link and the directory link
    assert ctx.stats.total(SOURCE_ERRORS) == 2
    assert not (ctx.quarantine and ctx.quarantine.exists() and any(ctx.quarantine.iterdir()))
    assert {p.subject for p in ctx.journal.problems} == {str(spool / "trace.json.gz"), str(spool / "dir")}


def test_a_link_inside_the_spool_is_read_once_when_links_are_followed(tmp_path, spool, samples):
    hidden = spool / ".staging"
    hidden.mkdir()
    shutil.copy(samples / "kineto" / A100, hidden / "a.json.gz")
    shutil.copy(samples / "kineto" / A100, spool / "b.json.gz")
    (spool / "a.json.gz").symlink_to(hidden / "a.json.gz")
    (spool / "b-again.json.gz").symlink_to(spool / "b.json.gz")  # the same file as b: read once
    rows, ctx = run(tmp_path, spool, follow_symlinks=True)
    assert rows == 2 * ROWS
    assert ctx.stats.total(SOURCE_ERRORS) == 0
    rows, ctx = run(tmp_path, spool)  # by default no link is followed, inside or out
    assert rows == ROWS
    assert ctx.stats.get(SOURCE_ERRORS, source="spool", reason="symlink") == 2


def test_files_of_another_owner_or_writable_by_all_are_skipped(tmp_path, spool, samples):
    if os.geteuid() != 0:
        skip_or_fail("changing a file's owner needs root")
    other, loose, mine = spool / "other.json.gz", spool / "loose.json.gz", spool / "mine.json.gz"
    for path in (other, loose, mine):
        shutil.copy(samples / "kineto" / A100, path)
    os.chown(other, 65534, 65534)
    loose.chmod(0o666)
    rows, ctx = run(tmp_path, spool)
    assert rows == ROWS  # mine only
    assert ctx.stats.get(SOURCE_ERRORS, source="spool", reason="owner_policy") == 2
    messages = {Path(p.subject).name: p.message for p in ctx.journal.problems}
    assert "uid 65534" in messages["other.json.gz"] and "allowed_uids" in messages["other.json.gz"]
    assert "writable by every user" in messages["loose.json.gz"]
    assert not (ctx.quarantine and ctx.quarantine.exists())

    rows, ctx = run(tmp_path, spool, allowed_uids=[0, 65534])
    assert rows == 2 * ROWS  # other's owner allowed; loose stays refused
    rows, ctx = run(tmp_path, spool, allowed_uids=[65534])
    assert rows == ROWS and ctx.stats.get(SOURCE_ERRORS, source="spool", reason="owner_policy") == 2


def test_the_rule_is_checked_again_on_the_opened_descriptor(spool, secret):
    sub = spool / "proc1"
    sub.mkdir()
    (sub / "t.json").write_text("[]")
    policy = SpoolPolicy(spool, follow_symlinks=True, allowed_uids=None)
    entry = policy.entry(sub / "t.json")
    assert entry is not None and entry.refusal is None
    with policy.open(entry.path, entry.st) as fh:
        assert fh.read() == b"[]"

    (sub / "t.json").unlink()  # swapped for a link after the listing
    (sub / "t.json").symlink_to(secret)
    with pytest.raises(SpoolRefusedError) as caught:
        policy.open(entry.path, entry.st)
    assert caught.value.refusal.reason == "symlink"

    shutil.rmtree(sub)  # a directory on the way swapped for a link to the outside
    sub.symlink_to(secret.parent, target_is_directory=True)
    (secret.parent / "t.json").write_text("[]")
    with pytest.raises(SpoolRefusedError):
        policy.open(entry.path)

    outside = SpoolPolicy(spool, follow_symlinks=False, allowed_uids="any")
    with pytest.raises(SpoolRefusedError):
        outside.open(secret)
    (spool / "other.json").write_text("[]")
    with pytest.raises(FileNotFoundError):  # another inode than the one listed
        outside.open(spool / "other.json", entry.st)
