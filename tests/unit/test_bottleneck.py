"""The bottleneck analyzer on scenarios whose answer is known from first principles.

Each scenario is a stream of events the agent's own analyzers (``service.build_analyzers``) fold in,
as the pipeline would; the bottleneck analyzer then derives the class from their results. The
reason each answer is right is written beside it.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from aaco.agent.config import AgentConfig
from aaco.agent.pipeline.bus import Bus
from aaco.agent.pipeline.correlator import Correlator
from aaco.agent.pipeline.worker import Pipeline
from aaco.agent.service import build_analyzers
from aaco.analyzers.bottleneck import BOTTLENECK_CLASS, BOTTLENECK_CONFIDENCE, BottleneckAnalyzer
from aaco.analyzers.bottleneck_rules import CLASSES
from aaco.contract import sched as rows
from aaco.contract import telemetry as tm
from aaco.contract.ids import span_id, trace_id
from aaco.contract.schemas import EventBatch, conform
from aaco.contract.stats import Stats

from .builders import assert_points_valid

NODE, MODEL, PID = "n1", "m", 100
MS, US = 1_000_000, 1_000
T0 = 1_700_000_000 * 1_000_000_000
GEMM = "Cijk_Ailk_Bljk_HHS_BH_MT128x128x32_MI32x32x8x1_SN_K1"
ELEMENTWISE = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
CONV = "void cudnn::winograd::generateWinogradTilesKernel<0, float, float>"


def iterations(n: int, length_ns: int, run: str = "r1", model: str = MODEL) -> pa.RecordBatch:
    """``n`` back-to-back iterations of ``length_ns``."""
    starts = [T0 + i * length_ns for i in range(n)]
    return conform(
        "iterations",
        {
            "start_ns": pa.array(starts, pa.int64()),
            "end_ns": pa.array([s + length_ns for s in starts], pa.int64()),
            "node": [NODE] * n,
            "pid": pa.array([PID] * n, pa.int64()),
            "model": [model] * n,
            "run_id": [run] * n,
            "trace_id": [trace_id(NODE, run, i) for i in range(n)],
            "span_id": [span_id(NODE, run, i) for i in range(n)],
            "source": ["test"] * n,
            "iteration": pa.array(range(n), pa.int64()),
        },
    )


def kernels(
    starts: np.ndarray,
    durations: np.ndarray,
    names: list[str],
    kinds: list[str],
    iteration: np.ndarray,
    run: str = "r1",
    launch_us: float | None = None,
    model: str = MODEL,
) -> pa.RecordBatch:
    """Kernels as the correlator leaves them: with model, run, iteration and trace IDs."""
    n = len(starts)
    cols: dict[str, object] = {
        "start_ns": pa.array(starts, pa.int64()),
        "end_ns": pa.array(starts + durations, pa.int64()),
        "node": [NODE] * n,
        "pid": pa.array([PID] * n, pa.int64()),
        "tid": pa.array([PID] * n, pa.int64()),
        "device": ["0"] * n,
        "stream": pa.array([7] * n, pa.int64()),
        "name": names,
        "kind": kinds,
        "correlation_id": pa.array(range(n), pa.int64()),
        "source": ["test"] * n,
        "model": [model] * n,
        "run_id": [run] * n,
        "iteration": pa.array(iteration, pa.int64()),
        "trace_id": [trace_id(NODE, run, int(i)) for i in iteration],
    }
    if launch_us is not None:  # the launch call ends 0.5 us before the kernel starts
        cols["launch_end_ns"] = pa.array(starts - 500, pa.int64())
        cols["launch_start_ns"] = pa.array(starts - 500 - int(launch_us * US), pa.int64())
    return conform("kernels", cols)


def telemetry(util: float, clock_hz: float, clock_max_hz: float, throttle: float = 0.0, ts: int = T0) -> pa.RecordBatch:
    """One sample of GPU 0: utilisation, compute clock and its maximum, a power throttle flag."""
    sample = tm.GpuSample(tm.GpuIdentity("0", model="AMD Instinct MI250X", vendor="amd"))
    sample.add(tm.UTILIZATION, util)
    sample.add(tm.CLOCK, clock_hz, clock="graphics")
    sample.add(tm.CLOCK_MAX, clock_max_hz, clock="graphics")
    sample.add(tm.THROTTLE, throttle, reason="power")
    return conform("telemetry", tm.to_table([sample], ts_ns=ts, node=NODE, source="smi"))


def sched(interference: float, involuntary: int, voluntary: int, ts: int = T0 + 1_000 * MS) -> pa.RecordBatch:
    """One 1 s drain of the model's process: one thread, on CPU half the time, runnable-waiting ``interference``."""
    s = 1_000_000_000
    deltas = rows.ThreadDeltas(
        np.array([PID], dtype=np.int64),
        np.array([PID], dtype=np.int64),
        ["python"],
        {
            rows.ONCPU: np.array([s // 2], dtype=np.int64),
            rows.RQ_WAIT: np.array([int(interference * s)], dtype=np.int64),
            rows.RQ_WAITS: np.array([involuntary], dtype=np.int64),
            rows.INVOLUNTARY: np.array([involuntary], dtype=np.int64),
            rows.VOLUNTARY: np.array([voluntary], dtype=np.int64),
        },
    )
    return conform(
        "sched", rows.drain_to_table(rows.Drain(ts_ns=ts, interval_ns=s, threads=deltas), node=NODE, source="s")
    )


def classify(*batches: tuple[str, pa.RecordBatch]) -> dict:
    """Feed the batches through the agent's analyzers; the bottleneck result of the model."""
    stats = Stats()
    p = Pipeline(Bus(stats), Correlator(stats), build_analyzers(AgentConfig(node=NODE)), [], stats, NODE)
    for kind, b in batches:
        p.dispatch(EventBatch(kind, b, "test"))
    result = p.snapshot().results["bottleneck"]
    return result.to_dict()["models"][MODEL]


def launch_bound() -> list[tuple[str, pa.RecordBatch]]:
    """5 iterations of 10 ms; each launches 2,000 elementwise kernels of 2 us, one every 5 us, each
    after a 4 us launch call. The GPU can only run what the CPU issues: 2 us of work per 5 us of
    launching, so the device idles 60 % of the time while the host spends 80 % of it in launch
    calls — the definition of launch-bound."""
    n_it, per = 5, 2000
    it = np.repeat(np.arange(n_it), per)
    starts = T0 + it * 10 * MS + np.tile(np.arange(per) * 5 * US, n_it)
    return [
        ("iterations", iterations(n_it, 10 * MS)),
        (
            "kernels",
            kernels(starts, np.full(it.size, 2 * US), [ELEMENTWISE] * it.size, ["kernel"] * it.size, it, launch_us=4.0),
        ),
    ]


def memory_bound() -> list[tuple[str, pa.RecordBatch]]:
    """20 iterations of 10 ms: a 6 ms host-to-device copy, then 30 elementwise kernels of 100 us.
    The device is busy 90 % of the time and two thirds of that only copies; the kernels are
    bandwidth-bound elementwise work. Nothing computes: memory-bound."""
    n_it = 20
    starts, durs, names, kinds, its = [], [], [], [], []
    for i in range(n_it):
        base = T0 + i * 10 * MS
        starts.append(base), durs.append(6 * MS), names.append("Memcpy HtoD (Pageable -> Device)")
        kinds.append("memcpy"), its.append(i)
        for j in range(30):
            starts.append(base + 6 * MS + j * 100 * US), durs.append(100 * US), names.append(ELEMENTWISE)
            kinds.append("kernel"), its.append(i)
    return [
        ("iterations", iterations(n_it, 10 * MS)),
        ("kernels", kernels(np.array(starts), np.array(durs), names, kinds, np.array(its))),
    ]


def compute_bound(gemm_us: int = 500) -> list[tuple[str, pa.RecordBatch]]:
    """20 iterations of 10 ms, each 19 GEMM kernels of 500 us back to back: the device is busy 95 %
    of the time, all of it in matrix multiplication, iterations identical. Saturated arithmetic:
    compute-bound."""
    n_it, per = 20, 19
    it = np.repeat(np.arange(n_it), per)
    starts = T0 + it * 10 * MS + np.tile(np.arange(per) * gemm_us * US, n_it)
    return [
        ("iterations", iterations(n_it, 10 * MS)),
        ("kernels", kernels(starts, np.full(it.size, gemm_us * US), [GEMM] * it.size, ["kernel"] * it.size, it)),
    ]


def cpu_bound() -> list[tuple[str, pa.RecordBatch]]:
    """20 iterations of 10 ms with 5 convolutions of 200 us each: the device works 1 ms in 10 and
    its kernels are long (no launch tax). The feeding process spends 40 % of its wall time runnable
    but waiting for a CPU, and 60 % of its switches are preemptions: the host is starved of CPU,
    so the GPU waits. CPU-bound."""
    n_it, per = 20, 5
    it = np.repeat(np.arange(n_it), per)
    starts = T0 + it * 10 * MS + np.tile(np.arange(per) * 2 * MS, n_it)
    return [
        ("iterations", iterations(n_it, 10 * MS)),
        ("kernels", kernels(starts, np.full(it.size, 200 * US), [CONV] * it.size, ["kernel"] * it.size, it)),
        ("sched", sched(interference=0.4, involuntary=300, voluntary=200)),
    ]


def test_launch_bound():
    c = classify(*launch_bound())
    assert c["bottleneck_class"] == "launch-bound"
    assert c["confidence"] >= 0.8
    assert c["signals"]["microkernel_pct"] == 1.0
    assert c["signals"]["kernels_per_iteration"] == 2000
    assert c["signals"]["cpu_overhead_ratio"] == pytest.approx(0.8)
    assert c["signals"]["gpu_idle_ratio"] == pytest.approx(0.6, abs=1e-3)
    assert c["top_evidence"][0] == {"signal": "microkernel_pct", "value": 1.0, "weight": 0.3}
    assert set(c["top_evidence"][0]) == {"signal", "value", "weight"}


def test_memory_bound():
    c = classify(*memory_bound())
    assert c["bottleneck_class"] == "memory-bound"
    assert c["signals"]["memory_ops_ratio"] == pytest.approx(6 / 9, abs=1e-3)
    assert c["signals"]["memory_bound_kernel_pct"] == pytest.approx(1.0)
    assert c["top_evidence"][0]["signal"] == "memory_ops_ratio"


def test_compute_bound_and_telemetry_raises_confidence():
    without = classify(*compute_bound())
    assert without["bottleneck_class"] == "compute-bound"
    # the window runs from the first kernel's start to the last one's end: 190 ms busy in 199.5 ms
    assert without["signals"]["gpu_active_ratio"] == pytest.approx(190 / 199.5)
    assert without["signals"]["compute_kernel_pct"] == pytest.approx(1.0)
    assert "gpu_utilization" in without["missing_signals"]
    with_tel = classify(("telemetry", telemetry(0.98, 1.7e9, 1.7e9)), *compute_bound())
    assert with_tel["bottleneck_class"] == "compute-bound"
    assert with_tel["signals"]["gpu_utilization"] == pytest.approx(0.98)
    # a missing input lowers confidence, it does not change the answer
    assert with_tel["confidence"] > without["confidence"]
    assert with_tel["confidence"] == 1.0


def test_activity_counters_show_a_100_percent_utilised_gpu_idle():
    """The launch-bound trace's GPU reports 100 % utilisation (a kernel always ran) but its SMs were active
    5 % of the time (GPM): the utilisation signal is the SM activity, so compute-bound gets nothing from it."""
    sample = tm.GpuSample(tm.GpuIdentity("0", model="NVIDIA H100 80GB HBM3", vendor="nvidia"))
    sample.add(tm.UTILIZATION, 1.0)
    sample.add(tm.SM_ACTIVE, 0.05)
    sample.add(tm.GRAPHICS_ACTIVE, 0.9)
    sample.add(tm.MEMORY_UTILIZATION, 0.6)
    sample.add(tm.DRAM_ACTIVE, 0.02)
    tel = conform("telemetry", tm.to_table([sample], ts_ns=T0, node=NODE, source="smi"))
    c = classify(("telemetry", tel), *launch_bound())
    assert c["bottleneck_class"] == "launch-bound"
    assert c["signals"]["gpu_utilization"] == pytest.approx(0.05)  # SM activity first, then the graphics engine
    assert c["signals"]["gpu_memory_utilization"] == pytest.approx(0.02)
    coarse = classify(("telemetry", telemetry(1.0, 1.7e9, 1.7e9)), *launch_bound())
    assert c["scores"]["compute-bound"] < coarse["scores"]["compute-bound"]


def test_cpu_bound():
    c = classify(*cpu_bound())
    assert c["bottleneck_class"] == "CPU-bound"
    assert c["signals"]["sched_interference_index"] == pytest.approx(0.4)
    assert c["signals"]["involuntary_switch_ratio"] == pytest.approx(0.6)
    assert c["signals"]["gpu_idle_ratio"] == pytest.approx(0.9, abs=0.01)
    # without the scheduler data the same trace is still CPU-bound, with less confidence
    no_sched = classify(*cpu_bound()[:2])
    assert no_sched["bottleneck_class"] == "CPU-bound"
    assert no_sched["confidence"] < c["confidence"]


def test_throttled():
    """The compute-bound trace on a GPU at 1.2 of its 1.7 GHz, power-throttled, 99 % utilised: the
    arithmetic would be the limit at full clocks, but the clocks are 29 % down under load — power
    sets the pace. Throttled, not compute-bound."""
    c = classify(("telemetry", telemetry(0.99, 1.2e9, 1.7e9, throttle=1.0)), *compute_bound())
    assert c["bottleneck_class"] == "throttled"
    assert c["signals"]["clock_drop_under_load"] == pytest.approx(1 - 1.2 / 1.7)
    assert c["scores"]["compute-bound"] == 0.0  # gated off: far below its clocks


def throttled_midway() -> list[tuple[str, pa.RecordBatch]]:
    """60 iterations of the GEMM workload; telemetry every 10 ms. For the first 30 the GPU runs at
    its 1.7 GHz, 99 % utilised; then it reports power throttling and runs at 1.2 GHz, and the same
    kernels take 25 % longer (625 us instead of 500 us: iterations of 12.5 ms instead of 10). Still
    throttled at the last sample."""
    lengths = [10 * MS] * 30 + [int(12.5 * MS)] * 30
    starts = np.cumsum([0, *lengths[:-1]]) + T0
    its = conform(
        "iterations",
        {
            "start_ns": pa.array(starts, pa.int64()),
            "end_ns": pa.array(starts + np.array(lengths), pa.int64()),
            "node": [NODE] * 60,
            "pid": pa.array([PID] * 60, pa.int64()),
            "model": [MODEL] * 60,
            "run_id": ["r1"] * 60,
            "trace_id": [trace_id(NODE, "r1", i) for i in range(60)],
            "span_id": [span_id(NODE, "r1", i) for i in range(60)],
            "source": ["test"] * 60,
            "iteration": pa.array(range(60), pa.int64()),
        },
    )
    per = 19
    it = np.repeat(np.arange(60), per)
    dur = np.where(it < 30, 500 * US, 625 * US)
    k_starts = starts[it] + np.tile(np.arange(per), 60) * dur
    ks = kernels(k_starts, dur, [GEMM] * it.size, ["kernel"] * it.size, it)
    end = int(starts[-1] + lengths[-1])
    tel = [
        telemetry(0.99, 1.7e9 if t < T0 + 300 * MS else 1.2e9, 1.7e9, 0.0 if t < T0 + 300 * MS else 1.0, ts=t)
        for t in range(T0, end + 10 * MS, 10 * MS)
    ]
    return [*(("telemetry", b) for b in tel), ("iterations", its), ("kernels", ks)]


def test_throttle_episodes_with_latency_impact():
    """Throttled from first principles: the clocks dropped under load while the vendor reported power
    throttling, and iterations inside the episode are 25 % slower than outside (the throttle
    analyzer's impact). The arithmetic did not change; the power budget did."""
    c = classify(*throttled_midway())
    assert c["bottleneck_class"] == "throttled"
    assert c["signals"]["throttle_latency_impact"] == pytest.approx(0.25, abs=0.01)
    assert c["signals"]["throttle_active"] == 1.0
    assert c["coverage"]["throttled"] == 1.0 and c["scores"]["throttled"] == 1.0
    assert c["top_evidence"][0]["signal"] == "throttle_latency_impact"
    assert c["confidence"] == 1.0


def test_an_idle_gpu_lowering_clocks_is_not_throttled():
    """Clocks at 30 % of maximum while the GPU is 5 % utilised is power management, not throttling."""
    c = classify(("telemetry", telemetry(0.05, 0.5e9, 1.7e9)), *cpu_bound())
    assert c["signals"]["clock_drop_under_load"] == 0.0
    assert c["bottleneck_class"] == "CPU-bound"


def test_metrics_have_one_current_class_and_a_bounded_label_set():
    stats = Stats()
    p = Pipeline(Bus(stats), Correlator(stats), build_analyzers(AgentConfig(node=NODE)), [], stats, NODE)
    for kind, b in compute_bound():
        p.dispatch(EventBatch(kind, b, "test"))
    points = p.snapshot().results["bottleneck"].points()
    assert_points_valid(points)
    cls = {pt.labels["class"]: pt.value for pt in points if pt.metric is BOTTLENECK_CLASS}
    assert set(cls) == set(CLASSES) and cls["compute-bound"] == 1.0 and sum(cls.values()) == 1.0
    conf = [pt for pt in points if pt.metric is BOTTLENECK_CONFIDENCE]
    assert len(conf) == 1 and conf[0].labels == {"node": NODE, "model": MODEL} and 0 < conf[0].value <= 1


def test_a_finding_when_the_class_is_first_known_and_when_it_changes():
    """Derived twice from two sets of results for the same model: first launch-bound, then (a new
    version of the model, with long GEMM kernels) compute-bound."""
    bn = BottleneckAnalyzer()

    def results(batches):
        stats = Stats()
        analyzers = [a for a in build_analyzers(AgentConfig(node=NODE)) if a.name != "bottleneck"]
        p = Pipeline(Bus(stats), Correlator(stats), analyzers, [], stats, NODE)
        for kind, b in batches:
            p.dispatch(EventBatch(kind, b, "test"))
            bn.update(EventBatch(kind, b, "test"))
        return p.snapshot().results

    first = bn.derive(results(launch_bound()))
    assert first.models[(NODE, MODEL)].bottleneck_class == "launch-bound"
    found = bn.drain_findings()
    assert len(found) == 1 and found[0].severity == "info" and found[0].subject == MODEL
    assert found[0].evidence["bottleneck_class"] == "launch-bound" and found[0].evidence["previous_class"] is None
    assert found[0].ts_ns == T0 + 5 * 10 * MS  # the data's time: the end of the last iteration
    bn.derive(results(launch_bound()))
    assert bn.drain_findings() == []  # unchanged: nothing new
    bn2 = results(compute_bound())
    second = bn.derive(bn2)
    assert second.models[(NODE, MODEL)].bottleneck_class == "compute-bound"
    found = bn.drain_findings()
    assert len(found) == 1 and found[0].severity == "warning"
    assert "from launch-bound to compute-bound" in found[0].summary
    assert found[0].evidence["top_evidence"][0]["signal"] == "gpu_active_ratio"


def test_missing_results_and_foreign_shapes_do_not_break_it():
    bn = BottleneckAnalyzer()
    for kind, b in compute_bound():
        bn.update(EventBatch(kind, b, "test"))
    out = bn.derive({"launch": object(), "telemetry": None, "sched": "not a result"}).to_dict()
    c = out["models"][MODEL]
    assert c["bottleneck_class"] == "unknown" and c["confidence"] == 0.0
    assert bn.derive({}).to_dict()["models"][MODEL]["bottleneck_class"] == "unknown"


def test_models_are_bounded():
    bn = BottleneckAnalyzer(max_models=2)
    for m in ("a", "b", "c"):
        bn.update(EventBatch("iterations", iterations(1, MS, model=m), "test"))
    assert len(bn.derive({}).models) == 2 and bn.models_dropped == 1


def requests(
    n: int, queue_share: float, e2e_s: float = 1.0, every_s: float = 0.2, model: str = MODEL
) -> pa.RecordBatch:
    """``n`` served requests of ``e2e_s``, ending ``every_s`` apart, each queued ``queue_share`` of its
    time and answering 100 tokens."""
    ends = [T0 + int((e2e_s + i * every_s) * 1e9) for i in range(n)]
    return conform(
        "requests",
        {
            "start_ns": pa.array([e - int(e2e_s * 1e9) for e in ends], pa.int64()),
            "end_ns": pa.array(ends, pa.int64()),
            "node": [NODE] * n,
            "model": [model] * n,
            "trace_id": [f"{i:032x}" for i in range(n)],
            "span_id": [f"{i:016x}" for i in range(n)],
            "source": ["otlp"] * n,
            "output_tokens": pa.array([100] * n, pa.int64()),
            "queue_s": [queue_share * e2e_s] * n,
            "ttft_s": [queue_share * e2e_s + 0.05] * n,
            "e2e_s": [e2e_s] * n,
        },
    )


def mostly_idle() -> list[tuple[str, pa.RecordBatch]]:
    """20 iterations of 10 ms, each three GEMM kernels of 1 ms, 3.5 ms apart: the device is busy 60 ms
    of the 198 ms from the first kernel to the last, idle 70 %, with long kernels (no launch tax)."""
    n_it, per = 20, 3
    it = np.repeat(np.arange(n_it), per)
    starts = T0 + it * 10 * MS + np.tile(np.arange(per) * 3500 * US, n_it)
    return [
        ("iterations", iterations(n_it, 10 * MS)),
        ("kernels", kernels(starts, np.full(it.size, MS), [GEMM] * it.size, ["kernel"] * it.size, it)),
    ]


def test_queue_bound_when_requests_wait_while_the_gpu_idles():
    """The server's requests spend 60 % of their time in its queue while the model's GPU idles 70 %:
    they wait for something other than the GPU (the scheduler, a batch limit, a CPU). Queue-bound,
    with the serving load as evidence: 50 requests of 100 tokens ending over 9.8 s on one GPU."""
    c = classify(*mostly_idle(), ("requests", requests(50, queue_share=0.6)))
    assert c["signals"]["gpu_idle_ratio"] == pytest.approx(1 - 60 / 198)
    assert c["signals"]["queue_share"] == pytest.approx(0.6)
    assert c["bottleneck_class"] == "queue-bound" and c["confidence"] >= 0.8
    assert [e["signal"] for e in c["top_evidence"]] == ["queue_share", "gpu_idle_ratio"]
    load = c["serving"]
    assert load["requests"] == 50 and load["gpus"] == 1
    assert load["queue_share"] == pytest.approx(0.6) and load["mean_queue_s"] == pytest.approx(0.6)
    assert load["output_tokens_per_s"] == pytest.approx(5000 / 9.8)
    assert load["output_tokens_per_s_per_gpu"] == pytest.approx(5000 / 9.8)
    # without the requests the same GPU trace is what it was before: the idle GPU waits on the host
    before = classify(*mostly_idle())
    assert before["bottleneck_class"] == "CPU-bound" and "serving" not in before
    assert before["scores"]["queue-bound"] is None and "queue_share" in before["missing_signals"]


def test_requests_queued_behind_a_busy_gpu_are_not_queue_bound():
    """The same queue share on a GPU busy 95 % of the time: the requests wait for the device itself,
    which is saturated with GEMMs. Compute-bound; queue-bound gated off."""
    c = classify(*compute_bound(), ("requests", requests(50, queue_share=0.6)))
    assert c["bottleneck_class"] == "compute-bound"
    assert c["scores"]["queue-bound"] == 0.0 and c["serving"]["queue_share"] == pytest.approx(0.6)


def test_a_queue_bound_finding_carries_the_serving_load():
    bn = BottleneckAnalyzer()
    stats = Stats()
    analyzers = [a for a in build_analyzers(AgentConfig(node=NODE)) if a.name != "bottleneck"]
    p = Pipeline(Bus(stats), Correlator(stats), analyzers, [], stats, NODE)
    for kind, b in (*mostly_idle(), ("requests", requests(50, queue_share=0.6))):
        p.dispatch(EventBatch(kind, b, "test"))
        bn.update(EventBatch(kind, b, "test"))
    assert bn.derive(p.snapshot().results).models[(NODE, MODEL)].bottleneck_class == "queue-bound"
    (f,) = bn.drain_findings()
    assert f.evidence["bottleneck_class"] == "queue-bound" and f.ts_ns == T0 + int((1.0 + 49 * 0.2) * 1e9)
    assert f.evidence["serving"]["queue_share"] == pytest.approx(0.6)
    assert f.evidence["serving"]["output_tokens_per_s_per_gpu"] == pytest.approx(5000 / 9.8)


def test_the_serving_load_covers_the_request_window_only():
    """Requests queued 90 % of their time, then (10 minutes on) requests queued 10 %: with a 5-minute
    window only the later ones count; an old batch arriving late is left out too."""
    bn = BottleneckAnalyzer(request_window_s=300.0)
    early = requests(20, queue_share=0.9)
    late = requests(20, queue_share=0.1)
    shift = pa.array(np.asarray(late.column("end_ns")) + 600 * 10**9, pa.int64())
    late = late.set_column(late.schema.get_field_index("end_ns"), "end_ns", shift)
    for b in (early, late, early):
        bn.update(EventBatch("requests", b, "test"))
    load = bn.serving_load((NODE, MODEL))
    assert load is not None and load.requests == 20 and load.queue_share == pytest.approx(0.1)
    assert load.gpus == 0 and load.output_tokens_per_s_per_gpu is None
    assert bn.serving_load((NODE, "other")) is None
