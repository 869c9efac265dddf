"""The eBPF backend of the ``sched`` source: a bcc-compiled program, drained every interval.

bcc is Debian's ``python3-bpfcc`` (``import bcc``; the PyPI package named ``bcc`` is unrelated),
made importable from the virtualenv by ``.ci/setup`` without the rest of the system's packages.
Two programs keep the same cumulative per-thread counters and log2 histogram of runqueue waits
(``struct aaco_thread_t``, ``sched_common.h``):

- ``sched_task.c`` (``attach: task``, preferred): BTF-typed tracepoints, each thread's entry in
  task-local storage, read by a task iterator (``task_prog``); threads that exited wait in a map;
- ``sched_bpf.c`` (``raw`` or ``classic`` tracepoints, the fallback): every entry in one
  fixed-size map, read with one batched syscall (``BPF_MAP_LOOKUP_BATCH``; one lookup per key
  where the kernel lacks it).

Each ``drain`` turns the entries into deltas against the previous drain (an entry whose counters
went backwards was evicted and re-created: its value is the delta), sums the histograms per
process, deletes the entries of threads that exited (or whose process is no longer a target), and
consumes the off-CPU ring buffer. ``close`` detaches and unloads everything (idempotent).
"""

from __future__ import annotations

import contextlib
import ctypes as ct
import errno
import logging
import os
import threading
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from aaco.agent.sources.sched.btf import TaskLayout, task_layout, task_program_layout
from aaco.agent.sources.sched.deltas import Cumulative, hist_per_process
from aaco.agent.sources.sched.host import TRACEFS_DIRS, tracefs
from aaco.agent.sources.sched.task_prog import TaskProgram, read_iterator, syscall_number
from aaco.contract.clock import boottime_offset
from aaco.contract.sched import (
    FAULT_OFFCPU,
    FAULTS,
    INVOLUNTARY,
    OFFCPU,
    ONCPU,
    RQ_WAIT,
    RQ_WAITS,
    VOLUNTARY,
    Drain,
    OffcpuEvents,
    ThreadDeltas,
)

log = logging.getLogger("aaco.sources.sched")

# Must match struct aaco_thread_t / aaco_offcpu_event_t in sched_common.h.
_COUNTERS = ("oncpu_ns", "offcpu_ns", "rq_wait_ns", "fault_offcpu_ns", "voluntary", "involuntary", "faults", "rq_count")
_METRIC_OF = {
    "oncpu_ns": ONCPU,
    "offcpu_ns": OFFCPU,
    "rq_wait_ns": RQ_WAIT,
    "fault_offcpu_ns": FAULT_OFFCPU,
    "voluntary": VOLUNTARY,
    "involuntary": INVOLUNTARY,
    "faults": FAULTS,
    "rq_count": RQ_WAITS,
}
HIST_SLOTS = 40  # AACO_HIST_SLOTS
THREAD_DTYPE = np.dtype(
    [
        *((c, "<u8") for c in _COUNTERS),
        ("tid", "<u4"),
        ("tgid", "<u4"),
        ("flags", "<u4"),
        ("pad", "<u4"),
        ("comm", "S16"),
        ("out_ts", "<u8"),
        ("ready_ts", "<u8"),
        ("fault_ts", "<u8"),
        ("pcount", "<u8"),
        ("run_delay", "<u8"),
        ("sum_exec", "<u8"),
        ("hist", "<u4", (HIST_SLOTS,)),
    ]
)
EVENT_DTYPE = np.dtype(
    [
        ("start_ns", "<u8"),
        ("end_ns", "<u8"),
        ("tgid", "<u4"),
        ("tid", "<u4"),
        ("flags", "<u4"),
        ("pad", "<u4"),
        ("comm", "S16"),
    ]
)
ST_EXITED = 2
_COUNTER_REASONS = {0: "ringbuf_full", 1: "threads_map_full"}
BPF_NOEXIST = 1


def kernel_counts_waits() -> bool:
    """Whether this kernel keeps sched_info (its run_delay and pcount move): ``/proc/self/schedstat``."""
    try:
        fields = Path("/proc/self/schedstat").read_text().split()
    except OSError:
        return False
    return len(fields) >= 3 and int(fields[2]) > 0


def bpf_source(name: str = "sched_bpf.c") -> str:
    """A program's C source (package data), after the definitions both programs share (``sched_common.h``)."""
    folder = resources.files("aaco.agent.sources.sched")
    return folder.joinpath("sched_common.h").read_text() + "\n" + folder.joinpath(name).read_text()


