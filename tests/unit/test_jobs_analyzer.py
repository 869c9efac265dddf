"""The jobs analyzer: HTA 0.5.0's per-rank figures and stragglers, streamed, bounded, on /metrics.

HTA's own functions are the oracle where they can be called on small frames (its interval merge,
kernel types, straggler selection); tests/integration/test_jobs_hta.py runs HTA whole on real traces.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aaco.analyzers.intervals import merge_groups, overlap_sweep
from aaco.analyzers.jobs import JobsAnalyzer, JobsSettings
from aaco.analyzers.jobs_hta import COMMUNICATION, COMPUTATION, MEMORY, OTHER, RankWindow, kernel_type
from aaco.analyzers.jobs_result import (
    BUS_BANDWIDTH,
    CRITICAL_SECONDS,
    CRITICAL_SHARE,
    DROPPED,
    OVERLAP,
    STEP_SECONDS,
    STRAGGLER,
    TIME_RATIO,
)
from aaco.analyzers.jobs_stragglers import StepData, find_stragglers, undominated
from aaco.analyzers.registry import AgentHints, AnalyzersConfig, build
from aaco.contract.signals import METRICS
from tests.conftest import skip_or_fail

from .builders import assert_points_valid, item, iterations, kernels

# HTA 0.5 uses pandas' inplace keyword, which newer pandas deprecates: not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:The inplace keyword")

US = 1000
COMM = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"
GEMM = "ampere_sgemm_128x64_tn"


def hta_utils():
    try:
        from hta.utils import utils
    except ImportError as e:  # pragma: no cover - depends on the environment
        skip_or_fail(f"holistictraceanalysis is not installed ({e}); bash .ci/setup --test installs it")
    return utils


# -- HTA's interval arithmetic ---------------------------------------------------------------------

distinct_starts = st.lists(st.integers(0, 400), unique=True, max_size=30).flatmap(
    lambda starts: st.tuples(st.just(starts), st.lists(st.integers(-3, 60), min_size=len(starts), max_size=len(starts)))
)


@settings(max_examples=150, deadline=None)
@given(distinct_starts)
def test_merge_groups_is_htas_merge_kernel_intervals(data):
    """Inverted intervals (HTA's rounding of sub-microsecond events) too; starts distinct (HTA's sort is unstable)."""
    utils = hta_utils()
    starts, durs = data
    if not starts:
        return
    lo = np.array(starts, np.int64)
    hi = lo + np.array(durs, np.int64)
    theirs = utils.merge_kernel_intervals(pd.DataFrame({"ts": lo, "dur": hi - lo}))
    glo, ghi = merge_groups(lo, hi)
    assert glo.tolist() == theirs["ts"].tolist()
    assert ghi.tolist() == theirs["end"].tolist()


proper = st.lists(st.tuples(st.integers(0, 300), st.integers(0, 40)).map(lambda t: (t[0], t[0] + t[1])), max_size=25)


@settings(max_examples=150, deadline=None)
@given(proper, proper)
def test_overlap_sweep_is_the_time_both_sets_run(a, b):
    def cells(ivs):
        return {t for s, e in ivs for t in range(s, e)}

    def groups(ivs):
        return merge_groups(np.array([s for s, _ in ivs], np.int64), np.array([e for _, e in ivs], np.int64))

    assert overlap_sweep(*groups(a), *groups(b)) == len(cells(a) & cells(b))


def test_kernel_types_are_htas():
    utils = hta_utils()
    names = [
        COMM,
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "Memcpy DtoH (Device -> Pageable)",
        "Memset (Device)",
        "dma_copy",
        GEMM,
        "void at::native::vectorized_elementwise_kernel<4>(int)",
        "cudaDeviceSynchronize",
        "Event Sync",
        "my_Memcpy_kernel",
        "nccl_something",
    ]
    expected = {"COMMUNICATION": COMMUNICATION, "MEMORY": MEMORY, "COMPUTATION": COMPUTATION, "OTHER": OTHER}
    assert [kernel_type(n) for n in names] == [expected[utils.get_kernel_type(n)] for n in names]
    assert {kernel_type(n) for n in names} == {COMMUNICATION, MEMORY, COMPUTATION, OTHER}


def test_a_sealed_window_gives_the_same_figures():
    rng = np.random.default_rng(7)
    lo = np.sort(rng.integers(0, 100_000, 3000))
    hi = lo + rng.integers(1, 80, lo.size)
    types = rng.choice(np.array([COMMUNICATION, COMPUTATION, MEMORY], np.int8), lo.size)
    whole, sealed = RankWindow(), RankWindow(max_groups=16)
    for cut in range(0, lo.size, 250):
        part = slice(cut, cut + 250)
        whole.fold(lo[part], hi[part], types[part])
        sealed.fold(lo[part], hi[part], types[part])
    assert sealed.sealed["all"] > 0 and sealed.late == 0
    assert sealed.figures() == whole.figures()


collectives = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50), st.integers(-1, 30)), max_size=40)


@settings(max_examples=150, deadline=None)
@given(collectives)
def test_thinning_a_batch_keeps_every_possible_last_collective(rows):
    """HTA takes, per key, the last collective lasting at least a threshold that depends on every rank."""
    keys = np.array([k for k, _, _ in rows], np.int64)
    start = np.array([s for _, s, _ in rows], np.int64)
    dur = np.array([d for _, _, d in rows], np.int64)
    keep = undominated(keys, start, dur)
    every, thinned = StepData("r"), StepData("r")
    for i, (k, s, d) in enumerate(rows):
        every.collective(1, str(k), s, d, i)
        if keep[i]:
            thinned.collective(1, str(k), s, d, i)
    for k in range(3):
        for threshold in range(-1, 32):
            last = max(((s, i, d) for i, (kk, s, d) in enumerate(rows) if kk == k and d >= threshold), default=None)
            expected = None if last is None else (last[0], last[2])
            assert every.last_collective((1, str(k)), threshold) == expected
            assert thinned.last_collective((1, str(k)), threshold) == expected


# -- the analyzer ----------------------------------------------------------------------------------


def steps(analyzer: JobsAnalyzer, spans, numbers, job="j", rank=0, run="r0") -> None:
    b = iterations(spans, run_id=run, iteration=numbers, job=[job] * len(spans), rank=[rank] * len(spans))
    analyzer.update(item("iterations", b))


def work(analyzer: JobsAnalyzer, rows, job="j", rank=0, run="r0", **extra) -> None:
    """rows: (launch_ns, start_ns, end_ns, name, iteration)."""
    n = len(rows)
    b = kernels(
        [r[1] for r in rows],
        [r[2] for r in rows],
        launch_start_ns=[r[0] for r in rows],
        name=[r[3] for r in rows],
        iteration=[r[4] for r in rows],
        run_id=[run] * n,
        job=[job] * n,
        rank=[rank] * n,
        stream=extra.pop("stream", [7] * n),
        **extra,
    )
    analyzer.update(item("kernels", b))


def rank_view(analyzer: JobsAnalyzer, rank=0, job="j"):
    view = next(j for j in analyzer.snapshot().jobs if j.job == job)
    return next(r for r in view.ranks if r.rank == rank)


def test_the_last_step_stays_out_until_another_starts():
    a = JobsAnalyzer()
    steps(a, [(0, 100 * US), (100 * US, 200 * US)], [1, 2])
    work(a, [(10 * US, 20 * US, 60 * US, GEMM, 1), (120 * US, 130 * US, 190 * US, GEMM, 2)])
    f = rank_view(a).figures
    assert (f.kernel_time_us, f.compute_time_us, f.idle_time_us, f.kernels) == (40, 40, 0, 1)
    steps(a, [(200 * US, 300 * US)], [3])
    f = rank_view(a).figures
    assert (f.kernel_time_us, f.compute_time_us, f.idle_time_us, f.kernels) == (170, 100, 70, 2)


def test_with_one_step_everything_counts_and_arrival_order_does_not_matter():
    first_steps, first_work = JobsAnalyzer(), JobsAnalyzer()
    rows = [(5 * US, 10 * US, 30 * US, GEMM, 1), (6 * US, 20 * US, 50 * US, COMM, 1)]
    steps(first_steps, [(0, 100 * US)], [1])
    work(first_steps, rows)
    work(first_work, rows)
    steps(first_work, [(0, 100 * US)], [1])
    for a in (first_steps, first_work):
        f = rank_view(a).figures
        assert (f.kernel_time_us, f.compute_time_us, f.non_compute_time_us, f.idle_time_us) == (40, 20, 20, 0)
        assert (f.comm_time_us, f.overlap_time_us, f.overlap_ratio) == (30, 10, pytest.approx(1 / 3))


def test_whole_microseconds_as_hta_rounds_them():
    """Starts up, ends down: 1.5-3.2 us is 2-3 us; a 0.4 us kernel inside one microsecond is -1 us, as in HTA."""
    a = JobsAnalyzer()
    work(a, [(0, 1500, 3200, GEMM, None), (0, 10_300, 10_700, "Memset (Device)", None)])
    f = rank_view(a).figures
    assert (f.kernel_time_us, f.compute_time_us, f.idle_time_us, f.non_compute_time_us) == (8, 1, 8, -1)


def test_step_time_is_the_median_of_the_ranks_steps():
    a = JobsAnalyzer()
    steps(a, [(0, 100 * US), (100 * US, 400 * US), (400 * US, 600 * US)], [1, 2, 3])
    assert rank_view(a).step_p50_s == pytest.approx(200e-6)


def test_critical_path_shares_weigh_each_step_by_its_length():
    """Summed bound time over summed length: a 300 us step counts three times a 100 us one; no path, no figure."""
    a = JobsAnalyzer()
    paths = {
        "cp_length_ns": [100 * US, 300 * US, None],
        "cp_cpu_ns": [100 * US, 0, None],
        "cp_compute_ns": [0, 150 * US, None],
        "cp_comm_ns": [0, 60 * US, None],
        "cp_launch_ns": [0, 30 * US, None],
        "cp_gap_ns": [0, 60 * US, None],
    }
    b = iterations(
        [(0, 100 * US), (100 * US, 400 * US), (400 * US, 500 * US)],
        run_id="r0",
        iteration=[1, 2, 3],
        job=["j"] * 3,
        rank=[0] * 3,
        **paths,
    )
    a.update(item("iterations", b))
    cp = rank_view(a).critical
    assert (cp.steps, cp.length_p50_s) == (2, pytest.approx(200e-6))
    assert cp.shares == pytest.approx({"cpu": 0.25, "compute": 0.375, "comm": 0.15, "launch": 0.075, "gap": 0.15})
    assert sum(cp.shares.values()) == pytest.approx(1)
    points = a.snapshot().points()
    assert_points_valid(points)
    shares = {p.labels["bound"]: p.value for p in points if p.metric is CRITICAL_SHARE}
    assert shares == cp.shares
    assert [p.value for p in points if p.metric is CRITICAL_SECONDS] == [pytest.approx(200e-6)]
    assert rank_view(a).to_dict()["critical_path"]["cpu_pct"] == pytest.approx(25)

    steps(a, [(0, 100 * US)], [1], rank=1)  # a rank without paths: no critical path series
    assert rank_view(a, rank=1).critical is None
    assert {p.labels["rank"] for p in a.snapshot().points() if p.metric is CRITICAL_SECONDS} == {"0"}


def hta_straggler_oracle():
    try:
        from hta.analyzers.straggler import find_stragglers_with_late_start_comm_kernels
        from hta.common.trace_symbol_table import TraceSymbolTable
    except ImportError as e:  # pragma: no cover - depends on the environment
        skip_or_fail(f"holistictraceanalysis is not installed ({e})")
    return find_stragglers_with_late_start_comm_kernels, TraceSymbolTable


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("k", [1, 2, 3])
def test_stragglers_are_htas(seed: int, k: int):
    """Random jobs of 3-6 ranks and 1-3 steps with two collectives a step: ours against HTA's own functions."""
    find, symbol_table = hta_straggler_oracle()
    rng = np.random.default_rng(seed)
    n_ranks, n_steps = int(rng.integers(3, 7)), int(rng.integers(1, 4))
    names = [COMM, "ncclKernel_AllGather_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)"]
    table = symbol_table()
    table.add_symbols([*names, "ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3", GEMM])
    sym = table.get_sym_id_map()
    rows, ours = [], {}
    for rank in range(n_ranks):
        ours[rank] = {}
        for step in range(1, n_steps + 1):
            base = step * 10_000
            data = ours[rank][step] = StepData("r")
            data.span(base, base + 9_000, 9_000_000)
            rows.append((rank, step, base, 9_000, -1, f"ProfilerStep#{step}"))
            for i, name in enumerate(names):
                start = base + 1_000 + 4_000 * i + int(rng.integers(0, 2_000))
                dur = int(rng.integers(50, 1_500))
                data.work(start, start + dur)
                data.collective(20 + i, name, start, dur, len(rows))
                rows.append((rank, step, start, dur, 20 + i, name))
    df = pd.DataFrame(rows, columns=["rank", "iteration", "ts", "dur", "stream", "name"])
    df["name"] = df["name"].map(sym)
    series = find(df, table, k)
    theirs = series.sort_values(ascending=False)[:k].index.tolist()
    counts = {int(r): int(c) for r, c in series.items()}
    found = find_stragglers(ours, k)
    assert found is not None
    assert dict(found.counts) == counts
    # Where ranks tie on the k-th count, HTA's pick among them follows numpy's unstable sort (it varies
    # with the CPU's sort kernels); AACO takes the lower ranks. Either way: every rank counted more than
    # the k-th, then ranks of exactly that count.
    kth = sorted(counts.values(), reverse=True)[min(k, len(counts)) - 1]
    for picked in (theirs, list(found.stragglers)):
        assert len(picked) == min(k, len(counts))
        assert {r for r, c in counts.items() if c > kth} <= set(picked)
        assert all(counts[r] >= kth for r in picked)
    tied = sorted(r for r, c in counts.items() if c == kth)
    assert list(found.stragglers) == sorted(found.stragglers, key=lambda r: (-counts[r], r))
    if len(tied) + sum(1 for c in counts.values() if c > kth) == min(k, len(counts)):
        assert set(found.stragglers) == set(theirs)  # no tie across the cut: the same ranks


