"""The eBPF backend of the ``sched`` source: ``sched_bpf.c`` loaded with bcc, drained every interval.

bcc is Debian's ``python3-bpfcc`` (``import bcc``; the PyPI package named ``bcc`` is unrelated),
made importable from the virtualenv by ``.ci/setup`` without the rest of the system's packages.
The program (see its header) keeps cumulative per-thread counters and a per-thread log2
histogram of runqueue waits in one fixed-size map; each ``drain`` reads it with one batched
syscall (``BPF_MAP_LOOKUP_BATCH``; one lookup per key where the kernel lacks it), turns it into
deltas against the previous drain (an entry whose counters went backwards was evicted and
re-created: its value is the delta), sums the histograms per process, deletes the entries of
threads that exited (or whose process is no longer a target), and consumes the off-CPU ring buffer.
``close`` detaches and unloads everything (idempotent).
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

from aaco.agent.sources.sched.btf import TaskLayout, task_layout
from aaco.agent.sources.sched.host import TRACEFS_DIRS, tracefs
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

# Must match struct aaco_thread_t / aaco_offcpu_event_t in sched_bpf.c.
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


def bpf_source() -> str:
    """The program's C source (package data)."""
    return resources.files("aaco.agent.sources.sched").joinpath("sched_bpf.c").read_text()


@dataclass(frozen=True)
class EbpfSettings:
    """Sizes and switches the program is compiled with."""

    all_tasks: bool = False
    max_targets: int = 1024
    max_threads: int = 16384
    offcpu_threshold_ns: int = 0  # 0: no off-CPU interval events
    ringbuf_pages: int = 64
    max_events_per_drain: int = 10_000
    attach: str = "auto"  # raw (needs BTF offsets), classic, or auto (raw where BTF allows)
    sched_info: bool = True  # runqueue waits from the kernel's sched_info where BTF allows (no wakeup program)


class _Cumulative:
    """Previous cumulative values per key, to turn the kernel's counters into deltas."""

    def __init__(self, width: int, wrap_from: int | None = None) -> None:
        self.wrap_from = width if wrap_from is None else wrap_from
        self.keys = np.zeros(0, dtype=np.uint64)
        self.vals = np.zeros((0, width), dtype=np.uint64)
        self.tags = np.zeros(0, dtype=np.uint64)

    def __len__(self) -> int:
        return int(self.keys.size)

    def delta(self, keys: np.ndarray, vals: np.ndarray, tags: np.ndarray) -> tuple[np.ndarray, int, np.ndarray]:
        """Deltas of ``vals`` (rows keyed by ``keys``), how many known keys vanished, and the sort order.

        Rows come back sorted by key: ``order`` is the permutation applied to the inputs.
        A key seen for the first time counts from zero; a key whose tag (the tgid of a tid)
        changed, or any of whose counters went backwards, was re-created: its value is the delta.
        Columns from ``wrap_from`` on are u32 counters: their deltas are taken modulo 2**32 and
        they take no part in telling a re-created entry.
        """
        order = np.argsort(keys, kind="stable")
        keys, vals, tags = keys[order], vals[order], tags[order]
        prev = np.zeros_like(vals)
        if self.keys.size and keys.size:
            idx = np.clip(np.searchsorted(self.keys, keys), 0, self.keys.size - 1)
            found = (self.keys[idx] == keys) & (self.tags[idx] == tags)
            prev[found] = self.vals[idx[found]]
        delta = vals.astype(np.int64) - prev.astype(np.int64)
        w = self.wrap_from
        delta[:, w:] &= 0xFFFFFFFF
        reset = (delta[:, :w] < 0).any(axis=1)
        delta[reset] = vals[reset].astype(np.int64)
        vanished = int(np.setdiff1d(self.keys, keys, assume_unique=True).size) if self.keys.size else 0
        self.keys, self.vals, self.tags = keys, vals, tags
        return delta, vanished, order

    def forget(self, keys: np.ndarray) -> None:
        """Drop ``keys`` (deleted from the kernel map)."""
        if keys.size and self.keys.size:
            keep = ~np.isin(self.keys, keys)
            self.keys, self.vals, self.tags = self.keys[keep], self.vals[keep], self.tags[keep]


def _hist_per_process(tgids: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-thread histogram deltas (rows: threads, columns: slots) summed per tgid: non-zero (tgid, slot, count)."""
    if not tgids.size:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    uniq, inverse = np.unique(tgids, return_inverse=True)
    per = np.zeros((uniq.size, counts.shape[1]), np.int64)
    np.add.at(per, inverse, counts)
    rows, slots = np.nonzero(per)
    return uniq[rows].astype(np.int64), slots.astype(np.int64), per[rows, slots]


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
        if settings.attach == "raw" and layout is None:
            raise RuntimeError("raw tracepoints need the task layout from the kernel's BTF, which is unusable here")
        self.attach = "raw" if layout is not None and settings.attach != "classic" else "classic"
        cflags += self._raw_flags(layout) if layout is not None and self.attach == "raw" else self._classic_flags()
        info_off = layout.sched_info_offset if layout is not None and settings.sched_info else None
        self.rq_source = "sched_info" if info_off is not None and kernel_counts_waits() else "wakeup"
        if self.rq_source == "sched_info":
            cflags.append(f"-DAACO_SCHED_INFO_OFF={info_off}")
        self._bpf: Any = BPF(text=bpf_source().encode(), cflags=cflags)
        self._lib = __import__("bcc.libbcc", fromlist=["lib"]).lib
        self._targets_map = self._bpf[b"targets"]
        self._threads_map = self._bpf[b"threads"]
        self._counters = self._bpf[b"counters"]
        self._targets: set[int] = set()
        self._threads = _Cumulative(len(_COUNTERS) + HIST_SLOTS, wrap_from=len(_COUNTERS))
        self._counters_prev = dict.fromkeys(_COUNTER_REASONS, 0)
        self._events: list[bytes] = []
        self._events_dropped = 0
        self._batch_ok = True
        if settings.offcpu_threshold_ns > 0:
            self._bpf[b"offcpu_events"].open_ring_buffer(self._on_event)
        self._clock = boottime_offset()
        self._last_ns = time.time_ns()
        self.closed = False

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
        keys = np.zeros(max_entries, dtype=key_dtype)
        vals = np.zeros(max_entries, dtype=val_dtype)
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
        # Keys: task_struct pointers (raw) or tids (classic); the tid and tgid are in the values.
        keys, vals = self._read(self._threads_map, np.dtype("<u8"), THREAD_DTYPE)
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
            self._delete(self._threads_map, keys[gone])
            self._threads.forget(ids[gone])
        ended = sorted(set(tids[exited & (tids == tgids)].tolist()))
        hist_tgid, hist_slot, hist_count = _hist_per_process(tgids, delta[:, n:])
        dropped = self._kernel_drops()
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
        out["user_threads"] = len(self._threads)
        return out

    def kernel_targets(self) -> set[int]:
        """The tgids in the kernel's target map."""
        keys, _ = self._read(self._targets_map, np.dtype("<u4"), np.dtype("u1"))
        return set(keys.astype(int).tolist())

    def close(self) -> None:
        """Detach every tracepoint and free the program and its maps (idempotent)."""
        if self.closed:
            return
        self.closed = True
        bpf, self._bpf = self._bpf, None
        if bpf is not None:
            bpf.cleanup()
