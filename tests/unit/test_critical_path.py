"""HTA 0.5.0's critical path on small traces whose path is worked out by hand.

Each trace is one CPU thread (pid 1, tid 1) and one GPU stream (pid 0, tid 7), in Kineto's schema,
times in microseconds. HTA 0.5.0 gives the same figures on these traces (checked when they were
written); ``tests/integration/test_critical_path_hta.py`` checks the code against HTA on real traces.
"""

from __future__ import annotations

from typing import Any

import pytest

from aaco.agent.sources.traces.critical_path import (
    CriticalPath,
    CriticalPathAnalysis,
    critical_paths,
    is_comm_kernel,
    shorten_name,
)
from aaco.agent.sources.traces.critical_path_graph import KERNEL_DELAY, LAUNCH_DELAY, OPERATOR, SYNC
from aaco.agent.sources.traces.critical_path_trace import load_trace

NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def cpu(name: str, ts: float, dur: float, cat: str = "cpu_op", **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def launch(name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
    return cpu(name, ts, dur, cat="cuda_runtime", correlation=corr)


def gpu(name: str, ts: float, dur: float, corr: int, cat: str = "kernel") -> dict[str, Any]:
    args = {"device": 0, "stream": 7, "correlation": corr}
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


def step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return cpu(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")


def launched_step(n: int, t0: float) -> list[dict[str, Any]]:
    """A step whose path runs through the GPU: launch 8 us late, a 30 us kernel the CPU waits for.

    aten::add [10, 30] holds cudaLaunchKernel [12, 17]; the kernel runs [20, 50];
    cudaStreamSynchronize [35, 60] waits for it; aten::relu [62, 70]. The path: add's start to the
    launch (2, CPU), launch to kernel start (8, launch), the kernel (30, compute), the sync edge to
    the synchronize call's end (0), relu (8, CPU): 48 us.
    """
    c = 10 * n
    return [
        step(n, t0, 100),
        cpu("aten::add", t0 + 10, 20),
        launch("cudaLaunchKernel", t0 + 12, 5, c + 1),
        gpu("add_kernel(float*)", t0 + 20, 30, c + 1),
        launch("cudaStreamSynchronize", t0 + 35, 25, c + 2),
        gpu("Stream Sync", t0 + 35, 25, c + 2, cat="cuda_sync"),
        cpu("aten::relu", t0 + 62, 8),
    ]


def meta() -> list[dict[str, Any]]:
    return [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "ts": 0, "args": {"name": "python"}}]


def test_launch_delay_kernel_and_sync_on_the_path():
    events = meta() + launched_step(1, 1000)
    p = CriticalPathAnalysis(events).path("ProfilerStep", 0)
    assert p == CriticalPath(
        name="ProfilerStep#1",
        event=1,
        instance=0,
        length_ns=48_000,
        cpu_ns=10_000,
        compute_ns=30_000,
        comm_ns=0,
        launch_ns=8_000,
        gap_ns=0,
        nodes=7,
        events=(2, 3, 4, 5, 7),  # add, the launch, the kernel, the synchronize call, relu
    )
    assert p.wait_ns == 8_000
    assert sum(p.shares().values()) == pytest.approx(1.0)


def test_path_edges_in_order():
    _, edges, ann = CriticalPathAnalysis(meta() + launched_step(1, 1000)).path_edges("ProfilerStep", 0)
    assert ann.name == "ProfilerStep#1"
    assert [(e.type, e.weight) for e in edges] == [
        (OPERATOR, 2),
        (LAUNCH_DELAY, 8),
        (OPERATOR, 30),
        (SYNC, 0),
        ("critical_path_dependency", 0),
        (OPERATOR, 8),
    ]


def test_kernel_kernel_gap_and_communication():
    """Two kernels queued on one stream: the second (NCCL) starts 5 us after the first ends.

    Neither launch finds an empty stream, so there is no launch edge: the path is kernel A (20,
    compute), the gap (5), the all-reduce (30, communication); the weightless sync edge to the
    synchronize call's end adds nothing, and of equal lengths networkx keeps the first reached.
    """
    events = [
        *meta(),
        step(1, 0, 100),
        launch("cudaLaunchKernel", 10, 3, 1),
        launch("cudaLaunchKernel", 14, 3, 2),
        launch("cudaStreamSynchronize", 18, 62, 3),
        gpu("gemm_kernel", 20, 20, 1),
        gpu(NCCL, 45, 30, 2),
        gpu("Stream Sync", 18, 62, 3, cat="cuda_sync"),
    ]
    p = CriticalPathAnalysis(events).path()
    assert (p.length_ns, p.compute_ns, p.gap_ns, p.comm_ns, p.cpu_ns, p.launch_ns) == (
        55_000,
        20_000,
        5_000,
        30_000,
        0,
        0,
    )
    assert (p.events, p.nodes) == ((5, 6), 4)  # the two kernels
    # HTA 0.6's limit: a gap of 1.5 ms or more is no kernel-kernel edge; 5 us is well under it
    assert CriticalPathAnalysis(events, kernel_gap_limit_us=1500).path() == p
    # a limit below the gap drops the edge: the path is the all-reduce alone
    short = CriticalPathAnalysis(events, kernel_gap_limit_us=5).path()
    assert (short.length_ns, short.comm_ns, short.gap_ns) == (30_000, 30_000, 0)


def test_the_last_step_is_left_out_as_hta_leaves_it_out():
    events = meta() + launched_step(1, 1000) + launched_step(2, 2000) + launched_step(3, 3000)
    steps = critical_paths(events)
    assert [(s.name, s.instance, s.length_ns) for s in steps] == [
        ("ProfilerStep#1", 0, 48_000),
        ("ProfilerStep#2", 1, 48_000),
    ]
    with_last = critical_paths(events, include_last_step=True)
    assert [s.name for s in with_last] == ["ProfilerStep#1", "ProfilerStep#2", "ProfilerStep#3"]


def test_a_gpu_side_step_annotation_is_an_instance_but_not_a_step():
    events = meta() + launched_step(1, 1000)
    events.append(
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#1", "pid": 0, "tid": 7, "ts": 1020, "dur": 30}
    )
    a = CriticalPathAnalysis(events)
    assert [e.cat for e in a.instances()] == ["user_annotation", "gpu_user_annotation"]
    assert [s.name for s in critical_paths(events)] == ["ProfilerStep#1"]


def test_whole_trace():
    events = meta() + launched_step(1, 1000)
    whole = CriticalPathAnalysis(events).path("", None)
    assert (whole.name, whole.event, whole.length_ns) == ("", -1, 48_000)


def test_fractional_times_are_rounded_inwards_to_whole_microseconds():
    """HTA's ``round_down_time_stamps``: start up, end down, from the float sum ts + dur."""
    rows = load_trace(
        [
            cpu("a", 10.2, 5.5),  # [11, 15]
            cpu("b", 20.5, 0.3),  # [21, 20]: negative, as HTA has it
            cpu("c", 30.0, 2.0),
        ]
    ).rows
    assert [(r.ts + 11, r.dur) for r in rows] == [(11, 4), (21, -1), (30, 2)]  # shifted to start at 0


def test_integer_times_are_kept():
    rows = load_trace([cpu("a", 10, 5), cpu("b", 12, 1)]).rows
    assert [(r.ts, r.dur) for r in rows] == [(0, 5), (2, 1)]


def test_no_launched_gpu_work_is_no_path():
    """HTA 0.5.0 fails without GPU work on a stream (no queue lengths): no path, as there."""
    events = [*meta(), step(1, 0, 100), cpu("aten::add", 10, 20)]
    assert CriticalPathAnalysis(events).path() is None
    assert critical_paths(events) == []


def test_unknown_annotation_or_instance():
    a = CriticalPathAnalysis(meta() + launched_step(1, 1000))
    assert a.path("no such annotation") is None
    assert a.path("ProfilerStep", 5) is None


def test_zero_weight_launch_edges_keep_the_path():
    events = meta() + launched_step(1, 1000)
    assert CriticalPathAnalysis(events, zero_weight_launch_edges=True).path() == CriticalPathAnalysis(events).path()


def test_blocking_call_spans_weigh_nothing():
    """cudaStreamSynchronize's own span is no CPU time: its end is reached through the GPU."""
    _, edges, _ = CriticalPathAnalysis(meta() + launched_step(1, 1000)).path_edges()
    assert all(e.event is None or e.event.name != "cudaStreamSynchronize" or e.weight == 0 for e in edges)
    assert KERNEL_DELAY not in {e.type for e in edges}


def test_names():
    assert shorten_name("void at::native::vectorized_elementwise_kernel<4, float>(int, float*)") == (
        "at::native::vectorized_elementwise_kernel"
    )
    assert shorten_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD (Pageable -> Device)"
    assert shorten_name("ampere_sgemm_128x64_nn") == "ampere_sgemm_128x64_nn"
    assert is_comm_kernel(NCCL)
    assert is_comm_kernel("void ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)")
    assert not is_comm_kernel("void at::native::vectorized_elementwise_kernel<4>(int)")
    assert not is_comm_kernel("nccl_helper")
