"""The roofline analyzer on rocprof-compute's real vcopy workload: families, intensities, rates, placement."""

from __future__ import annotations

from pathlib import Path

import pytest

from aaco.agent.sources.counters import to_table
from aaco.agent.sources.counters.rocprof_compute import read_peaks, read_pmc_perf
from aaco.analyzers.roofline import RooflineAnalyzer, RooflineSettings
from aaco.contract.kernels import family_of
from aaco.contract.roofline import kernel_work
from aaco.contract.schemas import EventBatch

VCOPY = Path(__file__).resolve().parents[1] / "data" / "rocprof-compute" / "vcopy" / "MI200"


def batches(chunk: int) -> list[EventBatch]:
    rows = [r for d in read_pmc_perf(VCOPY / "pmc_perf.csv") for r in d.rows()]
    return [
        EventBatch("counters", to_table(rows[i : i + chunk], "node-a", "counters", "gfx90a", 1), "counters")
        for i in range(0, len(rows), chunk)
    ]


@pytest.mark.parametrize("chunk", [100_000, 777])  # one batch, or dispatches split across batches
def test_the_family_s_work_is_the_kernel_s_and_it_is_placed_under_the_measured_roof(chunk: int):
    peaks = read_peaks(VCOPY / "roofline.csv")["0"]
    a = RooflineAnalyzer(RooflineSettings(peaks={"gfx90a": peaks}))
    for b in batches(chunk):
        a.update(b)
    ((node, model, arch, w, where),) = a.snapshot().families
    (expected,) = kernel_work(read_pmc_perf(VCOPY / "pmc_perf.csv"), "MI200", 32)
    assert (node, model, arch, w.kernel) == ("node-a", "", "gfx90a", family_of(expected.kernel))
    assert (w.calls, w.hbm_bytes, w.l2_bytes, w.total_duration_ns) == (
        expected.calls,
        pytest.approx(expected.hbm_bytes),
        expected.l2_bytes,
        expected.total_duration_ns,
    )
    assert where is not None and where.bound == "memory"
    assert where.roof_fraction == pytest.approx(15072341.333333334 / 17440 / 1388.9302)
    points = {
        (p.metric.prom_name, p.labels.get("level", p.labels.get("bound", ""))): p.value for p in a.snapshot().points()
    }
    assert points[("aaco_kernel_family_arithmetic_intensity", "hbm")] == 0.0
    assert points[("aaco_kernel_family_hbm_bandwidth_bytes_per_second", "")] == pytest.approx(
        15072341.333333334 / 17440 * 1e9
    )
    assert points[("aaco_kernel_family_roof_fraction", "memory")] == pytest.approx(where.roof_fraction)


def test_without_peaks_nothing_is_placed_and_old_dispatches_are_dropped():
    a = RooflineAnalyzer(RooflineSettings(max_dispatches=2))
    for b in batches(100_000):
        a.update(b)
    ((_, _, _, w, where),) = a.snapshot().families
    assert where is None and w.calls == 2  # the two most recent of three


def test_the_bottleneck_class_reads_the_model_s_placed_kernels():
    """Where counters placed a model's families, compute_kernel_pct / memory_bound_kernel_pct are the roofline's."""
    from aaco.analyzers.bottleneck import BottleneckAnalyzer

    peaks = read_peaks(VCOPY / "roofline.csv")["0"]
    rows = [r for d in read_pmc_perf(VCOPY / "pmc_perf.csv") for r in d.rows()]
    a = RooflineAnalyzer(RooflineSettings(peaks={"gfx90a": peaks}))
    a.update(EventBatch("counters", to_table(rows, "node-a", "counters", "gfx90a", 1, "vcopy"), "counters"))
    result = a.snapshot()
    assert result.placed_shares("node-a", "vcopy") == (0.0, 1.0)  # the copy kernel: all its time memory-bound
    assert result.placed_shares("node-a", "other") is None
    signals = BottleneckAnalyzer().signals(("node-a", "vcopy"), {"roofline": result})
    assert (signals["compute_kernel_pct"], signals["memory_bound_kernel_pct"]) == (0.0, 1.0)
    assert "memory_bound_kernel_pct" not in BottleneckAnalyzer().signals(("node-a", "other"), {"roofline": result})


def test_the_regression_verdict_names_the_family_whose_bandwidth_changed():
    from aaco.analyzers.verdict import compare

    rows = [r for d in read_pmc_perf(VCOPY / "pmc_perf.csv") for r in d.rows()]
    a = RooflineAnalyzer()
    a.update(EventBatch("counters", to_table(rows, "node-a", "counters", "gfx90a", 1, "vcopy"), "counters"))
    families = a.snapshot().model_families("vcopy")
    (family,) = families
    assert families[family]["hbm_bytes_per_s"] == pytest.approx(15072341.333333334 / 17440 * 1e9)
    slower = {family: {**families[family], "hbm_bytes_per_s": families[family]["hbm_bytes_per_s"] * 0.6}}
    lat = [0.010] * 30
    base = {"latency_s": lat, "roofline": families}
    session = {"latency_s": [0.013] * 30, "roofline": slower}
    v = compare(base, session)
    (change,) = v["roofline_changes"]
    assert change["family"] == family and change["hbm_bytes_per_s"]["delta_pct"] == pytest.approx(-40.0)
    assert (
        v["evidence"]["roofline_change"] == f"{family}: HBM bandwidth -40%, arithmetic intensity n/a"
    )  # 0 FLOP/byte both times
    assert compare(base, {"latency_s": lat, "roofline": families})["roofline_changes"] == []  # nothing moved
