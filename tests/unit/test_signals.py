"""Metric definitions, point building, the analysis snapshot and user-facing errors."""

from __future__ import annotations

import pytest

from aaco.analyzers.base import ratio
from aaco.analyzers.kar import KarAnalyzer
from aaco.analyzers.latency import LatencyAnalyzer
from aaco.contract.errors import AacoError, ConfigError
from aaco.contract.signals import LATENCY_BUCKETS, METRICS, PointBuilder, define
from aaco.contract.snapshot import AnalysisSnapshot

from .builders import NODE, assert_points_valid, item, iterations


def test_define_registers_once():
    a = define("test.unit.x", "test_unit_x", "gauge", "1", "x", ("node",))
    assert METRICS["test_unit_x"] is a
    assert define("test.unit.x", "test_unit_x", "gauge", "1", "x", ("node",)) == a
    with pytest.raises(ValueError, match="defined twice"):
        define("test.unit.x", "test_unit_x", "counter", "1", "x", ("node",))


def test_registered_metrics_follow_naming_rules():
    for name, m in METRICS.items():
        if name.startswith("test_"):
            continue
        assert name.startswith("aaco_"), name
        assert name == name.lower()
        assert not name.endswith("_total"), name  # counters get it on exposition
        assert m.description
        assert m.kind in ("gauge", "counter", "histogram")
        if m.kind == "histogram":
            assert m.buckets == tuple(sorted(m.buckets))


def test_latency_buckets_increase():
    assert list(LATENCY_BUCKETS) == sorted(set(LATENCY_BUCKETS))
    assert LATENCY_BUCKETS[0] == 0.0001
    assert LATENCY_BUCKETS[-1] == 60.0


def test_point_builder_checks_labels_and_stringifies():
    m = define("test.unit.y", "test_unit_y", "gauge", "1", "y", ("node", "gpu"))
    pb = PointBuilder()
    pb.add(m, 1.0, node="n", gpu=3)  # type: ignore[arg-type]
    assert dict(pb.points[0].labels) == {"node": "n", "gpu": "3"}
    with pytest.raises(ValueError, match="test_unit_y"):
        pb.add(m, 1.0, node="n")
    with pytest.raises(ValueError):
        pb.add(m, 1.0, node="n", gpu="0", extra="x")


def test_ratio():
    assert ratio(1, 4) == 0.25
    assert ratio(1, 0) is None
    assert ratio(1, -1) is None


def test_analysis_snapshot_to_dict_and_points():
    lat, kar = LatencyAnalyzer(), KarAnalyzer()
    b = item("iterations", iterations([(0, 1_000_000)], graph_nodes=[10]))
    lat.update(b)
    kar.update(b)
    snap = AnalysisSnapshot(42, NODE, {"latency": lat.snapshot(), "kar": kar.snapshot()})
    d = snap.to_dict()
    assert list(d) == ["generated_at_ns", "node", "latency", "kar", "findings"]
    assert d["findings"] == []
    assert d["generated_at_ns"] == 42
    assert d["node"] == NODE
    assert set(d["kar"]) == {"value", "band", "models"}
    pts = list(snap.points())
    assert_points_valid(pts)
    # one iteration without kernels: 0 kernels per iteration, KAR 0
    assert {p.metric.prom_name: p.value for p in pts if p.metric.kind == "gauge"} == {
        "aaco_iteration_throughput_per_second": pytest.approx(1000.0),
        "aaco_kar_ratio": 0.0,
        "aaco_kernels_per_iteration": 0.0,
        "aaco_model_graph_nodes": 10,
    }
    assert [p.metric.prom_name for p in pts if p.metric.kind == "histogram"] == ["aaco_iteration_latency_seconds"]


def test_aaco_error_str():
    assert str(AacoError("bad")) == "bad"
    assert str(AacoError("bad", subject="f.json")) == "f.json: bad"
    assert str(AacoError("bad", subject="f.json", hint="fix it")) == "f.json: bad (fix it)"


def test_config_error_lists_problems():
    e = ConfigError(None, ["a: x", "b: y"])
    assert e.problems == ["a: x", "b: y"]
    assert str(e).splitlines() == ["<config>: 2 error(s) in configuration", "  <config>: a: x", "  <config>: b: y"]
    assert isinstance(e, AacoError)
