"""What the running kernel's BTF (``/sys/kernel/btf/vmlinux``) says about tasks and tracepoints.

The eBPF program of the ``sched`` source prefers *raw* tracepoints: the same kernel tracepoints,
attached without the perf-event record that classic tracepoints build for every event (on a
context-switch storm that record alone costs several per cent of throughput). Raw tracepoints
hand over ``struct task_struct`` pointers, so the program needs the offsets of ``pid`` and
``tgid`` (and, on kernels whose ``sched_switch`` does not pass it, of ``__state``) in *this*
kernel — the installed headers may be of another version. BTF has them; this module reads just
enough of the format (documented in the kernel's ``Documentation/bpf/btf.rst``) to find them and
the arity of the tracepoints' raw prototypes (``btf_trace_<name>`` typedefs). Written here rather
than taken from a library because no maintained pure-Python BTF reader exists, and this is the
little it takes. Any doubt (no BTF, unknown kinds, members missing) returns None and the program
falls back to classic tracepoints.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BTF_PATH = Path("/sys/kernel/btf/vmlinux")
_MAGIC = 0xEB9F
_STRUCT, _UNION, _PTR, _TYPEDEF, _FUNC, _FUNC_PROTO = 4, 5, 2, 8, 12, 13
# Bytes after the 12-byte common header: fixed per kind, plus per-vlen entries.
_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}
_PER_VLEN = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}
_KNOWN_KINDS = frozenset(range(1, 20))

RAW_TRACEPOINTS = (
    "sched_switch",
    "sched_wakeup",
    "sched_wakeup_new",
    "sched_process_exit",
    "sched_process_exec",
    "task_newtask",
    "page_fault_user",
)


@dataclass(frozen=True)
class TaskLayout:
    """Offsets in ``struct task_struct`` and raw tracepoint arities of the running kernel."""

    pid_offset: int
    tgid_offset: int
    state_offset: int | None
    switch_has_state: bool  # sched_switch passes prev_state (kernel >= 5.18)
    exit_has_group_dead: bool  # sched_process_exit passes group_dead
    sched_info_offset: int | None = None  # task_struct.sched_info, whose pcount and run_delay lead it


_Type = tuple[int, int, int, int, list[tuple[int, ...]]]  # kind, name offset, size or type, kflag, members


def _parse(data: bytes) -> tuple[list[_Type], int] | None:
    magic, _ver, _flags, hdr_len, type_off, type_len, str_off, _str_len = struct.unpack_from("<HBBIIIII", data, 0)
    if magic != _MAGIC:
        return None
    pos, end = hdr_len + type_off, hdr_len + type_off + type_len
    types: list[_Type] = [(0, 0, 0, 0, [])]
    while pos < end:
        name_off, info, size = struct.unpack_from("<III", data, pos)
        pos += 12
        kind, vlen, kflag = (info >> 24) & 0x1F, info & 0xFFFF, info >> 31
        if kind not in _KNOWN_KINDS:
            return None
        members: list[tuple[int, ...]] = []
        if kind in (_STRUCT, _UNION):
            members = [struct.unpack_from("<III", data, pos + 12 * i) for i in range(vlen)]
        elif kind == _FUNC_PROTO:
            members = [struct.unpack_from("<II", data, pos + 8 * i) for i in range(vlen)]
        pos += _FIXED.get(kind, 0) + _PER_VLEN.get(kind, 0) * vlen
        types.append((kind, name_off, size, kflag, members))
    return types, hdr_len + str_off


def _sched_info_offset(
    types: list[_Type], name: Callable[[int], str], fields: dict[str, int], member_type: dict[str, int]
) -> int | None:
    """Offset of ``task_struct.sched_info`` when it starts with ``u64 pcount; u64 run_delay`` (else None)."""
    if "sched_info" not in fields:
        return None  # CONFIG_SCHED_INFO is off
    tid = member_type["sched_info"]
    kind, name_off, _size, kflag, members = types[tid] if tid < len(types) else (0, 0, 0, 0, [])
    if kind != _STRUCT or name(name_off) != "sched_info":
        return None
    offsets = {name(m_name): (m_off & 0xFFFFFF if kflag else m_off) // 8 for m_name, _t, m_off in members}
    if offsets.get("pcount") != 0 or offsets.get("run_delay") != 8:
        return None
    return fields["sched_info"]


def task_layout(path: Path = BTF_PATH) -> TaskLayout | None:
    """The running kernel's task layout and raw tracepoint arities, or None when BTF cannot tell."""
    try:
        return _task_layout(path)
    except (struct.error, ValueError, IndexError):  # truncated or inconsistent BTF
        return None