def test_stragglers_live_on_metrics_with_their_window():
    """Four ranks; rank 2's all_reduce starts last in every step: with k=1 it alone straggles."""
    a = JobsAnalyzer(JobsSettings(stragglers=1, window_steps=3))
    for rank in range(4):
        spans = [(s * 1000 * US, (s + 1) * 1000 * US) for s in range(1, 6)]
        steps(a, spans, [1, 2, 3, 4, 5], rank=rank)
        late = 300 if rank == 2 else 10 * rank
        rows = [(s * 1000 * US, (s * 1000 + 100 + late) * US, (s * 1000 + 900) * US, COMM, s) for s in range(1, 6)]
        rows += [(s * 1000 * US + 1, (s * 1000 + 10) * US, (s * 1000 + 90) * US, GEMM, s) for s in range(1, 6)]
        work(a, rows, rank=rank, stream=[9] * len(rows))
    job = a.snapshot().jobs[0]
    assert job.stragglers.stragglers == (2,)
    assert job.stragglers.steps == (2, 3, 4)  # the three most recent complete steps (5 is the last)
    points = a.snapshot().points()
    assert_points_valid(points)
    flags = {p.labels["rank"]: p.value for p in points if p.metric is STRAGGLER}
    assert flags == {"0": 0.0, "1": 0.0, "2": 1.0, "3": 0.0}
    by_metric = {p.metric.prom_name for p in points}
    assert {TIME_RATIO.prom_name, OVERLAP.prom_name, STEP_SECONDS.prom_name, DROPPED.prom_name} <= by_metric
    for p in points:
        if p.metric is TIME_RATIO or p.metric is OVERLAP:
            assert 0.0 <= p.value <= 1.0
    assert sorted(p.labels["state"] for p in points if p.metric is TIME_RATIO and p.labels["rank"] == "0") == [
        "compute",
        "idle",
        "non_compute",
    ]


