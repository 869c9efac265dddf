"""The XID lines of a kernel log: a file (dmesg, ``dmesg -T``, ``journalctl -k`` output), stdin, or ``/dev/kmsg``.

``read_xids`` reads a log once (``aaco health``); ``KernelLogTail`` follows one (the ``xid`` source):
``/dev/kmsg`` record by record without blocking, from the oldest record the ring buffer holds (a
reader that falls behind a record the kernel overwrote gets ``EPIPE`` and goes on), a file from its
start and then as it grows (reopened from the start when it is replaced or truncated). A record's
time since boot becomes a wall-clock time through the boot time. A line is cut at ``MAX_LINE``
bytes and undecodable bytes replaced: a bad line is never fatal. Local times (``dmesg -T``,
syslog) are read in the host's time zone.
"""

from __future__ import annotations

import errno
import os
import time
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import IO, Final

from aaco.contract.xid import XidCounter, parse_line

KMSG: Final = Path("/dev/kmsg")
MAX_LINE: Final = 8192  # a /dev/kmsg record is at most 1 KiB; a log line longer than this is cut
MAX_READ: Final = 1 << 16  # records or lines taken per call at most (the rest on the next call)


def _counter() -> XidCounter:
    local = datetime.now().astimezone().tzinfo
    return XidCounter(tz=local) if local is not None else XidCounter()


def read_xids(log: Path | IO[bytes]) -> XidCounter:
    """Count the XID lines of ``log`` (a path, ``/dev/kmsg``, or a binary stream such as stdin), once."""
    if isinstance(log, Path):
        tail = KernelLogTail(log)
        try:
            while tail.poll(final=True) == MAX_READ:
                pass
        finally:
            tail.close()
        return tail.counter
    counter = _counter()
    while line := log.readline(MAX_LINE):
        counter.add_line(_line(line, log))
    return counter


def _line(line: bytes, fh: IO[bytes]) -> str:
    """A line as text; the rest of an over-long line is skipped."""
    if len(line) == MAX_LINE and not line.endswith(b"\n"):
        while (rest := fh.readline(MAX_LINE)) and not rest.endswith(b"\n"):
            pass
    return line.decode("utf-8", "replace").rstrip("\r\n")


def boot_ns() -> int:
    """The wall-clock time the machine booted (epoch ns), for /dev/kmsg's times since boot."""
    return time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)


class KernelLogTail:
    """Follows a kernel log, counting its XID lines in ``counter`` (bounded as ``XidCounter`` is)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.counter = _counter()
        self._fd: int | None = None
        self._fh: IO[bytes] | None = None
        self._inode: tuple[int, int] | None = None

    def poll(self, *, final: bool = False) -> int:
        """Read what is new; the records or lines read (``MAX_READ`` at most). Raises OSError when unreadable.

        ``final``: the file is read once, so a last line without its newline is taken too.
        """
        return self._kmsg() if self.path == KMSG else self._file(final)

    def close(self) -> None:
        """Close the log."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def _kmsg(self) -> int:
        if self._fd is None:
            self._fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
        boot = boot_ns()
        n = 0
        while n < MAX_READ:
            try:
                record = os.read(self._fd, MAX_LINE)
            except BlockingIOError:
                break  # the newest record was read
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten under us: the next read goes on
                raise
            if not record:
                break
            n += 1
            # "prio,seq,usec,flags;message\n" then continuation lines (" KEY=value"): the message only
            head, _, message = record.split(b"\n", 1)[0].partition(b";")
            event = parse_line(message.decode("utf-8", "replace"))
            if event is None:
                self.counter.add_line(message.decode("utf-8", "replace"))  # counts a malformed XID line
                continue
            fields = head.split(b",")
            usec = int(fields[2]) if len(fields) > 2 and fields[2].isdigit() else None
            self.counter.add(event if usec is None else replace(event, ts_ns=boot + usec * 1000))
        return n

    def _file(self, final: bool) -> int:
        st = os.stat(self.path)
        inode = (st.st_dev, st.st_ino)
        if self._fh is not None and (inode != self._inode or st.st_size < self._fh.tell()):
            self.close()  # replaced (rotated) or truncated: read the new one from its start
        if self._fh is None:
            self._fh = self.path.open("rb")
            self._inode = inode
        n = 0
        while n < MAX_READ:
            at = self._fh.tell()
            line = self._fh.readline(MAX_LINE)
            if not line:
                break
            if not final and not line.endswith(b"\n") and len(line) < MAX_LINE:
                self._fh.seek(at)  # a line still being written: read it whole next time
                break
            n += 1
            self.counter.add_line(_line(line, self._fh))
        return n