def _load(path: Path) -> tuple[list[_Type], Callable[[int], str]] | None:
    """The types of the BTF at ``path`` and a function naming a string offset, or None when unreadable."""
    try:
        data = path.read_bytes()
        parsed = _parse(data)
    except (OSError, struct.error):
        return None
    if parsed is None:
        return None
    types, strings = parsed

    def name(off: int) -> str:
        start = strings + off
        return data[start : data.index(b"\0", start)].decode("ascii", "replace")

    return types, name


def _task_layout(path: Path) -> TaskLayout | None:
    loaded = _load(path)
    if loaded is None:
        return None
    types, name = loaded
    fields: dict[str, int] = {}
    member_type: dict[str, int] = {}
    arity: dict[str, int] = {}
    wanted_typedefs = {f"btf_trace_{tp}": tp for tp in RAW_TRACEPOINTS}
    for kind, name_off, size, kflag, members in types[1:]:
        if kind == _STRUCT and not fields and name(name_off) == "task_struct":
            for m_name, _m_type, m_off in members:
                n = name(m_name)
                if n in ("pid", "tgid", "__state", "state", "sched_info"):
                    bits = m_off & 0xFFFFFF if kflag else m_off
                    fields[n] = bits // 8
                    member_type[n] = _m_type
        elif kind == _TYPEDEF and name(name_off) in wanted_typedefs:
            ptr = types[size] if size < len(types) else None
            if ptr and ptr[0] == _PTR and ptr[2] < len(types) and types[ptr[2]][0] == _FUNC_PROTO:
                arity[wanted_typedefs[name(name_off)]] = len(types[ptr[2]][4])
    if "pid" not in fields or "tgid" not in fields or set(arity) != set(RAW_TRACEPOINTS):
        return None
    state = fields.get("__state", fields.get("state"))
    switch_has_state = arity["sched_switch"] >= 5  # (void *ctx, preempt, prev, next, prev_state)
    if not switch_has_state and state is None:
        return None
    return TaskLayout(
        sched_info_offset=_sched_info_offset(types, name, fields, member_type),
        pid_offset=fields["pid"],
        tgid_offset=fields["tgid"],
        state_offset=state,
        switch_has_state=switch_has_state,
        exit_has_group_dead=arity["sched_process_exit"] >= 3,
    )


@dataclass(frozen=True)
class TaskProgramLayout:
    """What ``sched_task.c`` needs of the running kernel: BTF ids to attach to, task_struct offsets."""

    btf_ids: dict[str, int]  # btf_trace_<tracepoint> typedefs and the bpf_iter_task function
    comm_offset: int
    sum_exec_offset: int  # task_struct.se.sum_exec_runtime


TASK_PROGRAM_TRACEPOINTS = (
    "sched_switch",
    "task_newtask",
    "sched_process_exec",
    "sched_process_exit",
    "page_fault_user",
)
_ITER_FUNC = "bpf_iter_task"


def task_program_layout(path: Path = BTF_PATH) -> TaskProgramLayout | None:
    """The BTF ids and offsets of ``sched_task.c``, or None when BTF lacks any of them.

    Also None unless ``sched_info`` ends in ``last_arrival`` at byte 32 and ``sched_entity`` has
    ``sum_exec_runtime``: the program reads them as u64 at those places.
    """
    try:
        loaded = _load(path)
    except (ValueError, IndexError):  # truncated or inconsistent BTF
        return None
    if loaded is None:
        return None
    types, name = loaded

    def members(t: _Type) -> dict[str, int]:
        return {name(m[0]): ((m[2] & 0xFFFFFF) if t[3] else m[2]) // 8 for m in t[4]}

    wanted = {f"btf_trace_{tp}" for tp in TASK_PROGRAM_TRACEPOINTS}
    ids: dict[str, int] = {}
    structs: dict[str, dict[str, int]] = {}
    for type_id, t in enumerate(types):
        kind = t[0]
        if kind in (_TYPEDEF, _FUNC):
            n = name(t[1])
            if (kind == _TYPEDEF and n in wanted) or (kind == _FUNC and n == _ITER_FUNC):
                ids.setdefault(n, type_id)
        elif kind == _STRUCT and name(t[1]) in ("task_struct", "sched_entity", "sched_info"):
            structs.setdefault(name(t[1]), members(t))
    task, se, info = (structs.get(k, {}) for k in ("task_struct", "sched_entity", "sched_info"))
    if len(ids) != len(wanted) + 1 or info.get("last_arrival") != 32:
        return None
    if "comm" not in task or "se" not in task or "sum_exec_runtime" not in se:
        return None
    return TaskProgramLayout(ids, task["comm"], task["se"] + se["sum_exec_runtime"])
