"""The lake's commit protocol: offsets and visible parts agree after a crash at any step."""

from __future__ import annotations

import json
import os

import pyarrow.dataset as ds
import pytest

from aaco.contract.errors import AacoError
from aaco.contract.ledger import Ledger
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.stats import EVENTS_DROPPED, Stats
from aaco.exporters.lake import LakeConfig, LakeExporter

DAY = 1_795_000_000_000_000_000


def kernels(n, start=DAY):
    return conform(
        "kernels",
        {
            "start_ns": [start + i for i in range(n)],
            "end_ns": [start + i + 1 for i in range(n)],
            "node": ["n1"] * n,
            "pid": [1] * n,
            "tid": [1] * n,
            "device": ["0"] * n,
            "stream": [0] * n,
            "name": ["k"] * n,
            "kind": ["kernel"] * n,
            "correlation_id": list(range(n)),
            "source": ["t"] * n,
        },
    )


def lake(tmp_path, ledger=None, **cfg):
    lx = LakeExporter(LakeConfig(path=tmp_path / "lake", **cfg), Stats(), ledger=ledger or Ledger())
    lx.start()
    return lx


def rows(tmp_path):
    root = tmp_path / "lake" / "kernels"
    if not any(root.rglob("*.parquet")):
        return 0
    return ds.dataset(root, partitioning="hive").count_rows()


def piece(led, key, start, end, n):
    r = led.register(key, start, end, {"id": key})
    r.add_pieces(1)
    r.seal()
    return EventBatch("kernels", kernels(n, DAY + start), "t", (r,))


def test_commit_writes_offsets_with_parts(tmp_path):
    led = Ledger()
    lx = lake(tmp_path, led)
    lx.export(piece(led, "f", 0, 100, 5))
    assert lx.commit()
    state = json.loads((tmp_path / "lake" / "checkpoints" / "offsets.json").read_text())
    assert state["inputs"]["f"]["offset"] == 100
    assert rows(tmp_path) == 5
    assert not list((tmp_path / "lake" / "checkpoints").glob("commit-*.json"))


def test_rows_wait_until_their_range_completes(tmp_path):
    led = Ledger()
    lx = lake(tmp_path, led)
    r = led.register("f", 0, 50)
    r.add_pieces(2)  # two batches carry it; only one arrives before the commit
    lx.export(EventBatch("kernels", kernels(3), "t", (r,)))
    r.seal()
    assert lx.commit()
    assert rows(tmp_path) == 0  # not written: the range cannot complete in this commit
    lx.export(EventBatch("kernels", kernels(2, DAY + 10), "t", (r,)))
    assert lx.commit()
    assert rows(tmp_path) == 5
    assert led.committed("f")[0] == 50


def test_later_range_waits_for_an_earlier_one(tmp_path):
    led = Ledger()
    lx = lake(tmp_path, led)
    early = led.register("f", 0, 10)
    early.add_pieces(1)
    early.seal()
    lx.export(piece(led, "f", 10, 20, 4))
    assert lx.commit()
    assert rows(tmp_path) == 0  # writing it now would double it if we crashed before the early range
    lx.export(EventBatch("kernels", kernels(1), "t", (early,)))
    assert lx.commit()
    assert rows(tmp_path) == 5
    assert led.committed("f")[0] == 20


def test_rows_without_ranges_are_written_at_once(tmp_path):
    lx = lake(tmp_path)
    lx.export(EventBatch("kernels", kernels(7), "live"))
    assert lx.commit()
    assert rows(tmp_path) == 7


def test_failed_range_is_dropped_at_shutdown_and_counted(tmp_path):
    led = Ledger()
    stats = Stats()
    lx = LakeExporter(LakeConfig(path=tmp_path / "lake"), stats, ledger=led)
    lx.start()
    r = led.register("f", 0, 10)
    r.add_pieces(2)
    lx.export(EventBatch("kernels", kernels(3), "t", (r,)))
    r.fail()
    r.seal()
    lx.shutdown()
    assert rows(tmp_path) == 0
    assert stats.get(EVENTS_DROPPED, component="exporter:lake", reason="uncommitted_input") == 3
    assert led.committed("f")[0] == 0


def simulate_crash_after_intent(tmp_path, at: str | int):
    """Run a commit past its intent and die: writing the offsets (``"offsets"``), or after ``at`` of its two links."""
    led = Ledger()
    lx = lake(tmp_path, led)
    lx.export(piece(led, "f", 0, 64, 6))
    lx.export(
        EventBatch(
            "iterations",
            conform(
                "iterations",
                {
                    "start_ns": [DAY],
                    "end_ns": [DAY + 9],
                    "node": ["n1"],
                    "pid": [1],
                    "model": ["m"],
                    "run_id": ["r"],
                    "trace_id": ["a" * 32],
                    "span_id": ["b" * 16],
                    "source": ["t"],
                },
            ),
            "t",
            (),
        )
    )
    real_link = os.link
    calls = {"n": 0}

    def link(src, dst):
        if at != "offsets" and calls["n"] >= at:
            raise SystemExit("killed")
        calls["n"] += 1
        real_link(src, dst)

    import aaco.exporters.lake as lake_mod

    real_write = lake_mod.write_json_atomic
    writes = {"n": 0}

    def write(path, doc):
        writes["n"] += 1
        if at == "offsets" and writes["n"] > 1:  # the intent goes through; the offsets update does not
            raise SystemExit("killed")
        real_write(path, doc)

    os.link = link
    lake_mod.write_json_atomic = write
    try:
        with pytest.raises(SystemExit):
            lx.commit()
    finally:
        os.link = real_link
        lake_mod.write_json_atomic = real_write
    lx._lock_file.close()  # the process died: its lock is gone


