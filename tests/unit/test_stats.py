"""Self-metrics: counters, gauges, label checking, totals and the series cap."""

from __future__ import annotations

import threading

import pytest

from aaco.contract.stats import (
    EVENTS_DROPPED,
    EVENTS_RECEIVED,
    EXPORT_ERRORS,
    QUEUE_DEPTH,
    SOURCE_DROP_REASONS,
    SOURCE_ERROR_REASONS,
    STATS_SERIES_DROPPED,
    Stats,
    declare_components,
)


def point_map(stats: Stats) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(p.metric.prom_name, tuple(sorted(p.labels.items()))): p.value for p in stats.points()}


def test_counter_accumulates_per_label_set():
    s = Stats()
    s.inc(EVENTS_RECEIVED, 3, component="bus")
    s.inc(EVENTS_RECEIVED, 4, component="bus")
    s.inc(EVENTS_RECEIVED, component="worker")
    assert s.get(EVENTS_RECEIVED, component="bus") == 7
    assert s.get(EVENTS_RECEIVED, component="worker") == 1
    assert s.get(EVENTS_RECEIVED, component="never") == 0


def test_inc_by_zero_creates_no_series():
    s = Stats()
    s.inc(EVENTS_RECEIVED, 0, component="bus")
    names = [p.metric for p in s.points()]
    assert EVENTS_RECEIVED not in names


def test_gauge_set_replaces():
    s = Stats()
    s.set(QUEUE_DEPTH, 10, queue="bus")
    s.set(QUEUE_DEPTH, 4, queue="bus")
    assert s.get(QUEUE_DEPTH, queue="bus") == 4


@pytest.mark.parametrize(
    "labels",
    [{}, {"component": "x"}, {"component": "x", "reason": "r", "extra": "y"}, {"comp": "x", "reason": "r"}],
)
def test_wrong_labels_raise(labels):
    s = Stats()
    with pytest.raises(ValueError, match="aaco_events_dropped"):
        s.inc(EVENTS_DROPPED, 1, **labels)
    with pytest.raises(ValueError):
        s.set(EVENTS_DROPPED, 1, **labels)
    with pytest.raises(ValueError):
        s.get(EVENTS_DROPPED, **labels)


def test_total_sums_matching_series():
    s = Stats()
    s.inc(EVENTS_DROPPED, 2, component="source:a", reason="queue_full")
    s.inc(EVENTS_DROPPED, 3, component="source:a", reason="shutdown")
    s.inc(EVENTS_DROPPED, 5, component="source:b", reason="queue_full")
    s.inc(EVENTS_RECEIVED, 100, component="source:a")
    assert s.total(EVENTS_DROPPED) == 10
    assert s.total(EVENTS_DROPPED, component="source:a") == 5
    assert s.total(EVENTS_DROPPED, reason="queue_full") == 7
    assert s.total(EVENTS_DROPPED, component="source:b", reason="shutdown") == 0


def test_points_have_labels_of_their_definition():
    s = Stats()
    s.inc(EVENTS_DROPPED, 2, component="source:a", reason="queue_full")
    s.set(QUEUE_DEPTH, 9, queue="bus")
    pts = point_map(s)
    assert pts[("aaco_events_dropped", (("component", "source:a"), ("reason", "queue_full")))] == 2
    assert pts[("aaco_queue_depth", (("queue", "bus"),))] == 9
    assert pts[("aaco_stats_series_dropped", ())] == 0
    for p in s.points():
        assert tuple(p.labels) == p.metric.labels


def test_max_series_cap_counts_refused_series():
    s = Stats(max_series=2)
    s.inc(EVENTS_RECEIVED, 1, component="a")
    s.inc(EVENTS_RECEIVED, 1, component="b")
    s.inc(EVENTS_RECEIVED, 1, component="c")  # refused
    s.set(QUEUE_DEPTH, 1, queue="q")  # refused
    s.inc(EVENTS_RECEIVED, 1, component="a")  # existing series still updates
    assert s.get(EVENTS_RECEIVED, component="a") == 2
    assert s.get(EVENTS_RECEIVED, component="c") == 0
    pts = point_map(s)
    assert pts[(STATS_SERIES_DROPPED.prom_name, ())] == 2
    assert len([p for p in s.points() if p.metric is EVENTS_RECEIVED]) == 2


def test_existing_gauge_can_be_set_at_cap():
    s = Stats(max_series=1)
    s.set(QUEUE_DEPTH, 1, queue="bus")
    s.set(QUEUE_DEPTH, 5, queue="bus")
    assert s.get(QUEUE_DEPTH, queue="bus") == 5
    assert point_map(s)[(STATS_SERIES_DROPPED.prom_name, ())] == 0


def test_concurrent_increments_are_not_lost():
    s = Stats()

    def work():
        for _ in range(2000):
            s.inc(EVENTS_RECEIVED, 1, component="bus")

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert s.get(EVENTS_RECEIVED, component="bus") == 16000


def test_declare_creates_a_zero_series_once_and_never_resets_it():
    s = Stats()
    s.declare(EXPORT_ERRORS, exporter="lake")
    assert [(p.labels, p.value) for p in s.points() if p.metric is EXPORT_ERRORS] == [({"exporter": "lake"}, 0.0)]
    s.inc(EXPORT_ERRORS, 2, exporter="lake")
    s.declare(EXPORT_ERRORS, exporter="lake")
    assert s.get(EXPORT_ERRORS, exporter="lake") == 2


def test_declared_counters_are_on_metrics_from_the_start():
    from prometheus_client import CollectorRegistry, generate_latest

    from aaco.exporters.prometheus import PrometheusConfig, PrometheusExporter, _Collector

    stats = Stats()
    declare_components(stats, sources=["replay"], exporters=["lake", "otlp"])
    registry = CollectorRegistry()
    registry.register(_Collector(PrometheusExporter(PrometheusConfig(port=0), stats, "n1")))
    text = generate_latest(registry).decode()
    assert 'aaco_export_errors_total{exporter="lake"} 0.0' in text
    assert 'aaco_export_errors_total{exporter="otlp"} 0.0' in text
    for reason in SOURCE_ERROR_REASONS:
        assert f'aaco_source_errors_total{{reason="{reason}",source="replay"}} 0.0' in text
    for reason in SOURCE_DROP_REASONS:
        assert f'aaco_events_dropped_total{{component="source:replay",reason="{reason}"}} 0.0' in text


def test_counts_group_non_zero_series_by_labels():
    stats = Stats()
    stats.inc(EVENTS_DROPPED, 3, component="exporter:otlp", reason="shutdown")
    stats.inc(EVENTS_DROPPED, 2, component="forward:logs", reason="shutdown")
    stats.inc(EVENTS_DROPPED, 5, component="exporter:otlp", reason="queue_full")
    stats.declare(EVENTS_DROPPED, component="source:s", reason="shutdown")  # at 0: left out
    assert stats.counts(EVENTS_DROPPED, ("component",), reason="shutdown") == {
        ("exporter:otlp",): 3,
        ("forward:logs",): 2,
    }
    assert stats.counts(EVENTS_DROPPED, ("reason",)) == {("shutdown",): 5, ("queue_full",): 5}
