"""A bad file never stops a source (the file boundary), and a crashed source is restarted with backoff.

Also how ``trace_dir`` reads a file: a poll recognises its format without hashing it, a file read
whole is hashed once, a tailed one never, and each is read within the source's limits.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from aaco.agent.pipeline.bus import Bus
from aaco.agent.sources import ingest, replay
from aaco.agent.sources.base import Journal, Source, SourceContext
from aaco.agent.sources.ingest import Quarantine, ingest_file
from aaco.agent.sources.replay import ReplaySource, ReplaySourceConfig
from aaco.agent.sources.supervise import Supervisor
from aaco.agent.sources.trace_dir import TraceDirConfig, TraceDirSource
from aaco.agent.sources.traces import detect
from aaco.agent.sources.traces.detect import identify
from aaco.agent.sources.traces.parse import context_for
from aaco.agent.sources.traces.rocprofv3_csv import Rocprofv3CsvDecoder
from aaco.contract.errors import AacoError
from aaco.contract.ledger import Ledger
from aaco.contract.stats import SOURCE_ERRORS, SOURCE_LAG, SOURCE_RESTARTS, Stats

from .test_rocprof_csv import hip_trace, sample_rows

A100 = "a100_alexnet_trace.json.gz"  # 79 kernels, 16 copies, 3 memsets: 98 rows
MI250 = "mi250_minitoy_train_ROCm6_2_kineto.json.gz"  # 14 kernels, 2 copies: 16 rows


def context(tmp_path: Path, ledger: Ledger | None = None) -> SourceContext:
    stats = Stats()
    return SourceContext(
        "node-a",
        stats,
        Bus(stats),
        Journal(stats),
        ledger=ledger or Ledger(),
        quarantine=tmp_path / "quarantine" / "spool",
    )


def drain(ctx: SourceContext) -> int:
    """Kernel rows on the bus; each piece marked durable and folded into the ledger, as a lake commit does."""
    rows = 0
    while (item := ctx.bus.get(0)) is not None:
        rows += item.batch.num_rows if item.kind == "kernels" else 0
        ctx.ledger.apply(list(item.ranges))
    ctx.ledger.apply([])
    return rows


def lag_reported(ctx: SourceContext) -> bool:
    """Whether the source set ``aaco_source_lag_seconds`` at all (a value of 0 included)."""
    return any(p.metric is SOURCE_LAG for p in ctx.stats.points())


def poll_until_settled(src: TraceDirSource, ctx: SourceContext) -> None:
    """Two passes: the first sees the files, the second (after settle_s) reads them."""
    q = Quarantine(ctx.quarantine)
    src.poll(ctx, q)
    time.sleep(0.02)
    src.poll(ctx, q)


@pytest.fixture
def failing_parser(monkeypatch):
    """parse_any, except that files named bad* raise at once and half* raise after their first chunk."""
    real = ingest.parse_any
    calls: list[str] = []

    def parse_any(tf, tctx, max_bytes, read=None):
        calls.append(tf.path.name)
        if tf.path.name.startswith("bad"):
            raise OverflowError("Python int too large to convert to C long")
        yield from real(tf, tctx, max_bytes=max_bytes, read=read)
        if tf.path.name.startswith("half"):
            raise KeyError("correlation")

    monkeypatch.setattr(ingest, "parse_any", parse_any)
    return calls


def test_a_file_that_raises_is_quarantined_committed_and_the_spool_goes_on(tmp_path, samples, failing_parser, caplog):
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copy(samples / "kineto" / A100, spool / "bad_trace.json.gz")
    shutil.copy(samples / "kineto" / MI250, spool / "half_trace.json.gz")
    shutil.copy(samples / "kineto" / A100, spool / "good_trace.json.gz")
    cfg = TraceDirConfig(path=spool, settle_s=0.001)
    ctx = context(tmp_path)
    with caplog.at_level(logging.WARNING, logger="aaco.sources"):
        poll_until_settled(TraceDirSource(cfg, "spool"), ctx)

    assert drain(ctx) == 98 + 16  # the good file, and what the half file gave before it raised
    assert ctx.stats.get(SOURCE_ERRORS, source="spool", reason="parser_error") == 2
    assert not lag_reported(ctx)  # whole files (these are years old): no lag
    assert sorted(p.name for p in ctx.quarantine.iterdir()) == ["bad_trace.json.gz", "half_trace.json.gz"]
    named = [r.getMessage() for r in caplog.records if "bad_trace" in r.getMessage()]
    assert len(named) == 1 and "OverflowError: Python int too large" in named[0]
    assert "nothing could be read" in named[0]
    half = next(p for p in ctx.journal.problems if "half_trace" in p.subject)
    assert "KeyError" in half.message and "kept the" in half.message and not half.fatal
    assert not any(r.exc_info for r in caplog.records)  # no traceback at warning level

    # Restart from what the lake committed: nothing is read again, the failed files included.
    restarted = context(tmp_path, Ledger())
    restarted.ledger.load(ctx.ledger.snapshot())
    failing_parser.clear()
    poll_until_settled(TraceDirSource(cfg, "spool"), restarted)
    assert failing_parser == []
    assert drain(restarted) == 0
    assert restarted.stats.total(SOURCE_ERRORS) == 0


def test_a_tailed_file_that_raises_is_quarantined_and_not_tailed_again(tmp_path, samples, monkeypatch):
    spool = tmp_path / "spool"
    spool.mkdir()
    shutil.copy(samples / "rocprofv3" / "kernel_trace.csv", spool / "77_kernel_trace.csv")
    shutil.copy(samples / "rocprofv3" / "kernel_trace.csv", spool / "78_kernel_trace.csv")
    real = Rocprofv3CsvDecoder.decode

    def decode(self, data, start):
        if "77_" in self.ctx.run_id:
            raise MemoryError()
        return real(self, data, start)

    monkeypatch.setattr(Rocprofv3CsvDecoder, "decode", decode)
    cfg = TraceDirConfig(path=spool, settle_s=0.001)
    ctx = context(tmp_path)
    poll_until_settled(TraceDirSource(cfg, "spool"), ctx)
    assert drain(ctx) == 9  # the other file, whole
    assert ctx.stats.get(SOURCE_ERRORS, source="spool", reason="out_of_memory") == 1
    assert (ctx.quarantine / "77_kernel_trace.csv").is_file()
    assert lag_reported(ctx)  # tailed lines are live data

    restarted = context(tmp_path, Ledger())
    restarted.ledger.load(ctx.ledger.snapshot())
    poll_until_settled(TraceDirSource(cfg, "spool"), restarted)
    assert drain(restarted) == 0
    assert restarted.stats.total(SOURCE_ERRORS) == 0


def test_ingest_file_catches_whatever_the_parser_raises(tmp_path, samples, failing_parser):
    """The path replay and capture share: a failed file is reported and committed as read."""
    path = tmp_path / "bad.json.gz"
    shutil.copy(samples / "kineto" / MI250, path)
    ctx = context(tmp_path)
    tf = identify(path)
    tctx = context_for(tf, node="n", source="replay")
    result = ingest_file(ctx, "replay", tf, tctx, Quarantine(ctx.quarantine), key="file:x", max_bytes=1 << 30)
    assert not result.complete and result.kernels == 0
    assert ctx.stats.get(SOURCE_ERRORS, source="replay", reason="parser_error") == 1
    assert [p.fatal for p in ctx.journal.problems] == [True]
    drain(ctx)
    again = ingest_file(ctx, "replay", tf, tctx, Quarantine(ctx.quarantine), key="file:x", max_bytes=1 << 30)
    assert again.already and failing_parser == ["bad.json.gz"]


def test_replay_goes_on_past_a_file_whose_identification_raises(tmp_path, samples, monkeypatch):
    for name in ("bad_trace.json.gz", "good_trace.json.gz"):
        shutil.copy(samples / "kineto" / MI250, tmp_path / name)
    real = replay.identify

    def identify(path):
        if path.name.startswith("bad"):
            raise RuntimeError("hash unit on fire")
        return real(path)

    monkeypatch.setattr(replay, "identify", identify)
    ctx = context(tmp_path)
    cfg = ReplaySourceConfig(paths=[tmp_path / "bad_trace.json.gz", tmp_path / "good_trace.json.gz"])
    ReplaySource(cfg, "r").run(ctx)
    assert drain(ctx) == 16  # the good file, whole
    assert ctx.stats.get(SOURCE_ERRORS, source="r", reason="parser_error") == 1
    (problem,) = ctx.journal.problems
    assert problem.subject.endswith("bad_trace.json.gz") and problem.fatal
    assert problem.message == "RuntimeError: hash unit on fire (nothing could be read)"
    assert sorted(p.name for p in ctx.quarantine.iterdir()) == ["bad_trace.json.gz"]


def test_damage_is_reported_as_incomplete_with_its_offset(tmp_path, samples):
    """An invalid event between good ones: named with its byte offset, the file kept whole, not complete."""
    data = gzip.decompress((samples / "kineto" / MI250).read_bytes())
    at = data.index(b'"cat": "kernel"')
    start = data.rindex(b"{", 0, at)  # the broken event's first byte
    path = tmp_path / "broken.json"
    path.write_bytes(data[:at] + b'"cat" "kernel"' + data[at + len(b'"cat": "kernel"') :])
    ctx = context(tmp_path)
    tf = identify(path)
    tctx = context_for(tf, node="n", source="replay")
    result = ingest_file(ctx, "replay", tf, tctx, Quarantine(ctx.quarantine), key="file:z", max_bytes=1 << 30)
    assert not result.complete and result.kernels == 16 - 1
    (problem,) = ctx.journal.problems
    assert (problem.reason, problem.fatal) == ("invalid_json", False)
    assert problem.message == f"invalid JSON at byte {start} (1 place(s)): kept the events around it"
    assert (ctx.quarantine / "broken.json").read_bytes() == path.read_bytes()


def test_a_file_with_bad_events_the_parser_cannot_show_as_lines_is_kept_whole(tmp_path, samples, monkeypatch):
    real = ingest.parse_any

    def parse_any(tf, tctx, max_bytes, read=None):
        for parsed in real(tf, tctx, max_bytes=max_bytes, read=read):
            parsed.skipped["int_out_of_range"] += 1  # as a parser that left one event out says it
            yield parsed

    monkeypatch.setattr(ingest, "parse_any", parse_any)
    path = tmp_path / "odd.json.gz"
    shutil.copy(samples / "kineto" / MI250, path)
    ctx = context(tmp_path)
    tf = identify(path)
    tctx = context_for(tf, node="n", source="replay")
    result = ingest_file(ctx, "replay", tf, tctx, Quarantine(ctx.quarantine), key="file:y", max_bytes=1 << 30)
    assert result.complete and result.kernels == 16
    assert ctx.stats.get(SOURCE_ERRORS, source="replay", reason="int_out_of_range") == 1
    assert (ctx.quarantine / "odd.json.gz").read_bytes() == path.read_bytes()


# -- how trace_dir reads ------------------------------------------------------------------------------


def test_a_growing_file_is_never_hashed_and_a_whole_one_once(tmp_path, samples, monkeypatch):
    spool = tmp_path / "spool"
    spool.mkdir()
    sample = samples / "rocprofv3" / "kernel_trace.csv"
    lines = sample.read_bytes().splitlines(keepends=True)
    tailed = spool / "91_kernel_trace.csv"
    tailed.write_bytes(b"".join(lines[:4]))
    hip = spool / "91_hip_api_trace.csv"  # its companion, written as it runs: the decoder is built again
    hip.write_text(hip_trace(sample_rows(sample)))
    shutil.copy(samples / "kineto" / MI250, spool / "trace.json.gz")
    hashed: list[str] = []
    real = detect.content_identity
    monkeypatch.setattr(detect, "content_identity", lambda path: hashed.append(path.name) or real(path))
    src = TraceDirSource(TraceDirConfig(path=spool, settle_s=0.001), "spool")
    ctx = context(tmp_path)
    q = Quarantine(ctx.quarantine)
    for i, line in enumerate(lines[4:]):
        src.poll(ctx, q)
        with tailed.open("ab") as fh:
            fh.write(line)
        os.utime(hip, ns=(10**18 + i, 10**18 + i))
        time.sleep(0.002)  # past settle_s: the whole files are read at the next poll
    poll_until_settled(src, ctx)

    assert drain(ctx) == 9 + 16
    assert hashed.count("trace.json.gz") == 1  # read whole: hashed once
    assert "91_kernel_trace.csv" not in hashed  # tailed through every poll: never
    assert hashed.count("91_hip_api_trace.csv") <= 1  # a companion, read whole once it settles


def test_a_tailed_bad_row_is_named_with_its_offset(tmp_path, samples):
    spool = tmp_path / "spool"
    spool.mkdir()
    lines = (samples / "rocprofv3" / "kernel_trace.csv").read_bytes().splitlines(keepends=True)
    junk = b"this is not a row of the trace\n"
    (spool / "92_kernel_trace.csv").write_bytes(b"".join(lines[:5]) + junk + b"".join(lines[5:]))
    ctx = context(tmp_path)
    poll_until_settled(TraceDirSource(TraceDirConfig(path=spool, settle_s=0.001), "spool"), ctx)
    assert drain(ctx) == 9
    (problem,) = ctx.journal.problems
    assert problem.message == f"skipped 1 bad row(s): {problem.reason}, the first at byte {len(b''.join(lines[:5]))}"


def test_trace_dir_reads_within_its_limits(tmp_path, samples):
    """A real trace whose events array ends in 100 unclosed levels: cut short under the default depth
    limit, too deep under 64; its events are kept either way."""
    spool = tmp_path / "spool"
    spool.mkdir()
    doc = json.loads(gzip.decompress((samples / "kineto" / MI250).read_bytes()))
    doc["traceEvents"] = doc.pop("traceEvents")  # last, so the damage ends the document
    text = json.dumps(doc).encode()
    assert text.endswith(b"]}")
    (spool / "deep.json").write_bytes(text[:-2] + b", " + b"[" * 100)
    seen = {}
    for depth in (None, 64):
        ctx = context(tmp_path / str(depth))
        cfg = TraceDirConfig(path=spool, settle_s=0.001, **({"max_json_depth": depth} if depth else {}))
        poll_until_settled(TraceDirSource(cfg, "spool"), ctx)
        seen[depth] = (drain(ctx), [p.reason for p in ctx.journal.problems])
    assert seen == {None: (16, ["truncated_json"]), 64: (16, ["json_too_deep"])}
    with pytest.raises(ValueError, match="max_json_depth"):
        TraceDirConfig(path=spool, max_json_depth=1025)


# -- supervision ----------------------------------------------------------------------------------


class Flaky(Source):
    """Raises ``crashes`` times, then returns (finite) or runs until stopped."""

    type = "flaky"

    def __init__(self, crashes: int, finite: bool = False, error: Exception | None = None) -> None:
        super().__init__("flaky")
        self.crashes, self.finite, self.runs = crashes, finite, 0
        self.error = error or RuntimeError("boom")

    def run(self, ctx: SourceContext) -> None:
        self.runs += 1
        if self.runs <= self.crashes:
            raise self.error
        if not self.finite:
            ctx.stop.wait()


class RecordedStop(threading.Event):
    """A stop event whose timed waits return at once, recording the backoff asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        if timeout is None:
            return super().wait()
        self.waits.append(timeout)
        return self.is_set()


