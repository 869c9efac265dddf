"""Launch tax: microkernel fraction x launch rate / 1000, wall time, bands."""

from __future__ import annotations

import pytest

from aaco.analyzers.launch import (
    KERNELS_TOTAL,
    LAUNCH_RATE,
    LAUNCH_TAX,
    MICROKERNEL_RATIO,
    LaunchAnalyzer,
    launch_band,
)

from .builders import NODE, assert_points_valid, item, iterations, kernels

US = 1000
MS = 1_000_000


def kern(durations_us, start=0, gap_us=100, kind="kernel", model="m", run_id="r1", node=NODE):
    starts, ends, t = [], [], start
    for d in durations_us:
        starts.append(t)
        ends.append(t + round(d * US))
        t += gap_us * US
    n = len(starts)
    return item(
        "kernels",
        kernels(starts, ends, kind=[kind] * n, model=[model] * n, run_id=[run_id] * n, node=[node] * n),
        source="src",
    )


@pytest.mark.parametrize(
    ("value", "band"),
    [(None, None), (0.0, "healthy"), (0.999, "healthy"), (1.0, "elevated"), (4.999, "elevated"), (5.0, "severe")],
)
def test_bands(value, band):
    assert launch_band(value) == band


def test_launch_tax_with_iteration_wall_time():
    a = LaunchAnalyzer(microkernel_threshold_us=10)
    a.update(item("iterations", iterations([(0, 1 * MS), (5 * MS, 6 * MS)])))  # 2 ms of iterations
    a.update(kern([5, 9.999, 10, 50]))  # strictly shorter than 10 us: 2 micro
    a.update(kern([1, 1], kind="memcpy"))  # copies are not kernels
    g = a.snapshot().groups[(NODE, "m")]
    assert g.kernels == 4
    assert g.microkernels == 2
    assert g.microkernel_pct == pytest.approx(0.5)
    assert g.wall_s == pytest.approx(0.002)
    assert g.launch_rate_per_s == pytest.approx(2000.0)
    assert g.launch_tax == pytest.approx(0.5 * 2000.0 / 1000)
    assert g.band == "elevated"
    assert g.mean_kernel_us == pytest.approx((5 + 9.999 + 10 + 50) / 4)
    assert g.by_kind == {"kernel": 4, "memcpy": 2}


def test_threshold_is_configurable():
    a = LaunchAnalyzer(microkernel_threshold_us=60)
    a.update(item("iterations", iterations([(0, 1 * MS)])))
    a.update(kern([5, 9.999, 10, 50]))
    g = a.snapshot().groups[(NODE, "m")]
    assert g.microkernels == 4
    assert a.snapshot().to_dict()["microkernel_threshold_us"] == 60


def test_unknown_model_uses_sum_of_per_run_windows():
    a = LaunchAnalyzer()
    # run r1: 0 .. 1 ms, run r2: 5 ms .. 7 ms (the memcpy extends it); the 4 ms gap does not count
    a.update(kern([1000], start=0, model=None, run_id="r1"))
    a.update(kern([1000], start=5 * MS, model=None, run_id="r2"))
    a.update(kern([1000], start=6 * MS, model=None, run_id="r2", kind="memcpy"))
    g = a.snapshot().groups[(NODE, "unknown")]
    assert g.wall_s == pytest.approx(0.003)
    assert g.kernels == 2
    assert g.launch_rate_per_s == pytest.approx(2 / 0.003)
    assert g.microkernel_pct == 0.0
    assert g.launch_tax == 0.0
    assert g.band == "healthy"


def test_unknown_model_ignores_iterations_of_unknown_model():
    a = LaunchAnalyzer()
    a.update(item("iterations", iterations([(0, 100 * MS)], model=None)))
    a.update(kern([5, 5], model=None))  # window 0 .. 105 us
    g = a.snapshot().groups[(NODE, "unknown")]
    assert g.wall_s == pytest.approx(105e-6)


