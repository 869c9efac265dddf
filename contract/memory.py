"""The process's resident memory, and giving freed memory back to the operating system.

CPython's objects and protobuf's arenas are allocated with the C library's ``malloc``; glibc keeps
what they free in its arenas, so a process's resident size stays at its peak after a flood of large
requests. ``malloc_trim(0)`` hands free pages back. It is glibc's (read through ``ctypes``, as no
library wraps it); elsewhere ``trim`` does nothing.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Final

PAGE: Final = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TRIM_EVERY_S: Final = 1.0  # at most one trim a second: it walks glibc's arenas (a few ms)
TRIM_AFTER_BYTES: Final = 8 * 1024 * 1024  # freed since the last trim, at least, before the next


def rss_bytes() -> int | None:
    """Resident bytes of this process (``/proc/self/statm``), None where there is no /proc."""
    try:
        with open("/proc/self/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, ValueError, IndexError):
        return None


def cgroup_memory_limit(root: str = "/sys/fs/cgroup") -> int | None:
    """The memory limit of this process's cgroup in bytes (v2 ``memory.max``, v1 ``memory.limit_in_bytes``).

    None where there is none (``max``, an unlimited v1 value, no cgroup filesystem). In a container the
    process's own cgroup is mounted at ``root``.
    """
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            with open(f"{root}/{name}") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # v1 writes "unlimited" as a page-rounded 2**63
            return int(text)
        return None
    return None


def _malloc_trim() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


class Trimmer:
    """Calls ``malloc_trim`` after large work is done, at most every ``TRIM_EVERY_S``; thread-safe."""

    def __init__(self) -> None:
        self._trim = _malloc_trim()
        self._lock = threading.Lock()
        self._pending = 0
        self._last = 0.0

    def done(self, nbytes: int) -> None:
        """``nbytes`` of work were freed: trim when enough was freed since the last trim and it is not too soon."""
        with self._lock:
            self._pending += nbytes
            now = time.monotonic()
            if self._pending < TRIM_AFTER_BYTES or now - self._last < TRIM_EVERY_S:
                return
            self._pending, self._last = 0, now
        self.trim()

    def trim(self) -> None:
        """Give free memory back now (no-op without glibc)."""
        if self._trim is not None:
            self._trim(0)
