"""Which files of the spool (``trace_dir``) the agent reads: no link out of the spool, only files their owner sent.

The agent usually runs as root and the spool is writable by workloads: a file there must not make
the agent read what its writer could not (docs/security.md, "Files"). The rule:

- **Symbolic links.** ``follow_symlinks: false`` (the default): every link in the spool, to a file
  or a directory, is skipped (reason ``symlink``). ``true``: a link to a file whose target resolves
  inside the spool is read as that target; a link whose target is outside it is skipped
  (``symlink_outside``). A linked directory is never walked (the files of one inside the spool are
  listed at their own place).
- **Owner and mode.** A file is read only if its owner is an allowed uid (``allowed_uids``; by
  default root, the spool directory's owner and the agent's own user; ``any``: every owner) and it
  is not writable by others (o+w: anyone on the host could have put content in it); otherwise it is
  skipped (``owner_policy``). Hard links are left to the kernel's ``fs.protected_hardlinks`` (on by
  default on every major distribution: nobody can link a file they could not write); the source
  warns once when it is off.
- **Opening.** A listed file is opened one path component at a time from the spool directory, each
  with O_NOFOLLOW, and the rule is checked again on the opened descriptor (``fstat``: a regular file,
  the inode that was listed, its owner and mode): a file or directory swapped for a link after the
  listing is refused, not followed.

A skipped file is never read and never copied to the quarantine; ``trace_dir`` counts it in
``aaco_source_errors_total{reason}`` and names it in the log once.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

log = logging.getLogger("aaco.sources.trace_dir")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
PROTECTED_HARDLINKS = Path("/proc/sys/fs/protected_hardlinks")


@dataclass(frozen=True)
class Refusal:
    """Why a spool file is not read: ``reason`` (the counter's label) and a message naming the fix."""

    reason: Literal["symlink", "symlink_outside", "owner_policy"]
    message: str


class SpoolRefusedError(Exception):
    """A file refused when opened (it changed into something the rule refuses since it was listed)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@dataclass(frozen=True)
class Entry:
    """One file of a listing: the path to read it at and its ``lstat``, or why it is skipped."""

    path: Path
    st: os.stat_result
    refusal: Refusal | None = None


LINK_FIX = "set follow_symlinks: true in the trace_dir source to read links that stay inside the spool"
OUTSIDE_FIX = "write the file into the spool itself (a link out of it is never read)"


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


class SpoolPolicy:
    """The rule above for one spool directory (``root``, resolved once: a configured path may be a link)."""

    def __init__(
        self, root: Path, *, follow_symlinks: bool, allowed_uids: Collection[int] | Literal["any"] | None
    ) -> None:
        self.root = Path(os.path.realpath(root))
        owner = os.stat(self.root).st_uid
        self.follow_symlinks = follow_symlinks
        if allowed_uids == "any":
            self.allowed: frozenset[int] | None = None
        elif allowed_uids is None:
            self.allowed = frozenset({0, owner, os.geteuid()})
        else:
            self.allowed = frozenset(allowed_uids)

    def warn_unprotected_hardlinks(self) -> None:
        """Log once when the kernel lets anyone hard-link files they cannot write (the owner rule's premise)."""
        try:
            off = PROTECTED_HARDLINKS.read_text().strip() == "0"
        except OSError:
            return
        if off:
            log.warning(
                "%s: fs.protected_hardlinks is 0: a user who can write into the spool can hard-link files they "
                "cannot read into it; set sysctl fs.protected_hardlinks=1 on this host",
                self.root,
            )

    # -- the rule on a stat -------------------------------------------------------------------------

    def owner_refusal(self, path: Path, st: os.stat_result) -> Refusal | None:
        """The owner and mode rule on a file's stat (``lstat`` or ``fstat``)."""
        if self.allowed is not None and st.st_uid not in self.allowed:
            allowed = ", ".join(str(u) for u in sorted(self.allowed))
            return Refusal(
                "owner_policy",
                f"owned by uid {st.st_uid}, not an allowed owner ({allowed}): skipped; add the uid to "
                "allowed_uids in the trace_dir source if its files are to be read",
            )
        if st.st_mode & stat.S_IWOTH:
            return Refusal(
                "owner_policy",
                f"writable by every user (mode {stat.S_IMODE(st.st_mode):o}): skipped; the writer should "
                "create it without o+w (umask 002 or tighter)",
            )
        return None

    def _link(self, path: Path, is_dir: bool) -> tuple[Path | None, Refusal | None]:
        """A link's target to read (None: not read) and the refusal to count, if any."""
        if not self.follow_symlinks:
            return None, Refusal("symlink", f"a symbolic link: skipped; {LINK_FIX}")
        real = Path(os.path.realpath(path))
        if not real.is_relative_to(self.root):
            why = f"a symbolic link out of the spool (to {real}): skipped"
            return None, Refusal("symlink_outside", f"{why}; {OUTSIDE_FIX}")
        return (None if is_dir else real), None

    # -- listing ------------------------------------------------------------------------------------

    def walk(self, recursive: bool) -> Iterator[Entry]:
        """Every regular file under the spool the rule lets through, and every refused one (hidden names left out).

        ``os.walk`` (which never descends into a linked directory) lists; each entry is ``lstat``-ed once.
        """
        for top, dirs, names in os.walk(self.root, followlinks=False):
            here = Path(top)
            dirs[:] = [d for d in dirs if not d.startswith(".")]  # hidden and temporary: writers' and our own
            for d in list(dirs):
                try:
                    st = os.lstat(here / d)
                except OSError:
                    continue
                if stat.S_ISLNK(st.st_mode):
                    dirs.remove(d)
                    _, refusal = self._link(here / d, True)
                    if refusal is not None:
                        yield Entry(here / d, st, refusal)
            if not recursive:
                dirs[:] = []
            for name in names:
                if not name.startswith("."):
                    entry = self.entry(here / name)
                    if entry is not None:
                        yield entry

    def entry(self, path: Path) -> Entry | None:
        """``path`` under the rule (a link resolved per ``follow_symlinks``); None: not a regular file, or gone."""
        try:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                target, refusal = self._link(path, False)
                if refusal is not None:
                    return Entry(path, st, refusal)
                if target is None:
                    return None
                path, st = target, os.lstat(target)
        except OSError:
            return None  # gone since it was listed, or a link to nothing
        if not stat.S_ISREG(st.st_mode):
            return None  # FIFOs, sockets, devices: never trace files
        return Entry(path, st, self.owner_refusal(path, st))

    # -- opening ------------------------------------------------------------------------------------

    def open(self, path: Path, listed: os.stat_result | None = None) -> BinaryIO:
        """``path`` (under the spool) opened for reading without following any link below the spool.

        Raises ``SpoolRefusedError`` when the rule refuses what was opened, ``FileNotFoundError`` when the
        file is not the one listed (``listed``: its device and inode) or no longer a regular file.
        """
        try:
            parts = path.relative_to(self.root).parts
        except ValueError:
            raise SpoolRefusedError(Refusal("symlink_outside", f"not under the spool {self.root}: skipped")) from None
        if not parts:
            raise FileNotFoundError(errno.ENOENT, "the spool directory itself", os.fspath(path))
        dfd = os.open(self.root, _DIR_FLAGS)
        name = parts[0]
        try:
            for name in parts[:-1]:
                nfd = os.open(name, _DIR_FLAGS | _NOFOLLOW, dir_fd=dfd)
                os.close(dfd)
                dfd = nfd
            name = parts[-1]
            fd = os.open(name, _FILE_FLAGS, dir_fd=dfd)
        except OSError as exc:  # a link met: ELOOP for the file, ENOTDIR for a directory (O_DIRECTORY wins there)
            if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and _is_link(name, dfd)):
                why = f"{name} became a symbolic link since it was listed: skipped"
                raise SpoolRefusedError(Refusal("symlink", f"{why}; {LINK_FIX}")) from None
            raise
        finally:
            os.close(dfd)
        try:
            st = os.fstat(fd)
            same = listed is None or (st.st_dev, st.st_ino) == (listed.st_dev, listed.st_ino)
            if not stat.S_ISREG(st.st_mode) or not same:
                raise FileNotFoundError(errno.ENOENT, "replaced since it was listed", os.fspath(path))
            refusal = self.owner_refusal(path, st)
            if refusal is not None:
                raise SpoolRefusedError(refusal)
            return os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