def test_null_run_id_falls_back_to_source_name():
    a = LaunchAnalyzer()
    b = kernels([0, 5 * MS], [1 * MS, 6 * MS], run_id=[None, None])
    a.update(item("kernels", b, source="s1"))
    b2 = kernels([100 * MS], [102 * MS], run_id=[None])
    a.update(item("kernels", b2, source="s2"))
    g = a.snapshot().groups[(NODE, "unknown")]
    assert g.wall_s == pytest.approx(0.006 + 0.002)


def test_known_model_without_iterations_falls_back_to_windows():
    a = LaunchAnalyzer()
    a.update(kern([5, 5, 5], gap_us=500))  # 0 .. 1005 us
    g = a.snapshot().groups[(NODE, "m")]
    assert g.wall_s == pytest.approx(1005e-6)
    assert g.microkernel_pct == 1.0
    assert g.launch_rate_per_s == pytest.approx(3 / 1005e-6)
    assert g.launch_tax == pytest.approx(3 / 1005e-6 / 1000)
    assert g.band == "elevated"


def test_severe_band_from_many_tiny_kernels():
    a = LaunchAnalyzer()
    a.update(item("iterations", iterations([(0, 1 * MS)])))
    a.update(kern([2] * 6, gap_us=0))  # 6 microkernels in a 1 ms iteration: 6 per ms
    g = a.snapshot().groups[(NODE, "m")]
    assert g.launch_tax == pytest.approx(6.0)
    assert g.band == "severe"


def test_no_kernels_means_no_tax():
    a = LaunchAnalyzer()
    a.update(item("iterations", iterations([(0, 1 * MS)])))
    g = a.snapshot().groups[(NODE, "m")]
    assert g.kernels == 0
    assert g.microkernel_pct is None
    assert g.launch_rate_per_s == 0.0
    assert g.launch_tax is None
    assert g.band is None
    assert g.mean_kernel_us is None


def test_iteration_time_accumulates_across_batches():
    a = LaunchAnalyzer()
    a.update(item("iterations", iterations([(0, 2 * MS)])))
    a.update(item("iterations", iterations([(10 * MS, 13 * MS)])))
    a.update(kern([50] * 10))
    g = a.snapshot().groups[(NODE, "m")]
    assert g.wall_s == pytest.approx(0.005)
    assert g.launch_rate_per_s == pytest.approx(2000.0)


def test_to_dict_and_points():
    a = LaunchAnalyzer()
    a.update(item("iterations", iterations([(0, 1 * MS)])))
    a.update(kern([5, 50]))
    a.update(kern([5], kind="memset"))
    d = a.snapshot().to_dict()
    assert set(d) == {"microkernel_threshold_us", "models"}
    assert d["microkernel_threshold_us"] == 10.0
    assert set(d["models"]) == {"m"}
    assert d["models"]["m"]["by_kind"] == {"kernel": 2, "memset": 1}
    pts = a.snapshot().points()
    assert_points_valid(pts)
    vals = {(p.metric, p.labels.get("kind")): p.value for p in pts}
    assert vals[(KERNELS_TOTAL, "kernel")] == 2.0
    assert vals[(KERNELS_TOTAL, "memset")] == 1.0
    assert vals[(LAUNCH_RATE, None)] == pytest.approx(2000.0)
    assert vals[(MICROKERNEL_RATIO, None)] == pytest.approx(0.5)
    assert vals[(LAUNCH_TAX, None)] == pytest.approx(1.0)


def test_several_nodes_in_to_dict():
    a = LaunchAnalyzer()
    a.update(kern([5], node="n1"))
    a.update(kern([5], node="n2"))
    assert set(a.snapshot().to_dict()["models"]) == {"n1/m", "n2/m"}


def test_max_groups_and_max_runs():
    a = LaunchAnalyzer(max_groups=1, max_runs=2)
    a.update(kern([5], model="a", run_id="r1"))
    a.update(kern([5], model="b"))
    assert set(a.snapshot().groups) == {(NODE, "a")}
    a.update(kern([5], start=10 * MS, model="a", run_id="r2"))
    a.update(kern([5], start=20 * MS, model="a", run_id="r3"))  # evicts r1's window
    g = a.snapshot().groups[(NODE, "a")]
    assert g.kernels == 3
    assert g.wall_s == pytest.approx(10e-6)
