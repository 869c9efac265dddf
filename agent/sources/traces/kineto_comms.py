"""A Kineto trace's distributed side: ``distributedInfo`` and the collectives of its NCCL/RCCL kernels.

- **The rank** (``dist_info``): ``distributedInfo`` (``backend``, ``rank``, ``world_size``, and the
  process groups of ``pg_config``: ``pg_name`` -> ``pg_size``) as ``contract.jobs.JobFields``.
  Values of the wrong type or out of range are left out, and so is a rank outside
  0..world_size-1 or without a world size (single-process traces write ``{"rank": 0}``).
- **Collectives** (``Comms``, ``collective_columns``): a kernel whose name is NCCL's, RCCL's or
  MSCCL's (``contract.jobs.is_comm_kernel``) is a collective. Its operation comes from its name
  (``collective_op``); a generic kernel (``ncclDevKernel_Generic``) or a ``SendRecv`` kernel takes
  the more precise operation the ``Collective name`` of its launch says (all_to_all, send, recv run
  as send/recv kernels), else ``other``. Message size, type and group size come from
  ``In msg nelems`` / ``Out msg nelems``, ``dtype`` and ``Group size``: on the kernel itself (Kineto
  copies them there since PyTorch 2.3) or on the ``record_param_comms`` operator that launched it
  (the same ``External id``); the group size falls back to the size of the process group
  (``Process Group Name`` in ``pg_config``). What neither says stays null.
  ``collective_bytes`` is ``contract.jobs.message_bytes`` (nccl-tests' S), ``collective_dtype``
  our name of the type (``Float`` -> float32). ``collective_seq`` numbers the collectives of the
  trace (one rank) 0, 1, 2... in start order (``with_seq``).

The arguments are read for collective kernels and ``record_param_comms`` operators only, whether
the batch was read a column at a time or event by event, so both paths give the same rows.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from aaco.contract.jobs import (
    JobFields,
    collective_op,
    dtype_name,
    is_comm_kernel,
    message_bytes,
    op_from_collective_name,
)

PARAM_COMMS = "record_param_comms"
OTHER = "other"  # a collective whose operation neither its name nor its launch says
MAX_TEXT = 256  # longest backend, dtype, collective or group name kept
_MAX_COUNT = 1 << 62
_PRECISE = frozenset({None, "send_recv"})  # kernel operations the launch's collective name may refine
I64, STR = pa.int64(), pa.string()


class CommArgs(NamedTuple):
    """What a collective's arguments say (None: not said)."""

    name: str | None
    in_nelems: int | None
    out_nelems: int | None
    dtype: str | None
    group_size: int | None
    group: str | None


def _count(v: Any) -> int | None:
    return v if type(v) is int and 0 <= v < _MAX_COUNT else None


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) and 0 < len(v) <= MAX_TEXT and v.isprintable() else None


def comm_args(args: Any) -> CommArgs | None:
    """The collective's arguments among an event's ``args``; None when it has none of them."""
    if not isinstance(args, dict) or ("Collective name" not in args and "In msg nelems" not in args):
        return None
    return CommArgs(
        _text(args.get("Collective name")),
        _count(args.get("In msg nelems")),
        _count(args.get("Out msg nelems")),
        _text(args.get("dtype")),
        _count(args.get("Group size")),
        _text(args.get("Process Group Name")),
    )


class Comms:
    """The collective arguments of one trace: on kernels (by correlation id) and on their launches (by External id)."""

    def __init__(self) -> None:
        self.by_corr: dict[int, CommArgs] = {}
        self.by_ext: dict[int, CommArgs] = {}

    def add_kernels(self, events: list[dict[str, Any]]) -> None:
        """Kernels of a batch that carry their collective's arguments (NCCL/RCCL kernels only)."""
        names = {e.get("name") for e in events}
        comm = {n for n in names if isinstance(n, str) and is_comm_kernel(n)}
        if not comm:
            return
        for e in events:
            if e.get("name") in comm:
                args = e.get("args")
                got = comm_args(args)
                corr = _count(args.get("correlation")) if isinstance(args, dict) else None
                if got is not None and corr is not None:
                    self.by_corr.setdefault(corr, got)

    def add_ops(self, events: list[dict[str, Any]]) -> None:
        """The ``record_param_comms`` operators of a batch, by External id."""
        for e in events:
            if e.get("name") == PARAM_COMMS:
                args = e.get("args")
                got = comm_args(args)
                ext = _count(args.get("External id")) if isinstance(args, dict) else None
                if got is not None and ext is not None:
                    self.by_ext.setdefault(ext, got)


