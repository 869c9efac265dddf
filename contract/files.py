"""Files the agent writes under the lake and the quarantine: 0640 at most, directories 0750, never through a link.

The mode is given to ``open``/``mkdir`` when the file is made (the umask can only tighten it), and a
file that already existed looser (left by an earlier version) is tightened with ``fchmod`` on the
open descriptor. No umask is changed: it is process-wide and the agent's threads would race on it.
A file is never made looser than it is (``tighten`` clears bits, it never sets them).
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

FILE_MODE = 0o640
DIR_MODE = 0o750
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def tighten_fd(fd: int, mode: int = FILE_MODE) -> None:
    """Clear the permission bits of the open file ``fd`` that ``mode`` does not allow."""
    now = stat.S_IMODE(os.fstat(fd).st_mode)
    if now & ~mode:
        os.fchmod(fd, now & mode)


def tighten(path: Path, mode: int = FILE_MODE) -> None:
    """Clear the permission bits of ``path`` that ``mode`` does not allow (a symbolic link is left alone)."""
    st = os.lstat(path)
    if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & ~mode:
        os.chmod(path, stat.S_IMODE(st.st_mode) & mode)


def open_private(path: Path, flags: int, mode: int = FILE_MODE) -> int:
    """``path`` opened with ``flags`` (plus O_CREAT), created ``mode`` or tighter, refused if it is a link."""
    fd = os.open(path, flags | os.O_CREAT | _NOFOLLOW | _CLOEXEC, mode)
    try:
        tighten_fd(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_bytes_atomic(path: Path, data: bytes, mode: int = FILE_MODE) -> None:
    """Write ``data`` to ``path`` via a temporary file and rename (readers see old or new, never half); ``mode``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with os.fdopen(open_private(tmp, os.O_WRONLY | os.O_TRUNC, mode), "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def make_dirs(path: Path, mode: int = DIR_MODE) -> None:
    """Create ``path`` and its missing parents, each ``mode`` or tighter; existing ones are left as they are.

    ``Path.mkdir(parents=True)`` gives the parents the default mode: each missing level is made here.
    """
    missing: list[Path] = []
    p = path
    while not p.exists() and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another thread
            d.mkdir(mode)
