"""The service lifecycle with real sources: shutdown is idempotent, safe before start, and flushes."""

from __future__ import annotations

import threading
import time

import pytest

from aaco.agent.config import load_config
from aaco.agent.service import AgentService, State
from aaco.contract.stats import EVENTS_DROPPED, EXPORT_ERRORS, SOURCE_DROP_REASONS, SOURCE_ERROR_REASONS, SOURCE_ERRORS
from aaco.exporters.testing import InMemoryExporter

pytestmark = pytest.mark.integration


class CountingProgress:
    def __init__(self):
        self.steps = 0

    def start(self, task, total):
        pass

    def advance(self, task, steps=1):
        self.steps += steps

    def finish(self, task):
        pass


def service_for(tmp_path, sources, progress=None, **pipeline):
    cfg = load_config(
        None,
        {
            "node": "n1",
            "sources": sources,
            "exporters": {"prometheus": {"enabled": False}, "lake": {"path": str(tmp_path / "lake")}},
            "pipeline": pipeline,
        },
        env={},
    )
    mem = InMemoryExporter()
    return AgentService(cfg, progress=progress, extra_exporters=[mem]), mem


def test_shutdown_before_start_is_safe_and_idempotent(tmp_path):
    svc, mem = service_for(tmp_path, [])
    svc.shutdown()
    svc.shutdown()
    assert svc.state is State.STOPPED
    assert mem.started == 0 and mem.shutdowns == 0
    with pytest.raises(RuntimeError):
        svc.start()


def test_shutdown_twice_flushes_once(tmp_path, samples):
    svc, mem = service_for(tmp_path, [{"type": "replay", "paths": [str(samples / "kineto")]}])
    svc.start()
    deadline = time.monotonic() + 60
    while not svc.sources_done() and time.monotonic() < deadline:
        time.sleep(0.05)
    svc.shutdown()
    svc.shutdown()
    assert svc.state is State.STOPPED
    assert mem.flushes == 1 and mem.shutdowns == 1
    table = mem.table("kernels")
    assert table is not None and table.num_rows == 114
    assert mem.snapshots and "kar" in mem.snapshots[-1].results
    assert (tmp_path / "lake" / "analysis.json").exists()


def test_concurrent_shutdowns(tmp_path, samples):
    svc, mem = service_for(tmp_path, [{"type": "replay", "paths": [str(samples / "kineto")]}])
    svc.start()
    threads = [threading.Thread(target=svc.shutdown) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert svc.state is State.STOPPED
    assert mem.shutdowns == 1


def test_shutdown_mid_workload_keeps_what_ran(tmp_path):
    progress = CountingProgress()
    svc, mem = service_for(
        tmp_path, [{"type": "ort", "iterations": 1000, "warmup": 0}], progress, shutdown_timeout_s=20
    )
    svc.start()
    deadline = time.monotonic() + 60
    while progress.steps < 20 and time.monotonic() < deadline:  # 20 iterations into a 1000-iteration cycle
        time.sleep(0.05)
    assert mem.table("iterations") is None  # nothing published before the cycle ends
    t0 = time.monotonic()
    svc.shutdown()
    assert time.monotonic() - t0 < 20
    iterations = mem.table("iterations")
    kernels = mem.table("kernels")
    assert iterations is not None and 0 < iterations.num_rows < 1000
    assert kernels is not None and kernels.column("trace_id").null_count == 0


def test_health_follows_the_lifecycle(tmp_path, samples):
    svc, _ = service_for(tmp_path, [{"type": "replay", "paths": [str(samples / "kineto")]}])
    assert svc.live() == (False, "not started")
    assert svc.ready()[0] is False
    svc.start()
    deadline = time.monotonic() + 10
    while not svc.ready()[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert svc.ready() == (True, "ok")
    assert svc.live() == (True, "ok")
    svc.shutdown()
    assert svc.live() == (False, "stopped")


def test_run_until_stopped_returns_when_the_sources_end_and_wakes_on_signals(tmp_path, samples):
    import os
    import signal

    from aaco.agent.main_loop import run_until_stopped

    svc, mem = service_for(tmp_path, [{"type": "replay", "paths": [str(samples / "kineto")]}])
    run_until_stopped(svc, stop_when_sources_done=True, poll_s=60)  # woken by the ending source, not a poll
    assert svc.state is State.STOPPED and svc.sources_done()
    assert mem.table("kernels").num_rows == 114

    svc, _ = service_for(tmp_path / "b", [])
    reloads = []

    def reload_config():
        reloads.append(1)
        os.kill(os.getpid(), signal.SIGTERM)  # the next signal stops it
        return svc.config

    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGHUP)).start()
    run_until_stopped(svc, stop_when_sources_done=False, reload_config=reload_config, poll_s=60)
    assert reloads == [1] and svc.state is State.STOPPED