def test_one_rank_has_no_straggler_series():
    a = JobsAnalyzer()
    steps(a, [(0, 100 * US), (100 * US, 200 * US)], [1, 2])
    work(a, [(1 * US, 10 * US, 50 * US, COMM, 1)], stream=[9])
    assert a.snapshot().jobs[0].stragglers is None
    assert not [p for p in a.snapshot().points() if p.metric is STRAGGLER]


def test_bus_bandwidth_per_job_and_operation():
    a = JobsAnalyzer()
    steps(a, [(0, 10_000 * US)], [1])
    work(
        a,
        [(0, 100 * US, 1100 * US, COMM, 1), (0, 2000 * US, 3000 * US, COMM, 1)],
        collective=["all_reduce", "all_reduce"],
        collective_bytes=[1_000_000, 3_000_000],
        collective_group_size=[4, 4],
    )
    job = a.snapshot().jobs[0]
    # nccl-tests: all_reduce's bus factor 2(n-1)/n = 1.5; 4 MB in 2 ms
    assert job.bus_bandwidth == {"all_reduce": pytest.approx(4e6 / 2e-3 * 1.5)}
    [point] = [p for p in a.snapshot().points() if p.metric is BUS_BANDWIDTH]
    assert dict(point.labels) == {"job": "j", "op": "all_reduce"}


