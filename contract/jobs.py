"""Distributed jobs (docs/jobs.md): a job's identity, its name when nobody gave one, its collectives.

Pure functions over plain values, shared by the sources (which fill the job columns at ingest) and
by whoever reads the rows later (the fleet applies ``derive_jobs`` again over the lakes it reads,
so a node's lake, three nodes' lakes and one lake with every rank give the same jobs).

**Identity.** ``JobFields`` holds the job columns of ``schemas.JOB_COLUMNS``; ``resolve(*layers)``
merges what several places know, field by field, the first that knows winning (configuration >
the process environment > the pod's owner > the trace).

**A job with no name** is named from its ranks (``derive_jobs``): the rank traces of one backend
and world size whose profiled spans (their steps, from the first step's start to the last step's
end) overlap in time, directly or through other ranks, are one job, named
``<backend>-<world_size>x-<UTC start of its earliest step, to the second>`` (``derived_name``:
``nccl-128x-2023-04-28T23:51:38Z``). A world of one (``world_size`` < 2) is no distributed job:
it gets no name. The result depends on the set of spans only, not on their order.

**Collectives.** ``collective_op`` reads the operation from an NCCL/RCCL kernel's name
(``ncclKernel_AllReduce_RING_LL_Sum_float``, ``ncclDevKernel_AllGather_RING_LL``,
``ncclAllReduceRingLLKernel_sum_f32``, ``ncclDevKernel_SendRecv``); ``op_from_collective_name``
from PyTorch's ``record_param_comms`` ``Collective name`` (``allreduce``, ``_allgather_base``,
``reduce_scatter_tensor_coalesced``, ``alltoall_base``, ``send``...). ``message_bytes`` is the
message size nccl-tests calls S (doc/PERFORMANCE.md): the larger of the input and output element
counts (the whole gathered buffer of an all_gather, the whole input of a reduce_scatter) times the
type's size (``dtype_name``, ``DTYPE_BYTES``: PyTorch's scalar type names as Kineto writes them,
``Float``, ``BFloat16``, ``Long``...). ``bus_bandwidth`` is nccl-tests' bus bandwidth: the
algorithm bandwidth S / t scaled by ``bus_factor`` (all_reduce 2(n-1)/n; all_gather,
reduce_scatter, all_to_all (n-1)/n; broadcast, reduce, send, recv, send_recv 1).
"""

from __future__ import annotations

import re
import time
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, fields, replace
from typing import Final

# Attributes of GPU telemetry rows naming the Slurm jobs on the GPU (docs/jobs.md, "Slurm"): the
# jobs' names (``slurm_job_name``), their users and partitions, comma-joined when several share it.
ATTR_JOB: Final = "aaco.job.name"
ATTR_JOB_USER: Final = "aaco.job.user"
ATTR_JOB_PARTITION: Final = "aaco.job.partition"


def slurm_job_name(job_id: str) -> str:
    """A Slurm job's name as AACO's jobs carry it: ``slurm-<SLURM_JOB_ID>`` (as the process environment names it)."""
    return f"slurm-{job_id}"


COLLECTIVES: Final = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send_recv",
    "send",
    "recv",
)
MIN_WORLD: Final = 2  # a derived job has at least two ranks


@dataclass(frozen=True)
class JobFields:
    """The job columns of a row (``schemas.JOB_COLUMNS``); None where unknown."""

    job: str | None = None
    rank: int | None = None
    world_size: int | None = None
    local_rank: int | None = None
    dist_backend: str | None = None

    def known(self) -> bool:
        """Whether any field is known."""
        return any(getattr(self, f.name) is not None for f in fields(self))

    def columns(self) -> dict[str, str | int | None]:
        """Column name -> value."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def named(self, job: str | None) -> JobFields:
        """The same fields with ``job`` where none was known."""
        return self if self.job is not None or job is None else replace(self, job=job)


def resolve(*layers: JobFields | None) -> JobFields:
    """Merge layers in precedence order (configuration, environment, pod owner, trace): field by field, first wins."""
    out: dict[str, str | int | None] = {}
    for layer in layers:
        if layer is None:
            continue
        for name, value in layer.columns().items():
            if out.get(name) is None and value is not None:
                out[name] = value
    return JobFields(**out)  # type: ignore[arg-type]


@dataclass(frozen=True)
class RankSpan:
    """One rank's trace as the naming rule sees it: its backend, world size and profiled span (epoch ns)."""

    key: Hashable
    backend: str
    world_size: int
    start_ns: int
    end_ns: int


