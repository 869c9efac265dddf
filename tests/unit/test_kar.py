"""Kernel amplification ratio: kernels per iteration over graph nodes, bands, weighting."""

from __future__ import annotations

import pytest

from aaco.analyzers.kar import GRAPH_NODES, KAR_RATIO, KERNELS_PER_ITERATION, KarAnalyzer, KarResult, kar_band

from .builders import NODE, assert_points_valid, item, iterations, kernels


def its(n: int, model: str | None = "m", graph_nodes: int | None = 100, optimized: int | None = None, node=NODE):
    return item(
        "iterations",
        iterations(
            [(i * 10, i * 10 + 5) for i in range(n)],
            model=model,
            node=node,
            graph_nodes=[graph_nodes] * n,
            graph_nodes_optimized=[optimized] * n,
        ),
    )


def correlated(n: int, model: str | None = "m", kind: str = "kernel", iteration: int | None = 0, node=NODE):
    return item(
        "kernels",
        kernels(
            list(range(n)),
            kind=[kind] * n,
            model=[model] * n,
            iteration=[iteration] * n,
            node=[node] * n,
        ),
    )


@pytest.mark.parametrize(
    ("value", "band"),
    [
        (None, None),
        (0.0, "good"),
        (1.0, "good"),
        (2.0, "good"),
        (2.0001, "investigate"),
        (5.0, "investigate"),
        (5.0001, "severe"),
        (40.0, "severe"),
    ],
)
def test_bands(value, band):
    assert kar_band(value) == band


def test_kar_is_kernels_per_iteration_over_graph_nodes():
    a = KarAnalyzer()
    a.update(its(2, graph_nodes=100, optimized=60))
    a.update(correlated(300))
    m = a.snapshot().models[(NODE, "m")]
    assert m.iterations == 2
    assert m.kernels == 300
    assert m.kernels_per_iteration == 150
    assert m.kar == pytest.approx(1.5)
    assert m.band == "good"
    assert m.graph_nodes == 100
    assert m.graph_nodes_optimized == 60
    assert m.kar_optimized == pytest.approx(2.5)


def test_only_correlated_kernel_kind_counts():
    a = KarAnalyzer()
    a.update(its(1, graph_nodes=10))
    a.update(correlated(30))
    a.update(correlated(7, kind="memcpy"))
    a.update(correlated(5, kind="memset"))
    a.update(correlated(11, model=None, iteration=None))  # not correlated
    a.update(correlated(13, iteration=None))  # a model but no iteration: not correlated either
    m = a.snapshot().models[(NODE, "m")]
    assert m.kernels == 30
    assert m.kar == pytest.approx(3.0)
    assert m.band == "investigate"


def test_kernels_mixed_in_one_batch():
    a = KarAnalyzer()
    a.update(its(2, graph_nodes=4))
    b = kernels(
        [1, 2, 3, 4, 5, 6],
        kind=["kernel", "kernel", "memcpy", "kernel", "kernel", "memset"],
        model=["m", "m", "m", None, "m", "m"],
        iteration=[0, 1, 0, None, 1, 1],
    )
    a.update(item("kernels", b))
    m = a.snapshot().models[(NODE, "m")]
    assert m.kernels == 3
    assert m.kernels_per_iteration == pytest.approx(1.5)
    assert m.kar == pytest.approx(0.375)


def test_no_graph_size_means_no_kar():
    a = KarAnalyzer()
    a.update(its(2, graph_nodes=None))
    a.update(correlated(10))
    m = a.snapshot().models[(NODE, "m")]
    assert m.kernels_per_iteration == 5
    assert m.kar is None
    assert m.band is None
    assert m.kar_optimized is None
    pts = a.snapshot().points()
    assert [p.metric for p in pts] == [KERNELS_PER_ITERATION]


def test_graph_size_kept_from_earlier_iterations():
    a = KarAnalyzer()
    a.update(its(1, graph_nodes=50))
    a.update(its(1, graph_nodes=None))
    a.update(correlated(100))
    m = a.snapshot().models[(NODE, "m")]
    assert m.graph_nodes == 50
    assert m.kar == pytest.approx(1.0)


