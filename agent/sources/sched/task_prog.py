"""Loading ``sched_task.c``: bcc compiles it, and this module loads and attaches its functions.

bcc attaches raw and classic tracepoints, kprobes and fentry programs, but neither BTF-typed
tracepoints (``tp_btf``) nor task iterators, which are what let ``sched_task.c`` read task fields
with plain loads and keep threads in task-local storage. So its functions are taken from bcc's
compiled module (bcc has already created the maps and put their fds in the instructions) and
loaded here with the ``bpf()`` system call: ``BPF_PROG_LOAD`` as tracing programs with the BTF id
they attach to, ``BPF_RAW_TRACEPOINT_OPEN`` for the tracepoints, ``BPF_LINK_CREATE`` and
``BPF_ITER_CREATE`` for the iterator. Written here because no maintained Python binding makes
these calls (libbpf's own Python bindings do not exist; bcc's stop short of them); the attribute
layouts are the kernel's ``union bpf_attr`` (include/uapi/linux/bpf.h), stable ABI.
"""

from __future__ import annotations

import ctypes as ct
import errno
import os
import platform
import struct
from typing import Any

from aaco.agent.sources.sched.btf import TaskProgramLayout

_SYS_BPF = {"x86_64": 321, "aarch64": 280}
_PROG_LOAD, _RAW_TRACEPOINT_OPEN, _LINK_CREATE, _ITER_CREATE = 5, 17, 28, 33
_PROG_TYPE_TRACING = 26
_TRACE_RAW_TP, _TRACE_ITER = 23, 28
_ATTR_SIZE = 144
_LOG_SIZE = 1 << 20

# Function in sched_task.c -> the BTF name it attaches to (a tracepoint's typedef, or the iterator).
PROGRAMS = {
    "aaco_task_switch": "btf_trace_sched_switch",
    "aaco_task_newtask": "btf_trace_task_newtask",
    "aaco_task_exec": "btf_trace_sched_process_exec",
    "aaco_task_exit": "btf_trace_sched_process_exit",
    "aaco_task_fault": "btf_trace_page_fault_user",
}
ITERATOR = ("aaco_iter_task", "bpf_iter_task")

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


def syscall_number() -> int | None:
    """``bpf()``'s number on this machine, or None where it is not known here."""
    return _SYS_BPF.get(platform.machine())


def _bpf(cmd: int, attr: ct.Array[ct.c_char]) -> int:
    nr = syscall_number()
    if nr is None:
        raise OSError(errno.ENOSYS, f"bpf() on {platform.machine()} is not known to the agent")
    ret = _libc.syscall(nr, cmd, attr, _ATTR_SIZE)
    if ret < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))
    return int(ret)


def load(name: str, insns: bytes, attach_type: int, btf_id: int) -> int:
    """Load ``insns`` as a tracing program attaching to ``btf_id``; its fd (the verifier's log in the error)."""
    attr = ct.create_string_buffer(_ATTR_SIZE)
    code = ct.create_string_buffer(insns, len(insns))
    licence = ct.create_string_buffer(b"GPL")
    struct.pack_into("<IIQQ", attr, 0, _PROG_TYPE_TRACING, len(insns) // 8, ct.addressof(code), ct.addressof(licence))
    struct.pack_into("<15s", attr, 48, name.encode()[:15])
    struct.pack_into("<I", attr, 68, attach_type)
    struct.pack_into("<I", attr, 108, btf_id)
    try:
        return _bpf(_PROG_LOAD, attr)
    except OSError as exc:
        log = ct.create_string_buffer(_LOG_SIZE)
        struct.pack_into("<IIQ", attr, 24, 1, _LOG_SIZE, ct.addressof(log))
        try:
            return _bpf(_PROG_LOAD, attr)  # a load that fails only without a log buffer: take it
        except OSError:
            text = log.value.decode("utf-8", "replace").strip().splitlines()
            raise OSError(exc.errno, f"loading {name}: {exc.strerror}: {' | '.join(text[-6:])}") from None


def attach_tracepoint(prog_fd: int) -> int:
    """Attach a loaded tp_btf program (the tracepoint is the one it was loaded for); the link's fd."""
    attr = ct.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("<QI", attr, 0, 0, prog_fd)
    return _bpf(_RAW_TRACEPOINT_OPEN, attr)


def iterator_link(prog_fd: int) -> int:
    """Attach a loaded task iterator (every task of the system); the link's fd."""
    attr = ct.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("<IIII", attr, 0, prog_fd, 0, _TRACE_ITER, 0)
    return _bpf(_LINK_CREATE, attr)


def read_iterator(link_fd: int, max_bytes: int) -> tuple[bytes, int]:
    """One pass of the iterator: up to ``max_bytes`` of its output, and how many more bytes it wrote."""
    attr = ct.create_string_buffer(_ATTR_SIZE)
    struct.pack_into("<II", attr, 0, link_fd, 0)
    fd = _bpf(_ITER_CREATE, attr)
    chunks: list[bytes] = []
    kept = over = 0
    try:
        while chunk := os.read(fd, 1 << 16):
            room = max(0, max_bytes - kept)
            chunks.append(chunk[:room])
            kept += min(room, len(chunk))
            over += len(chunk) - min(room, len(chunk))
    finally:
        os.close(fd)
    return b"".join(chunks), over


class TaskProgram:
    """``sched_task.c``'s functions loaded from a compiled bcc module and attached; ``close`` detaches."""

    def __init__(self, bpf: Any, layout: TaskProgramLayout) -> None:
        from bcc import libbcc

        lib = libbcc.lib
        self._fds: list[int] = []
        self.programs: dict[str, int] = {}  # function name -> program fd
        try:
            for fn, target in [*PROGRAMS.items(), ITERATOR]:
                name = fn.encode()
                start, size = lib.bpf_function_start(bpf.module, name), lib.bpf_function_size(bpf.module, name)
                if not start:
                    raise OSError(errno.ENOENT, f"{fn} is not in the compiled program")
                kind = _TRACE_ITER if fn == ITERATOR[0] else _TRACE_RAW_TP
                prog = load(fn, ct.string_at(start, size), kind, layout.btf_ids[target])
                self._fds.append(prog)
                self.programs[fn] = prog
                link = iterator_link(prog) if kind == _TRACE_ITER else attach_tracepoint(prog)
                self._fds.append(link)
        except BaseException:
            self.close()
            raise
        self.iterator = self._fds[-1]

    def close(self) -> None:
        """Detach and unload (idempotent): links first, then programs."""
        fds, self._fds = self._fds, []
        self.programs = {}
        for fd in reversed(fds):
            os.close(fd)