@dataclass(frozen=True)
class EbpfSettings:
    """Sizes and switches the program is compiled with."""

    all_tasks: bool = False
    max_targets: int = 1024
    max_threads: int = 16384
    offcpu_threshold_ns: int = 0  # 0: no off-CPU interval events
    ringbuf_pages: int = 64
    max_events_per_drain: int = 10_000
    attach: str = "auto"  # task (task storage, BTF), raw (needs BTF offsets), classic, or auto (the first that loads)
    sched_info: bool = True  # runqueue waits from the kernel's sched_info where BTF allows (no wakeup program)


def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


_gil_lock = threading.Lock()
_patched: set[str] = set()
_COMPILE = "bpf_module_create_c_from_string"


def hold_gil_while_compiling() -> None:
    """Make bcc compile with the GIL held (once per process).

    libbcc changes the *process's* working directory while it compiles (into the kernel headers,
    and back), and ctypes releases the GIL around the call, so the agent's other threads would
    resolve relative paths against the wrong directory for about a second. Calling the same
    function through a ``PyDLL`` keeps the GIL: other Python threads pause for the compile instead.
    """
    from bcc import libbcc

    with _gil_lock:
        if _COMPILE in _patched:
            return
        current = getattr(libbcc.lib, _COMPILE)
        held = getattr(ct.PyDLL(libbcc.lib._name), _COMPILE)
        held.argtypes, held.restype = current.argtypes, current.restype
        setattr(libbcc.lib, _COMPILE, held)
        _patched.add(_COMPILE)