@pytest.mark.parametrize("at", ["offsets", 0, 1])
def test_restart_finishes_an_interrupted_commit(tmp_path, at):
    simulate_crash_after_intent(tmp_path, at)
    assert list((tmp_path / "lake" / "checkpoints").glob("commit-*.json"))
    led = Ledger()
    lake(tmp_path, led)  # recovery
    assert rows(tmp_path) == 6  # every part of the commit is visible, exactly once
    assert ds.dataset(tmp_path / "lake" / "iterations", partitioning="hive").count_rows() == 1
    assert led.committed("f")[0] == 64  # and the offsets say so
    assert not list((tmp_path / "lake").rglob(".part-*.tmp"))
    assert not list((tmp_path / "lake" / "checkpoints").glob("commit-*.json"))


def test_a_commit_the_disk_refuses_leaves_nothing_and_the_next_writes_its_rows_once(tmp_path):
    """A full disk at any write of a commit (parts, intent, offsets): no part sealed, the rows kept, stored once."""
    import aaco.exporters.lake as lake_mod

    led = Ledger()
    lx = lake(tmp_path, led)
    lx.export(piece(led, "f", 0, 64, 6))
    real = lake_mod.write_json_atomic
    for refused in (1, 2):  # the intent's write, then the offsets'
        writes = {"n": 0}

        def write(path, doc, refused=refused, writes=writes):
            writes["n"] += 1
            if writes["n"] == refused:
                raise OSError(28, "No space left on device")
            real(path, doc)

        lake_mod.write_json_atomic = write
        try:
            assert not lx.commit()
        finally:
            lake_mod.write_json_atomic = real
        assert rows(tmp_path) == 0 and led.committed("f")[0] == 0
        assert not list((tmp_path / "lake" / "checkpoints").glob("commit-*.json"))
        assert not list((tmp_path / "lake").rglob(".part-*.tmp"))
    assert lx.commit()
    assert rows(tmp_path) == 6 and led.committed("f")[0] == 64
    lx.shutdown()
    led2 = Ledger()
    lake(tmp_path, led2)
    assert rows(tmp_path) == 6 and led2.committed("f")[0] == 64


def test_crash_before_intent_leaves_nothing(tmp_path):
    led = Ledger()
    lx = lake(tmp_path, led)
    lx.export(piece(led, "f", 0, 64, 6))
    import aaco.exporters.lake as lake_mod

    real = lake_mod.write_json_atomic
    lake_mod.write_json_atomic = lambda *a, **k: (_ for _ in ()).throw(SystemExit("killed"))
    try:
        with pytest.raises(SystemExit):
            lx.commit()
    finally:
        lake_mod.write_json_atomic = real
    lx._lock_file.close()
    led2 = Ledger()
    lake(tmp_path, led2)
    assert rows(tmp_path) == 0
    assert led2.committed("f") is None
    assert not list((tmp_path / "lake").rglob(".part-*.tmp"))


def test_second_agent_on_the_same_lake_is_refused(tmp_path):
    first = lake(tmp_path)
    with pytest.raises(AacoError, match="in use by another agent"):
        lake(tmp_path)
    first.shutdown()
    lake(tmp_path)  # released on shutdown


def test_corrupt_offsets_file_is_a_clear_error(tmp_path):
    lx = lake(tmp_path)
    lx.shutdown()
    (tmp_path / "lake" / "checkpoints" / "offsets.json").write_text("{not json")
    with pytest.raises(AacoError, match="unreadable checkpoint"):
        lake(tmp_path)


def test_a_range_with_no_rows_is_committed_too(tmp_path):
    """A file that gave no rows (or was given up as bad) still reaches offsets.json: not read again."""
    led = Ledger()
    lx = lake(tmp_path, ledger=led)
    done = led.register("bad-file", 0, 0, {"chunks": 0, "quarantined": True})
    done.seal()
    assert led.foldable()
    assert lx.force_flush(5)
    saved = json.loads((tmp_path / "lake" / "checkpoints" / "offsets.json").read_text())
    assert saved["inputs"]["bad-file"]["meta"]["quarantined"] is True
    assert not led.foldable() and led.pending("bad-file") == 0
    assert rows(tmp_path) == 0
    lx.shutdown(5)