def test_a_crashed_source_is_restarted_and_reported_down_until_then(tmp_path, monkeypatch):
    from aaco.agent.sources.trace_dir import TraceDirSource
    from aaco.contract.stats import SOURCE_RESTARTS

    real = TraceDirSource.poll
    crashed: list[str] = []

    def poll(self, ctx, quarantine):  # a bug outside any one file: the first pass raises
        if not crashed:
            crashed.append(self.name)
            raise RuntimeError("listing bug")
        return real(self, ctx, quarantine)

    monkeypatch.setattr(TraceDirSource, "poll", poll)
    spool = tmp_path / "spool"
    svc, _ = service_for(tmp_path, [{"type": "trace_dir", "path": str(spool), "poll_interval_s": 0.05}])
    svc.start()
    try:
        down = "source trace_dir crashed (RuntimeError: listing bug); restarting in 1s"
        deadline = time.monotonic() + 30
        while svc.live()[1] != down and time.monotonic() < deadline:
            time.sleep(0.01)
        assert svc.live() == (False, down)
        assert svc.ready() in ((False, down), (False, "starting"))
        while not (svc.live()[0] and svc.ready()[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (svc.live(), svc.ready()) == ((True, "ok"), (True, "ok"))
        assert svc.stats.get(SOURCE_RESTARTS, source="trace_dir") == 1
        assert not svc.sources_done()  # running again, following the spool
        assert [p.reason for p in svc.problems] == ["crash"]
    finally:
        svc.shutdown()


def test_forwarders_are_labelled_by_signal_and_closed_within_the_deadline(tmp_path, caplog):
    """Metrics forwarded to an upstream that accepts and never answers: shutdown keeps its deadline, counts them."""
    import socket
    import urllib.request

    from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2

    from aaco.contract.stats import EVENTS_DROPPED, QUEUE_CAPACITY

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    cfg = load_config(
        None,
        {
            "node": "n1",
            "sources": [],
            "exporters": {
                "prometheus": {"enabled": False},
                "lake": {"path": str(tmp_path / "lake")},
                "otlp": {"endpoint": f"http://127.0.0.1:{silent.getsockname()[1]}", "metrics_interval_s": 3600},
            },
            "receivers": {"otlp": {"enabled": True, "grpc_port": 0, "http_port": 0}},
        },
        env={},
    )
    svc = AgentService(cfg)
    try:
        svc.start()
        for kind in ("metrics", "logs"):
            assert svc.stats.get(QUEUE_CAPACITY, queue=f"forward:{kind}") > 0  # labelled by signal
        req = metrics_service_pb2.ExportMetricsServiceRequest()
        metric = req.resource_metrics.add().scope_metrics.add().metrics.add()
        metric.name = "app.requests"
        for i in range(3):
            metric.gauge.data_points.add().as_int = i
        for _ in range(2):
            post = urllib.request.Request(
                f"http://127.0.0.1:{svc.receivers['otlp'].http_port}/v1/metrics",
                data=req.SerializeToString(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            with urllib.request.urlopen(post, timeout=10) as resp:
                assert resp.status == 200
        assert svc.budget.held_by("forward:metrics") > 0  # queued or in flight: held in the agent's budget
        started = time.monotonic()
        with caplog.at_level("WARNING", logger="aaco.service"):
            svc.shutdown(timeout_s=2.0)
        assert time.monotonic() - started < 2.0 + 5  # the deadline plus a fixed slack, not the 10 s send timeout
    finally:
        svc.shutdown()
        silent.close()
    assert svc.stats.get(EVENTS_DROPPED, component="forward:metrics", reason="shutdown") == 6
    assert svc.budget.held == 0
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("shutdown: not sent")]
    assert "forward:metrics 6" in line


def test_error_and_drop_counters_are_at_zero_from_the_start(tmp_path, samples):
    svc, mem = service_for(tmp_path, [{"type": "replay", "paths": [str(samples / "kineto")], "name": "spool"}])
    svc.start()
    try:
        stats = svc.stats
        for reason in SOURCE_ERROR_REASONS:
            assert (SOURCE_ERRORS, ("spool", reason)) in series(stats)
        for reason in SOURCE_DROP_REASONS:
            assert (EVENTS_DROPPED, ("source:spool", reason)) in series(stats)
        for exporter in ("lake", mem.name):
            assert (EXPORT_ERRORS, (exporter,)) in series(stats)
    finally:
        svc.shutdown()


def series(stats):
    """(metric, label values) of every series the stats hold, zeros included."""
    return {(p.metric, tuple(p.labels[k] for k in p.metric.labels)) for p in stats.points()}
