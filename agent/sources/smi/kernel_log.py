"""The XID lines of a kernel log: a file (dmesg, ``dmesg -T``, ``journalctl -k`` output), stdin, or ``/dev/kmsg``.

``/dev/kmsg`` is read without blocking, record by record, from the oldest record the ring buffer holds
to the newest (a reader that falls behind a record the kernel overwrote gets ``EPIPE`` and goes on). A
file is read line by line, each line cut at ``MAX_LINE`` bytes, undecodable bytes replaced: a bad line
is never fatal. Local times (``dmesg -T``, syslog) are read in the host's time zone.
"""

from __future__ import annotations

import errno
import os
from datetime import datetime
from pathlib import Path
from typing import IO, Final

from aaco.contract.xid import XidCounter

KMSG: Final = Path("/dev/kmsg")
MAX_LINE: Final = 8192  # a /dev/kmsg record is at most 1 KiB; a log line longer than this is cut
MAX_RECORDS: Final = 1 << 20  # records read from /dev/kmsg at most (its ring buffer holds far fewer)


def read_xids(log: Path | IO[bytes]) -> XidCounter:
    """Count the XID lines of ``log`` (a path, ``/dev/kmsg``, or a binary stream such as stdin)."""
    local = datetime.now().astimezone().tzinfo
    counter = XidCounter(tz=local) if local is not None else XidCounter()
    if isinstance(log, Path) and log == KMSG:
        _kmsg(counter)
        return counter
    if isinstance(log, Path):
        with log.open("rb") as fh:
            _lines(fh, counter)
    else:
        _lines(log, counter)
    return counter


def _lines(fh: IO[bytes], counter: XidCounter) -> None:
    while line := fh.readline(MAX_LINE):
        if len(line) == MAX_LINE and not line.endswith(b"\n"):
            while (rest := fh.readline(MAX_LINE)) and not rest.endswith(b"\n"):
                pass  # the rest of an over-long line
        counter.add_line(line.decode("utf-8", "replace").rstrip("\r\n"))


def _kmsg(counter: XidCounter) -> None:
    fd = os.open(KMSG, os.O_RDONLY | os.O_NONBLOCK)
    try:
        for _ in range(MAX_RECORDS):
            try:
                record = os.read(fd, MAX_LINE)
            except BlockingIOError:
                return  # the newest record was read
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue  # records overwritten under us: the next read goes on
                raise
            if not record:
                return
            # "prio,seq,usec,flags;message\n" then continuation lines (" KEY=value"): the message only
            counter.add_line(record.split(b"\n", 1)[0].decode("utf-8", "replace"))
    finally:
        os.close(fd)