def test_kernels_without_iterations_have_no_kar():
    a = KarAnalyzer()
    a.update(correlated(10))
    m = a.snapshot().models[(NODE, "m")]
    assert m.iterations == 0
    assert m.kernels_per_iteration is None
    assert m.kar is None
    assert a.snapshot().value is None


def test_value_is_iteration_weighted_across_models():
    a = KarAnalyzer()
    a.update(its(1, model="a", graph_nodes=10))
    a.update(correlated(10, model="a"))  # KAR 1.0, weight 1
    a.update(its(3, model="b", graph_nodes=10))
    a.update(correlated(120, model="b"))  # KAR 4.0, weight 3
    a.update(its(5, model="c", graph_nodes=None))  # no KAR: not in the value
    res = a.snapshot()
    assert res.value == pytest.approx((1.0 * 1 + 4.0 * 3) / 4)
    d = res.to_dict()
    assert set(d) == {"value", "band", "models"}
    assert d["value"] == pytest.approx(3.25)
    assert d["band"] == "investigate"
    assert set(d["models"]) == {"a", "b", "c"}
    assert d["models"]["b"]["kar"] == pytest.approx(4.0)


def test_value_single_model_and_empty():
    assert KarResult({}).value is None
    assert KarResult({}).to_dict() == {"value": None, "band": None, "models": {}}
    a = KarAnalyzer()
    a.update(its(2, graph_nodes=2))
    a.update(correlated(24))
    assert a.snapshot().value == pytest.approx(6.0)
    assert a.snapshot().to_dict()["band"] == "severe"


def test_null_model_iterations_are_unknown():
    a = KarAnalyzer()
    a.update(its(1, model=None, graph_nodes=10))
    assert (NODE, "unknown") in a.snapshot().models


def test_to_dict_keys_with_several_nodes():
    a = KarAnalyzer()
    a.update(its(1, node="n1"))
    a.update(its(1, node="n2"))
    assert set(a.snapshot().to_dict()["models"]) == {"n1/m", "n2/m"}


def test_max_models():
    a = KarAnalyzer(max_models=1)
    a.update(its(1, model="a"))
    a.update(its(1, model="b"))
    a.update(correlated(5, model="b"))
    assert set(a.snapshot().models) == {(NODE, "a")}


def test_points():
    a = KarAnalyzer()
    a.update(its(2, graph_nodes=100))
    a.update(correlated(300))
    pts = a.snapshot().points()
    assert_points_valid(pts)
    vals = {p.metric: p.value for p in pts}
    assert vals == {KAR_RATIO: pytest.approx(1.5), KERNELS_PER_ITERATION: 150, GRAPH_NODES: 100}
    assert all(dict(p.labels) == {"node": NODE, "model": "m"} for p in pts)


def test_max_models_bounds_kernel_only_models():
    a = KarAnalyzer(max_models=2)
    for m in "abcde":
        a.update(correlated(1, model=m))
    assert len(a.snapshot().models) <= 2


def test_light_resnet50_kar_over_running_nodes(resnet50):
    # The issue's figure: 59 kernels per iteration over light_resnet50's 176 running nodes (of 415) is 0.335.
    import onnx

    from aaco.agent.sources.ort.onnx_graph import summarize

    g = summarize(onnx.load(str(resnet50), load_external_data=False))
    a = KarAnalyzer()
    a.update(its(2, model="light_resnet50", graph_nodes=g.running_nodes, optimized=59))
    a.update(correlated(2 * 59, model="light_resnet50"))
    m = a.snapshot().models[(NODE, "light_resnet50")]
    assert (m.graph_nodes, m.kernels_per_iteration) == (176, 59)
    assert round(m.kar, 3) == 0.335
    assert m.kar_optimized == pytest.approx(1.0)
    assert "run" in KAR_RATIO.description and "run" in GRAPH_NODES.description
