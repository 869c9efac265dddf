"""Read access to a sysfs tree: a directory on disk (``DirTree``) or a ttar capture (``ArchiveTree``).

``DirTree`` keeps the files read sample after sample open (sysfs regenerates an attribute on every
read at offset 0); a read that fails with a device error (ENODEV, EIO, ...: a GPU that fell off
the bus or is resetting) raises ``DeviceGoneError``, "not supported" errors read as no file.
``read_all`` reads a file to its end in pieces: a binary sysfs attribute (amdgpu's
``ras/gpu_vram_bad_pages``) answers one page of output per read.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final, Protocol

from aaco.agent.sources.smi.ttar import Archive

_UNAVAILABLE: Final = frozenset(
    {errno.EINVAL, errno.EOPNOTSUPP, errno.ENODATA, errno.EPERM, errno.EACCES, errno.ENOENT}
)


class DeviceGoneError(Exception):
    """A GPU's files failed with a device error: it fell off the bus or is resetting."""


class Tree(Protocol):
    """Read access to a sysfs tree (real, unpacked, or an archive in memory)."""

    name: str

    def read(self, rel: str) -> bytes | None:
        """The file's content; None when it does not exist or says "not supported"."""

    def read_all(self, rel: str, limit: int) -> bytes | None:
        """The file read to its end, at most ``limit`` + 1 bytes (more than ``limit``: cut); None as ``read``."""

    def listdir(self, rel: str) -> list[str]:
        """Entries of a directory (empty when it does not exist)."""

    def readlink(self, rel: str) -> str | None:
        """A symbolic link's target (None when not a link)."""

    def keep(self, rels: Iterable[str]) -> None:
        """Files read again and again: the tree may keep them open."""

    def forget(self, prefix: str) -> None:
        """Stop keeping open the files under ``prefix`` ("" for all)."""


class DirTree:
    """A sysfs tree on disk: ``root`` holds ``class/drm``.

    Files named by ``keep`` (at most ``max_open`` of them) stay open once read and are read again
    from their start with ``pread``, which sysfs answers with fresh content: an open and a close
    per reading cost more than the read itself (0.47 ms against 0.09 ms for 8 GPUs' 120 files).
    The tree is not shared between threads (its caller makes one call at a time).
    """

    def __init__(self, root: Path, max_open: int = 0) -> None:
        self.root = root
        self.name = os.fspath(root)
        self.max_open = max_open
        self._prefix = self.name.rstrip("/") + "/"  # plain strings: pathlib costs more than the reads
        self._kept: dict[str, int | None] = {}  # files to keep open -> descriptor (None: not open yet)

    def read(self, rel: str) -> bytes | None:
        """Read a file (sysfs files are small: 64 KiB at most)."""
        kept = rel in self._kept
        fd = self._kept.get(rel)
        if fd is None:
            fd = self._open(rel)
            if fd is None:
                return None
            if kept:
                self._kept[rel] = fd
        try:
            return os.pread(fd, 65536, 0) if kept else os.read(fd, 65536)
        except OSError as exc:
            if kept:
                self._kept[rel] = None  # opened again at the next read
                kept = False
            return _failed(rel, exc)
        finally:
            if not kept:
                os.close(fd)

    def read_all(self, rel: str, limit: int) -> bytes | None:
        """Read a file to its end in pieces (never kept open), at most ``limit`` + 1 bytes."""
        fd = self._open(rel)
        if fd is None:
            return None
        chunks: list[bytes] = []
        size = 0
        try:
            while size <= limit:
                chunk = os.read(fd, min(65536, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        except OSError as exc:
            return _failed(rel, exc)
        finally:
            os.close(fd)
        return b"".join(chunks)

    def _open(self, rel: str) -> int | None:
        try:
            return os.open(self._prefix + rel, os.O_RDONLY)
        except OSError as exc:
            if exc.errno == errno.ENOTDIR:
                return None
            return _failed(rel, exc)

    def keep(self, rels: Iterable[str]) -> None:
        """Keep these files open once read (as many as ``max_open`` allows)."""
        for rel in rels:
            if len(self._kept) >= self.max_open:
                return
            self._kept.setdefault(rel, None)

    def forget(self, prefix: str) -> None:
        """Close the kept files under ``prefix`` ("" for all) and stop keeping them."""
        for rel in [r for r in self._kept if r.startswith(prefix)]:
            fd = self._kept.pop(rel)
            if fd is not None:
                os.close(fd)

    def listdir(self, rel: str) -> list[str]:
        """Directory entries, sorted."""
        try:
            return sorted(os.listdir(self._prefix + rel))
        except OSError:
            return []

    def readlink(self, rel: str) -> str | None:
        """Link target, if a link."""
        try:
            return os.readlink(self._prefix + rel)
        except OSError:
            return None


class ArchiveTree:
    """A sysfs tree captured as a ttar archive; ``prefix`` is the archive path that holds ``class/drm``."""

    def __init__(self, archive: Archive, name: str) -> None:
        self.archive = archive
        self.name = name
        paths = list(archive.files) + list(archive.links) + sorted(archive.dirs)
        hit = next((p for p in paths if "class/drm" in p), None)
        self.prefix = hit[: hit.index("class/drm")] if hit else ""

    def read(self, rel: str) -> bytes | None:
        """The archived file."""
        return self.archive.files.get(self.prefix + rel)

    def read_all(self, rel: str, limit: int) -> bytes | None:
        """The archived file, at most ``limit`` + 1 bytes."""
        data = self.archive.files.get(self.prefix + rel)
        return None if data is None else data[: limit + 1]

    def listdir(self, rel: str) -> list[str]:
        """Children of an archived directory."""
        base = (self.prefix + rel).rstrip("/") + "/"
        every = [*self.archive.files, *self.archive.links, *self.archive.dirs]
        return sorted({p[len(base) :].split("/", 1)[0] for p in every if p.startswith(base)})

    def readlink(self, rel: str) -> str | None:
        """The archived link target."""
        return self.archive.links.get(self.prefix + rel)

    def keep(self, rels: Iterable[str]) -> None:
        """Nothing to keep open: the archive is in memory."""

    def forget(self, prefix: str) -> None:
        """Nothing kept open."""


def _failed(rel: str, exc: OSError) -> None:
    """A failed open or read: None for "not supported", ``DeviceGoneError`` for a device error."""
    if exc.errno in _UNAVAILABLE:
        return None
    raise DeviceGoneError(f"{rel}: {exc.strerror}") from exc


def text(tree: Tree, rel: str) -> str:
    """A small file's text, stripped ("" when it does not exist)."""
    data = tree.read(rel)
    return data.decode(errors="replace").strip() if data else ""