def test_caps_drop_and_count_and_quiet_ones_make_room():
    a = JobsAnalyzer(JobsSettings(max_jobs=1, max_ranks=1, forget_after_s=1.0))
    work(a, [(0, 0, 10 * US, GEMM, None)], job="a")
    work(a, [(0, 0, 10 * US, GEMM, None)], job="b")
    work(a, [(0, 0, 10 * US, GEMM, None), (0, 0, 20 * US, GEMM, None)], job="a", rank=1)
    b = kernels([0], [10 * US], job=["a"], rank=pa_null())
    a.update(item("kernels", b))
    result = a.snapshot()
    assert [j.job for j in result.jobs] == ["a"] and [r.rank for r in result.jobs[0].ranks] == [0]
    assert result.dropped == {"max_jobs": 1, "max_ranks": 2, "no_rank": 1, "max_pending": 0}
    # job a quiet for more than a second of trace time: job c takes its place
    work(a, [(0, 2_000_000 * US, 2_000_010 * US, GEMM, None)], job="c")
    assert [j.job for j in a.snapshot().jobs] == ["c"]
    assert a.snapshot().dropped["max_jobs"] == 1


def pa_null():
    import pyarrow as pa

    return pa.array([None], pa.int64())


def test_job_and_rank_label_job_series_only():
    # and the per-GPU series, whose job is the Slurm job on the GPU (one series per GPU: docs/jobs.md, "Slurm")
    for name, m in METRICS.items():
        if "rank" in m.labels:
            assert name.startswith("aaco_job_"), name
        if "job" in m.labels:
            assert name.startswith("aaco_job_") or (name.startswith("aaco_gpu_") and "gpu" in m.labels), name


def test_registered_with_its_settings():
    config = AnalyzersConfig.model_validate({"jobs": {"stragglers": 3, "max_jobs": 2}})
    [jobs] = [a for a in build(config, AgentHints()) if a.name == "jobs"]
    assert isinstance(jobs, JobsAnalyzer)
    assert jobs._s.stragglers == 3 and jobs._s.max_jobs == 2