def derived_name(backend: str, world_size: int, start_ns: int) -> str:
    """``<backend>-<world_size>x-<UTC start, to the second>``: ``nccl-128x-2023-04-28T23:51:38Z``."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start_ns // 1_000_000_000))
    return f"{backend.lower()}-{world_size}x-{stamp}"


def derive_jobs(spans: Iterable[RankSpan]) -> dict[Hashable, str]:
    """Key -> derived job name for every span of a distributed job (see the module doc); others absent.

    Spans of one (backend, world size) are swept in start order; a span that starts before the
    job so far ends (or when it ends) joins it. Order-free: the same spans in any order give the
    same names.
    """
    groups: dict[tuple[str, int], list[RankSpan]] = {}
    for s in spans:
        if s.backend and s.world_size is not None and s.world_size >= MIN_WORLD:
            groups.setdefault((s.backend.lower(), s.world_size), []).append(s)
    out: dict[Hashable, str] = {}
    for (backend, world), members in groups.items():
        members.sort(key=lambda s: (s.start_ns, s.end_ns))
        job: list[RankSpan] = []
        end = 0
        for s in [*members, None]:
            if s is not None and job and s.start_ns <= end:
                job.append(s)
                end = max(end, s.end_ns)
                continue
            if job:
                name = derived_name(backend, world, job[0].start_ns)
                out.update((m.key, name) for m in job)
            if s is not None:
                job, end = [s], s.end_ns
    return out


# The operation in an NCCL/RCCL kernel's name: ncclKernel_<Op>_..., ncclDevKernel_<Op>_..., nccl<Op>...Kernel_...
_KERNEL_OP = re.compile(
    r"^(?:void\s+)?(?:nccl|rccl)\w*?(AllReduce|AllGather|ReduceScatter|AllToAll|Broadcast|SendRecv|Reduce|Send|Recv)"
)
_OPS = {
    "AllReduce": "all_reduce",
    "AllGather": "all_gather",
    "ReduceScatter": "reduce_scatter",
    "AllToAll": "all_to_all",
    "Broadcast": "broadcast",
    "SendRecv": "send_recv",
    "Reduce": "reduce",
    "Send": "send",
    "Recv": "recv",
}
_COMM_KERNEL = re.compile(r"^(?:void\s+)?(?:nccl|rccl|msccl)", re.IGNORECASE)
# PyTorch's collective names (record_param_comms), letters only, lower case: the prefix gives the op
_NAMED_OPS: Final = (
    ("allreduce", "all_reduce"),
    ("allgather", "all_gather"),
    ("reducescatter", "reduce_scatter"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("sendrecv", "send_recv"),
    ("reduce", "reduce"),
    ("send", "send"),
    ("recv", "recv"),
)


def is_comm_kernel(name: str) -> bool:
    """Whether a kernel is NCCL's, RCCL's or MSCCL's (a collective, whatever its operation)."""
    return bool(_COMM_KERNEL.match(name))


def collective_op(kernel_name: str) -> str | None:
    """The operation an NCCL/RCCL kernel's name says (``COLLECTIVES``); None for another kernel or a generic one."""
    m = _KERNEL_OP.match(kernel_name)
    return _OPS[m.group(1)] if m else None


def op_from_collective_name(name: str) -> str | None:
    """The operation of a PyTorch ``Collective name`` (``_allgather_base`` -> all_gather); None: not one of ours."""
    letters = re.sub(r"[^a-z]", "", name.lower())
    for prefix, op in _NAMED_OPS:
        if letters.startswith(prefix):
            return op
    return None


# PyTorch's scalar type names (c10 toString, as Kineto's record_param_comms writes ``dtype``): our name, bytes.
_DTYPES: Final = {
    "Byte": ("uint8", 1),
    "Char": ("int8", 1),
    "Short": ("int16", 2),
    "Int": ("int32", 4),
    "Long": ("int64", 8),
    "Half": ("float16", 2),
    "Float": ("float32", 4),
    "Double": ("float64", 8),
    "ComplexHalf": ("complex32", 4),
    "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
    "Bool": ("bool", 1),
    "BFloat16": ("bfloat16", 2),
    "QInt8": ("qint8", 1),
    "QUInt8": ("quint8", 1),
    "QInt32": ("qint32", 4),
    "Float8_e5m2": ("float8_e5m2", 1),
    "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2fnuz": ("float8_e5m2fnuz", 1),
    "Float8_e4m3fnuz": ("float8_e4m3fnuz", 1),
    "UInt16": ("uint16", 2),
    "UInt32": ("uint32", 4),
    "UInt64": ("uint64", 8),
}
DTYPE_BYTES: Final = {name: size for name, size in _DTYPES.values()}


def dtype_name(torch_name: str) -> str:
    """PyTorch's scalar type name as ours (``Float`` -> float32, ``BFloat16`` -> bfloat16); unknown: lower case."""
    known = _DTYPES.get(torch_name)
    return known[0] if known else torch_name.lower()


def message_bytes(in_nelems: int | None, out_nelems: int | None, dtype: str | None) -> int | None:
    """nccl-tests' S: the larger element count times the size of ``dtype`` (ours or PyTorch's name); None if unknown."""
    counts = [n for n in (in_nelems, out_nelems) if n is not None and n >= 0]
    size = DTYPE_BYTES.get(dtype_name(dtype)) if dtype else None
    if not counts or size is None:
        return None
    return max(counts) * size


def bus_factor(op: str, n: int | None) -> float | None:
    """nccl-tests' bus bandwidth factor of ``op`` for ``n`` ranks; None when it needs ``n`` and has none."""
    if op in ("broadcast", "reduce", "send_recv", "send", "recv"):
        return 1.0
    if n is None or n < 1:
        return None
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return None


def algo_bandwidth(nbytes: int, duration_ns: int) -> float | None:
    """Algorithm bandwidth, bytes per second: S / t; None for a zero or negative time."""
    if duration_ns <= 0:
        return None
    return nbytes / (duration_ns / 1e9)


def bus_bandwidth(op: str, nbytes: int | None, duration_ns: int, n: int | None) -> float | None:
    """Bus bandwidth, bytes per second (nccl-tests): algorithm bandwidth times ``bus_factor``; None if unknown."""
    if nbytes is None:
        return None
    algo, factor = algo_bandwidth(nbytes, duration_ns), bus_factor(op, n)
    return None if algo is None or factor is None else algo * factor
