"""A reader for ttar, the plain-text tree archive of the Prometheus procfs fixtures.

Written here because no maintained Python package reads the format, and it is small. An archive
is a sequence of records separated by ``# ttar - - -`` comment lines:

    Directory: fixtures/sys/class/drm/card0        Path: fixtures/.../gpu_busy_percent
    Mode: 755                                      Lines: 1
                                                   4
                                                   Mode: 444
    Path: fixtures/.../driver
    SymlinkTo: ../../../../bus/pci/drivers/amdgpu

``Lines: N`` is followed by N lines of content; a last line ending in ``EOF`` marks a file without
a trailing newline, and ``Lines: N|base64`` content is base64 (binary files such as
``gpu_metrics``). ``read`` parses an archive into memory; ``unpack`` writes it below a directory.
"""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass, field
from pathlib import Path


class TtarError(ValueError):
    """An archive that does not follow the format (with the line number)."""


@dataclass
class Archive:
    """Files (path -> bytes), symbolic links (path -> target) and directories of one archive."""

    files: dict[str, bytes] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)


def read(text: str) -> Archive:
    """Parse a ttar archive; ``TtarError`` names the line where it stops making sense."""
    out = Archive()
    lines = text.split("\n")
    i = 0
    path: str | None = None
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition(": ")
        if not sep and line.endswith(":"):
            key, value = line[:-1], ""
        elif not sep:
            raise TtarError(f"line {i}: expected 'Key: value', got {line[:60]!r}")
        if key == "Directory":
            out.dirs.add(_clean(value, i))
            path = None
        elif key == "Path":
            path = _clean(value, i)
        elif key == "SymlinkTo":
            if path is None:
                raise TtarError(f"line {i}: SymlinkTo without a Path")
            out.links[path] = value
        elif key == "Lines":
            if path is None:
                raise TtarError(f"line {i}: Lines without a Path")
            count_text, _, encoding = value.partition("|")
            try:
                count = int(count_text)
            except ValueError as exc:
                raise TtarError(f"line {i}: Lines: {value!r} is not a count") from exc
            if i + count > len(lines):
                raise TtarError(f"line {i}: {path}: {count} line(s) announced, the archive ends first")
            body = lines[i : i + count]
            i += count
            data = "\n".join(body) + "\n" if count else ""
            if body and body[-1].endswith("EOF"):
                data = data[:-4]
            if encoding == "base64":
                try:
                    out.files[path] = base64.b64decode(data)
                except binascii.Error as exc:
                    raise TtarError(f"line {i}: {path}: bad base64: {exc}") from exc
            elif encoding:
                raise TtarError(f"line {i}: {path}: unknown encoding {encoding!r}")
            else:
                out.files[path] = data.encode()
        elif key == "Mode":
            continue
        else:
            raise TtarError(f"line {i}: unknown key {key!r}")
    return out


def _clean(path: str, line: int) -> str:
    norm = os.path.normpath(path)
    if norm.startswith(("/", "..")):
        raise TtarError(f"line {line}: path {path!r} leaves the archive")
    return norm


def unpack(archive: Archive, dest: Path) -> None:
    """Write ``archive`` below ``dest`` (directories, files, symbolic links)."""
    for d in sorted(archive.dirs):
        (dest / d).mkdir(parents=True, exist_ok=True)
    for p, data in archive.files.items():
        (dest / p).parent.mkdir(parents=True, exist_ok=True)
        (dest / p).write_bytes(data)
    for p, target in archive.links.items():
        (dest / p).parent.mkdir(parents=True, exist_ok=True)
        if not (dest / p).is_symlink():
            os.symlink(target, dest / p)