def collective_columns(
    names: pa.Array, corr: pa.Array, ext: pa.Array, comms: Comms, groups: dict[str, int]
) -> dict[str, pa.Array]:
    """``collective``, ``collective_bytes``, ``collective_dtype``, ``collective_group_size`` of each kernel.

    ``groups``: process group name -> size (``pg_config``). Rows that are not collectives are null.
    """
    n = len(names)
    encoded = names.dictionary_encode()
    distinct = encoded.dictionary.to_pylist()
    comm_idx = [i for i, name in enumerate(distinct) if name is not None and is_comm_kernel(name)]
    out: dict[str, list[Any]] = {k: [None] * n for k in ("collective", "bytes", "dtype", "group")}
    if comm_idx:
        ops = {i: collective_op(distinct[i]) for i in comm_idx}
        idx = encoded.indices.to_numpy(zero_copy_only=False)
        rows = np.flatnonzero(np.isin(idx, comm_idx))
        corr_l, ext_l = corr.take(rows).to_pylist(), ext.take(rows).to_pylist()
        for row, c, x, i in zip(rows.tolist(), corr_l, ext_l, idx[rows].tolist(), strict=True):
            args = comms.by_corr.get(c) if c is not None else None
            if args is None and x is not None:
                args = comms.by_ext.get(x)
            op = ops[i]
            if op in _PRECISE and args is not None and args.name is not None:
                op = op_from_collective_name(args.name) or op
            out["collective"][row] = op or OTHER
            if args is None:
                continue
            out["bytes"][row] = message_bytes(args.in_nelems, args.out_nelems, args.dtype)
            out["dtype"][row] = dtype_name(args.dtype) if args.dtype else None
            group = args.group_size if args.group_size is not None else groups.get(args.group or "")
            out["group"][row] = group
    return {
        "collective": pa.array(out["collective"], STR),
        "collective_bytes": pa.array(out["bytes"], I64),
        "collective_dtype": pa.array(out["dtype"], STR),
        "collective_group_size": pa.array(out["group"], I64),
    }


def with_seq(kernels: pa.Table) -> pa.Table:
    """``collective_seq``: 0, 1, 2... over the collectives of a table in start order (null elsewhere)."""
    coll = kernels.column("collective")
    is_coll = coll.is_valid().to_numpy(zero_copy_only=False)
    seq = np.cumsum(is_coll) - 1
    return kernels.append_column("collective_seq", pa.array(seq, I64, mask=~is_coll))


def dist_info(keys: dict[str, Any]) -> tuple[JobFields | None, dict[str, int]]:
    """The rank ``distributedInfo`` describes (None: none), and its process groups' sizes by name."""
    info = keys.get("distributedInfo")
    if not isinstance(info, dict):
        return None, {}
    world = _count(info.get("world_size"))
    world = world if world else None
    rank = _count(info.get("rank"))
    if world is None or (rank is not None and rank >= world):
        rank = None  # a rank is one of a world: without its size (``{"rank": 0}`` of a single process) none
    backend = _text(info.get("backend"))
    groups: dict[str, int] = {}
    configs = info.get("pg_config")
    for pg in configs if isinstance(configs, list) else ():
        if not isinstance(pg, dict):
            continue
        raw = pg.get("pg_name")
        name, size = _text(str(raw) if type(raw) in (int, str) else None), _count(pg.get("pg_size"))
        if name and size:
            groups.setdefault(name, size)
    fields = JobFields(rank=rank, world_size=world, dist_backend=backend.lower() if backend else None)
    return (fields if fields.known() else None), groups