class EbpfBackend:
    """Loads the program, maintains the targets map, drains the counters."""

    name = "ebpf"

    def __init__(self, settings: EbpfSettings) -> None:
        from bcc import BPF  # Debian's python3-bpfcc

        hold_gil_while_compiling()

        self.settings = settings
        cflags = [
            f"-DAACO_MAX_TARGETS={settings.max_targets}",
            f"-DAACO_MAX_THREADS={settings.max_threads}",
            f"-DAACO_OFFCPU_MIN_NS={settings.offcpu_threshold_ns}ULL",
            f"-DAACO_RINGBUF_PAGES={settings.ringbuf_pages}",
        ]
        if settings.all_tasks:
            cflags.append("-DAACO_ALL_TASKS")
        layout = task_layout()
        if settings.attach in ("raw", "task") and layout is None:
            raise RuntimeError(f"{settings.attach} needs the task layout from the kernel's BTF, which is unusable here")
        info_off = layout.sched_info_offset if layout is not None and settings.sched_info else None
        self.rq_source = "sched_info" if info_off is not None and kernel_counts_waits() else "wakeup"
        self._task: TaskProgram | None = None
        self.fallback: str | None = None  # why task storage is not used
        if settings.attach in ("raw", "classic"):
            self.fallback = f"configured (attach: {settings.attach})"
        if settings.attach in ("auto", "task"):
            self._bpf = self._load_task(BPF, cflags, layout)
            if self._bpf is None and settings.attach == "task":
                raise RuntimeError(f"the task-storage program cannot run here: {self.fallback}")
        if self._task is None:
            self.attach = "raw" if layout is not None and settings.attach != "classic" else "classic"
            cflags += self._raw_flags(layout) if layout is not None and self.attach == "raw" else self._classic_flags()
            if self.rq_source == "sched_info":
                cflags.append(f"-DAACO_SCHED_INFO_OFF={info_off}")
            self._bpf = BPF(text=bpf_source("sched_bpf.c").encode(), cflags=cflags)
        self._lib = __import__("bcc.libbcc", fromlist=["lib"]).lib
        self._targets_map = self._bpf[b"targets"]
        # The map the drain reads and deletes from: every thread (hash), or those that exited (task storage).
        self._threads_map = self._bpf[b"exited" if self._task else b"threads"]
        self._counters = self._bpf[b"counters"]
        self._targets: set[int] = set()
        self._threads = Cumulative(len(_COUNTERS) + HIST_SLOTS, wrap_from=len(_COUNTERS))
        self._counters_prev = dict.fromkeys(_COUNTER_REASONS, 0)
        self._over_cap = 0
        self._events: list[bytes] = []
        self._events_dropped = 0
        self._batch_ok = True
        if settings.offcpu_threshold_ns > 0:
            self._bpf[b"offcpu_events"].open_ring_buffer(self._on_event)
        self._clock = boottime_offset()
        self._last_ns = time.time_ns()
        self.closed = False

    def _load_task(self, bpf_class: Any, cflags: list[str], layout: TaskLayout | None) -> Any:
        """Compile and attach ``sched_task.c`` (``attach`` becomes "task"); None, with ``fallback`` set, if not."""
        tl = task_program_layout()
        if layout is None or tl is None:
            self.fallback = "the kernel's BTF lacks a tracepoint, the iterator or a field sched_task.c reads"
        elif not (layout.switch_has_state and layout.exit_has_group_dead):
            self.fallback = "sched_switch without prev_state or sched_process_exit without group_dead (kernel < 5.18)"
        elif self.rq_source != "sched_info" or layout.sched_info_offset is None:
            self.fallback = "the kernel keeps no sched_info (runqueue waits), or sched_info is off in the settings"
        elif syscall_number() is None:
            self.fallback = "bpf()'s system call number is not known for this machine"
        if self.fallback is not None or layout is None or tl is None:
            return None
        flags = [
            *cflags,
            f"-DAACO_MAX_EXITED={self.settings.max_threads}",
            f"-DAACO_PID_OFF={layout.pid_offset}",
            f"-DAACO_TGID_OFF={layout.tgid_offset}",
            f"-DAACO_COMM_OFF={tl.comm_offset}",
            f"-DAACO_SCHED_INFO_OFF={layout.sched_info_offset}",
            f"-DAACO_SUM_EXEC_OFF={tl.sum_exec_offset}",
        ]
        bpf = None
        try:
            bpf = bpf_class(text=bpf_source("sched_task.c").encode(), cflags=flags)
            self._task = TaskProgram(bpf, tl)
        except Exception as exc:  # bcc reports compile failures, the kernel load failures, as plain exceptions
            self.fallback = f"loading it failed: {type(exc).__name__}: {str(exc).strip()[:300]}"
            if bpf is not None:
                bpf.cleanup()
            return None
        self.attach = "task"
        return bpf

    @staticmethod
    def _raw_flags(layout: TaskLayout) -> list[str]:
        flags = ["-DAACO_RAW", f"-DAACO_PID_OFF={layout.pid_offset}", f"-DAACO_TGID_OFF={layout.tgid_offset}"]
        if layout.switch_has_state:
            flags.append("-DAACO_SWITCH_HAS_STATE")
        else:
            flags.append(f"-DAACO_STATE_OFF={layout.state_offset}")
        if layout.exit_has_group_dead:
            flags.append("-DAACO_HAVE_GROUP_DEAD")
        return flags

    @staticmethod
    def _classic_flags() -> list[str]:
        fmt = (tracefs() or TRACEFS_DIRS[0]) / "events" / "sched" / "sched_process_exit" / "format"
        try:
            return ["-DAACO_HAVE_GROUP_DEAD"] if "group_dead" in fmt.read_text() else []
        except OSError:
            return []

    # -- targets ------------------------------------------------------------------------------------

    def set_targets(self, tgids: set[int]) -> None:
        """Make the kernel's target map hold exactly ``tgids`` (ignored when tracing every task)."""
        if self.settings.all_tasks or self.closed:
            return
        t = self._targets_map
        for tgid in self._targets - tgids:
            with contextlib.suppress(KeyError):  # the kernel already dropped it when the process ended
                del t[t.Key(tgid)]
        for tgid in sorted(tgids - self._targets):
            t[t.Key(tgid)] = t.Leaf(1)
            if self.attach == "classic":  # raw entries are keyed by task pointers, unknown from here
                self._seed_threads(tgid)
        if self._task is not None and tgids != self._targets:  # tasks marked untraced are looked at again
            gen = self._bpf[b"generation"]
            gen[gen.Key(0)] = gen.Leaf(gen[gen.Key(0)].value + 1)
        self._targets = set(tgids)

    def _seed_threads(self, tgid: int) -> None:
        """Tell the kernel the tgid of a new target's existing threads, so their first wakeup counts."""
        try:
            tids = [int(n) for n in os.listdir(f"/proc/{tgid}/task") if n.isdigit()]
        except OSError:
            return
        for tid in tids[: self.settings.max_threads]:
            key = self._threads_map.Key(tid)
            leaf = self._threads_map.Leaf()
            leaf.tid = tid
            leaf.tgid = tgid
            self._lib.bpf_update_elem(self._threads_map.map_fd, ct.byref(key), ct.byref(leaf), BPF_NOEXIST)

    # -- draining -----------------------------------------------------------------------------------

    def _read(self, table: Any, key_dtype: np.dtype, val_dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Every (key, value) of a hash map as numpy arrays: batched, else one key at a time."""
        if self._batch_ok:
            try:
                return self._read_batch(table.map_fd, table.max_entries, key_dtype, val_dtype)
            except OSError as exc:
                if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
                self._batch_ok = False
                log.info("sched: this kernel has no batched map lookups; reading key by key")
        items = list(table.items())
        keys = np.frombuffer(b"".join(bytes(k) for k, _ in items), dtype=key_dtype)
        vals = np.frombuffer(b"".join(bytes(v) for _, v in items), dtype=val_dtype)
        return keys, vals

    def _read_batch(
        self, fd: int, max_entries: int, key_dtype: np.dtype, val_dtype: np.dtype
    ) -> tuple[np.ndarray, np.ndarray]:
        # Uninitialised: only the first ``total`` rows are read, and zeroing max_entries rows (5 MB for
        # 16,384 threads) at every drain would cost more than the read.
        keys = np.empty(max_entries, dtype=key_dtype)
        vals = np.empty(max_entries, dtype=val_dtype)
        token = ct.c_uint32(0)
        count = ct.c_uint32(0)
        total = 0
        first = True
        while total < max_entries:
            count.value = max_entries - total
            res = self._lib.bpf_lookup_batch(
                fd,
                None if first else ct.byref(token),
                ct.byref(token),
                ct.c_void_p(keys.ctypes.data + total * key_dtype.itemsize),
                ct.c_void_p(vals.ctypes.data + total * val_dtype.itemsize),
                ct.byref(count),
            )
            err = -res if res < 0 else ct.get_errno()
            total += count.value
            if res != 0:
                if err == errno.ENOENT:
                    break
                raise OSError(err, f"BPF_MAP_LOOKUP_BATCH: {os.strerror(err)}")
            first = False
            if count.value == 0:
                break
        return keys[:total], vals[:total]

    def _delete(self, table: Any, keys: np.ndarray) -> None:
        """Delete ``keys`` (a numpy array of the map's key type) one by one; missing keys are fine."""
        buf = np.ascontiguousarray(keys)
        size, base = buf.dtype.itemsize, buf.ctypes.data
        for i in range(buf.size):
            self._lib.bpf_delete_elem(table.map_fd, ct.c_void_p(base + i * size))

    def _on_event(self, _ctx: Any, data: Any, size: int) -> int:
        if len(self._events) < self.settings.max_events_per_drain:
            self._events.append(ct.string_at(data, size))
        else:
            self._events_dropped += 1
        return 0

    def drain(self) -> Drain:
        """Deltas since the previous drain; exited threads are read one last time and deleted."""
        now = time.time_ns()
        interval = max(1, now - self._last_ns)
        self._last_ns = now
        keys, vals = self._entries()
        known = vals["tgid"] != 0  # a thread seen only waking or switching in: counted once its process is known
        keys, vals = keys[known], vals[known]
        # Deltas are tracked per (tid, tgid), not per map key: an exiting thread's entry moves from its
        # task pointer to its tid (see sched_bpf.c), and a recycled pointer belongs to another thread.
        ids = (vals["tid"].astype(np.uint64) << np.uint64(32)) | vals["tgid"].astype(np.uint64)
        ids, first = np.unique(ids, return_index=True)
        keys, vals = keys[first], vals[first]
        n = len(_COUNTERS)
        matrix = np.zeros((keys.size, n + HIST_SLOTS), np.uint64)
        for i, c in enumerate(_COUNTERS):
            matrix[:, i] = vals[c]
        matrix[:, n:] = vals["hist"]
        delta, evicted, order = self._threads.delta(ids, matrix, np.zeros(ids.size, np.uint64))
        vals, keys, ids = vals[order], keys[order], ids[order]
        tids = vals["tid"].astype(np.int64)
        tgids = vals["tgid"].astype(np.int64)
        exited = (vals["flags"] & ST_EXITED) != 0
        busy = delta[:, :n].any(axis=1)
        comms = [_comm(c) for c in vals["comm"][busy]]
        threads = ThreadDeltas(
            tgids[busy], tids[busy], comms, {_METRIC_OF[c]: delta[busy, i] for i, c in enumerate(_COUNTERS)}
        )
        # Entries to delete after this last read: exited threads, and threads of former targets.
        gone = exited if self.settings.all_tasks else exited | ~np.isin(tgids, list(self._targets))
        if gone.any():
            self._delete(self._threads_map, keys[gone & (keys != 0)])
            self._threads.forget(ids[gone])
        ended = sorted(set(tids[exited & (tids == tgids)].tolist()))
        hist_tgid, hist_slot, hist_count = hist_per_process(tgids, delta[:, n:])
        dropped = self._kernel_drops()
        if self._over_cap:
            dropped["threads_over_cap"], self._over_cap = self._over_cap, 0
        if evicted:
            dropped["stats_evicted"] = dropped.get("stats_evicted", 0) + evicted
        events = self._take_events()
        if self._events_dropped:
            dropped["offcpu_events_over_cap"] = self._events_dropped
            self._events_dropped = 0
        return Drain(
            ts_ns=now,
            interval_ns=interval,
            threads=threads,
            hist_tgid=hist_tgid,
            hist_slot=hist_slot,
            hist_count=hist_count,
            events=events,
            exited=ended,
            dropped=dropped,
        )

    def _entries(self) -> tuple[np.ndarray, np.ndarray]:
        """Every thread's entry, and the key to delete it by once read (0: task storage, not deleted here).

        Keys are task_struct pointers (raw), tids (classic, and threads that exited under task
        storage); the tid and tgid are in the values. Under task storage, the exited threads come
        first, so that a thread also still listed by the iterator is taken as exited.
        """
        keys, vals = self._read(self._threads_map, np.dtype("<u8"), THREAD_DTYPE)
        if self._task is None:
            return keys, vals
        size = THREAD_DTYPE.itemsize
        raw, over = read_iterator(self._task.iterator, self.settings.max_threads * size)
        self._over_cap += over // size
        live = np.frombuffer(raw, dtype=THREAD_DTYPE)
        return np.concatenate([keys, np.zeros(live.size, np.uint64)]), np.concatenate([vals, live])

    def _kernel_drops(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for idx, reason in _COUNTER_REASONS.items():
            total = int(sum(self._counters.getvalue(self._counters.Key(idx))))
            if total > self._counters_prev[idx]:
                out[reason] = total - self._counters_prev[idx]
            self._counters_prev[idx] = total
        return out

    def _take_events(self) -> OffcpuEvents:
        if self.settings.offcpu_threshold_ns <= 0:
            return OffcpuEvents()
        self._bpf.ring_buffer_consume()
        raw, self._events = self._events, []
        if not raw:
            return OffcpuEvents()
        ev = np.frombuffer(b"".join(r[: EVENT_DTYPE.itemsize] for r in raw), dtype=EVENT_DTYPE)
        self._clock = boottime_offset()
        off = self._clock.offset_ns
        return OffcpuEvents(
            start_ns=ev["start_ns"].astype(np.int64) + off,
            end_ns=ev["end_ns"].astype(np.int64) + off,
            tgid=ev["tgid"].astype(np.int64),
            tid=ev["tid"].astype(np.int64),
            comm=[_comm(c) for c in ev["comm"]],
        )

    # -- introspection and shutdown -----------------------------------------------------------------

    def sizes(self) -> dict[str, int]:
        """Entries in each kernel map and in the user-space delta state (bounded by design)."""
        out = {}
        for name, table, kd, vd in (
            ("targets", self._targets_map, np.dtype("<u4"), np.dtype("u1")),
            ("threads", self._threads_map, np.dtype("<u8"), THREAD_DTYPE),
        ):
            out[name] = int(self._read(table, kd, vd)[0].size)
        if self._task is not None:  # the exited threads' map, and the threads in task storage
            raw, over = read_iterator(self._task.iterator, self.settings.max_threads * THREAD_DTYPE.itemsize)
            out["threads"] += (len(raw) + over) // THREAD_DTYPE.itemsize
        out["user_threads"] = len(self._threads)
        return out

    def program_fds(self) -> dict[str, int]:
        """Each loaded program's name and fd (for the kernel's per-program statistics)."""
        if self._task is not None:
            return dict(self._task.programs)
        return {name.decode(): fn.fd for name, fn in self._bpf.funcs.items()}

    def kernel_targets(self) -> set[int]:
        """The tgids in the kernel's target map."""
        keys, _ = self._read(self._targets_map, np.dtype("<u4"), np.dtype("u1"))
        return set(keys.astype(int).tolist())

    def close(self) -> None:
        """Detach every tracepoint and free the program and its maps (idempotent)."""
        if self.closed:
            return
        self.closed = True
        if self._task is not None:
            self._task.close()
        bpf, self._bpf = self._bpf, None
        if bpf is not None:
            bpf.cleanup()
