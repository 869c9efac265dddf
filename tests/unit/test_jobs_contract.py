"""``contract/jobs.py``: the job naming rule, the precedence of what knows a job, collectives and bus bandwidth.

The kernel names are real ones: NCCL 2.7 to 2.18 (``ncclKernel_*``, HTA's traces in
``examples/data/kineto-hta`` and ``tests/data/kineto-multirank``), NCCL 2.19+ and RCCL
(``ncclDevKernel_*``), and the pre-2.8 ``nccl<Op>RingLLKernel`` names.
"""

from __future__ import annotations

import itertools

import pytest

from aaco.contract.jobs import (
    COLLECTIVES,
    JobFields,
    RankSpan,
    bus_bandwidth,
    bus_factor,
    collective_op,
    derive_jobs,
    derived_name,
    dtype_name,
    is_comm_kernel,
    message_bytes,
    op_from_collective_name,
    resolve,
)

S = 1_000_000_000
T0 = 1_682_725_898_079_292_000  # HTA's trace_filter rank 0: ProfilerStep#551 starts 2023-04-28T23:51:38.079292Z


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "send_recv"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "all_reduce"),
        ("ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "broadcast"),
        ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "all_reduce"),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "all_gather"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_reduce"),
        ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "all_gather"),
        ("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce_scatter"),
        ("ncclDevKernel_Reduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "reduce"),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", "send_recv"),
        ("ncclKernel_AllToAllPivot_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "all_to_all"),
        ("ncclAllReduceRingLLKernel_sum_f32(ncclColl)", "all_reduce"),
        ("ncclReduceScatterRingLLKernel_sum_f32(ncclColl)", "reduce_scatter"),
        ("ncclSendRecvKernel_copy_i8(ncclColl)", "send_recv"),
        ("ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", None),
        ("ncclDevKernel_Generic_4(ncclDevKernelArgsStorage<4096ul>)", None),
    ],
)
def test_the_operation_comes_from_an_nccl_or_rccl_kernels_name(name, op):
    assert collective_op(name) == op
    assert is_comm_kernel(name)
    assert op is None or op in COLLECTIVES


@pytest.mark.parametrize(
    "name",
    ["ampere_sgemm_128x64_tn", "void at::native::vectorized_elementwise_kernel<4>", "Memcpy DtoD", "allreduce_fusion"],
)
def test_other_kernels_are_no_collectives(name):
    assert collective_op(name) is None and not is_comm_kernel(name)


@pytest.mark.parametrize(
    ("name", "op"),
    [
        ("allreduce", "all_reduce"),
        ("allreduce_coalesced", "all_reduce"),
        ("_allgather_base", "all_gather"),
        ("allgather_into_tensor_coalesced", "all_gather"),
        ("_reduce_scatter_base", "reduce_scatter"),
        ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
        ("alltoall_base", "all_to_all"),
        ("all_to_all", "all_to_all"),
        ("broadcast", "broadcast"),
        ("reduce", "reduce"),
        ("send", "send"),
        ("recv", "recv"),
        ("recvAnySource", "recv"),
        ("wait", None),
        ("barrier", None),
    ],
)
def test_pytorch_collective_names(name, op):
    assert op_from_collective_name(name) == op


def test_message_size_is_nccl_tests_s():
    # the larger of the two counts: an all_gather's whole output, a reduce_scatter's whole input
    assert message_bytes(6637568, 6637568, "Float") == 26_550_272
    assert message_bytes(1024, 8192, "BFloat16") == 16_384
    assert message_bytes(8192, 1024, "bfloat16") == 16_384
    assert message_bytes(53, 53, "Long") == 424
    assert message_bytes(None, None, "Float") is None
    assert message_bytes(10, 10, "NoSuchType") is None
    assert message_bytes(10, 10, None) is None
    assert (dtype_name("Float"), dtype_name("BFloat16"), dtype_name("Byte"), dtype_name("Odd")) == (
        "float32",
        "bfloat16",
        "uint8",
        "odd",
    )


def test_bus_factors_are_nccl_tests():
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bus_factor(op, 8) == pytest.approx(7 / 8)
    for op in ("broadcast", "reduce", "send_recv", "send", "recv"):
        assert bus_factor(op, None) == 1.0
    assert bus_factor("all_reduce", None) is None and bus_factor("other", 8) is None
    assert bus_bandwidth("all_reduce", 1 << 30, S, 4) == pytest.approx((1 << 30) * 1.5)
    assert bus_bandwidth("all_reduce", 1 << 30, 0, 4) is None
    assert bus_bandwidth("all_reduce", None, S, 4) is None


def test_precedence_is_field_by_field_first_wins():
    config = JobFields(job="pretrain-7b")
    environ = JobFields(job="10.0.0.1:29500", rank=3, world_size=16, local_rank=3)
    trace = JobFields(rank=5, world_size=16, dist_backend="nccl")
    got = resolve(config, environ, None, trace)
    assert got == JobFields(job="pretrain-7b", rank=3, world_size=16, local_rank=3, dist_backend="nccl")
    assert resolve(None, trace) == trace and not resolve().known()
    assert trace.named("x").job == "x" and got.named("y").job == "pretrain-7b"


def test_a_derived_name_is_backend_world_and_the_first_steps_second():
    assert derived_name("NCCL", 128, T0) == "nccl-128x-2023-04-28T23:51:38Z"


def test_ranks_whose_steps_overlap_are_one_job_in_any_order():
    spans = [
        RankSpan("r0", "nccl", 4, T0, T0 + 2 * S),
        RankSpan("r1", "nccl", 4, T0 + S // 2, T0 + 3 * S),
        RankSpan("r2", "nccl", 4, T0 + 5 * S // 2, T0 + 4 * S),  # overlaps r1 only: still the job, through it
        RankSpan("r3", "nccl", 4, T0 - S, T0 + S // 3),  # the earliest rank names the job
        RankSpan("later", "nccl", 4, T0 + 3600 * S, T0 + 3601 * S),  # an hour later: another job
        RankSpan("other-world", "nccl", 8, T0, T0 + S),  # same time, another world size: another job
        RankSpan("gloo", "gloo", 4, T0, T0 + S),  # another backend: another job
        RankSpan("alone", "nccl", 1, T0, T0 + S),  # a world of one is no job
    ]
    want = {
        "r0": "nccl-4x-2023-04-28T23:51:37Z",
        "r1": "nccl-4x-2023-04-28T23:51:37Z",
        "r2": "nccl-4x-2023-04-28T23:51:37Z",
        "r3": "nccl-4x-2023-04-28T23:51:37Z",
        "later": "nccl-4x-2023-04-29T00:51:38Z",
        "other-world": "nccl-8x-2023-04-28T23:51:38Z",
        "gloo": "gloo-4x-2023-04-28T23:51:38Z",
    }
    for order in itertools.islice(itertools.permutations(spans), 0, None, 997):
        assert derive_jobs(order) == want
