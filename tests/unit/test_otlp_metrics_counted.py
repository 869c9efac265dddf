"""OTLP metrics: every export's outcome counted, and flush and shutdown kept to their timeout."""

from __future__ import annotations

import threading
import time

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from aaco.contract.stats import EVENTS_DROPPED, EVENTS_EMITTED, EXPORT_ERRORS, Stats
from aaco.exporters.otlp_metrics import COMPONENT, OtlpMetricsExporter, data_points
from aaco.exporters.otlp_settings import OtlpConfig


class Snapshot:
    def points(self):
        return []


class FakeExporter(MetricExporter):
    """Answers with ``result``; with ``hang``, like the SDK's OTLP exporter against a silent upstream, it ignores the
    timeout it is given and only shutdown ends it."""

    def __init__(self, result=MetricExportResult.SUCCESS, hang=False):
        super().__init__()
        self.result = result
        self.hang = hang
        self.exports: list[int] = []
        self.stopped = threading.Event()

    def export(self, metrics_data, timeout_millis=10_000, **kwargs):
        self.exports.append(data_points(metrics_data))
        if self.hang:
            self.stopped.wait(60)
            return MetricExportResult.FAILURE
        return self.result

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kwargs):
        self.stopped.set()


def exporter(fake, stats):
    cfg = OtlpConfig(endpoint="http://127.0.0.1:1")
    exp = OtlpMetricsExporter(cfg, stats, "n1", env={}, interval_s=3600, exporter=fake)
    exp.start()
    stats.inc(EVENTS_EMITTED, 1, component="y")  # the agent's own points are exported too
    exp.export_snapshot(Snapshot())
    return exp


def test_a_failed_export_is_counted_with_the_points_it_lost():
    stats = Stats()
    fake = FakeExporter(MetricExportResult.FAILURE)
    exp = exporter(fake, stats)
    assert exp.force_flush(10)
    assert fake.exports and fake.exports[0] > 0
    assert stats.get(EXPORT_ERRORS, exporter="otlp_metrics") == 1
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="export_failed") == fake.exports[0]
    exp.shutdown(5)


def test_a_delivered_export_is_counted_as_emitted():
    stats = Stats()
    fake = FakeExporter()
    exp = exporter(fake, stats)
    assert exp.force_flush(10)
    assert stats.get(EVENTS_EMITTED, component=COMPONENT) == fake.exports[0] > 0
    assert stats.get(EXPORT_ERRORS, exporter="otlp_metrics") == 0
    exp.shutdown(5)


def test_flush_and_shutdown_keep_their_timeout_against_an_exporter_that_does_not():
    stats = Stats()
    fake = FakeExporter(hang=True)
    exp = exporter(fake, stats)
    started = time.monotonic()
    assert not exp.force_flush(0.5)  # the export still runs: not flushed
    exp.shutdown(0.5)
    assert time.monotonic() - started < 1.0 + 5  # both timeouts plus a fixed slack, never the exporter's own
    assert fake.stopped.is_set()  # its retries ended, its call cancelled
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="shutdown") >= fake.exports[0] > 0
    time.sleep(0.5)  # the given-up export returns now (and the reader's last one runs): each counted once
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="shutdown") == sum(fake.exports)
    assert stats.get(EVENTS_DROPPED, component=COMPONENT, reason="export_failed") == 0