def supervised(src: Source, **kw) -> tuple[Supervisor, SourceContext]:
    stats = Stats()
    ctx = SourceContext("n", stats, Bus(stats), Journal(stats), stop=RecordedStop())
    return Supervisor("flaky", src, ctx, **kw), ctx


def test_a_crashing_source_is_restarted_with_capped_exponential_backoff(caplog):
    src = Flaky(crashes=9, finite=True)
    sup, ctx = supervised(src)
    with caplog.at_level(logging.ERROR, logger="aaco.sources.supervise"):
        sup.finite_restarts = 100
        sup.run()
    assert src.runs == 10 and sup.restarts == 9
    assert ctx.stop.waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert ctx.stats.get(SOURCE_RESTARTS, source="flaky") == 9
    assert ctx.stats.get(SOURCE_ERRORS, source="flaky", reason="crash") == 9
    assert sup.down() is None and sup.ended.is_set()  # it ended normally in the end
    traced = [r for r in caplog.records if r.exc_info]
    assert len(traced) == 1  # the traceback once, each crash named
    assert len(caplog.records) == 9


def test_a_finite_source_that_ends_is_not_restarted_and_one_that_keeps_crashing_is_given_up():
    ok = Flaky(crashes=0, finite=True)
    sup, ctx = supervised(ok)
    sup.run()
    assert (ok.runs, sup.restarts, ctx.stop.waits, sup.down()) == (1, 0, [], None)

    broken = Flaky(crashes=100, finite=True, error=AacoError("no such device", subject="/dev/x"))
    sup, ctx = supervised(broken)
    sup.run()
    assert broken.runs == 4 and sup.restarts == 3
    assert sup.down() == "failed after 4 crashes (/dev/x: no such device); not restarted"
    assert ctx.stats.get(SOURCE_ERRORS, source="flaky", reason="error") == 4


def test_a_source_down_is_reported_until_it_runs_again_and_stop_ends_the_wait():
    src = Flaky(crashes=1)
    stats = Stats()
    ctx = SourceContext("n", stats, Bus(stats), Journal(stats))
    sup = Supervisor("flaky", src, ctx, initial_s=3600)
    thread = threading.Thread(target=sup.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while sup.down() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sup.down() == "crashed (RuntimeError: boom); restarting in 3600s"
    ctx.stop.set()  # the agent stops during the backoff: the thread ends at once, without a restart
    thread.join(10)
    assert not thread.is_alive() and sup.ended.is_set() and sup.restarts == 0
