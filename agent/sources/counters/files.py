"""Opening a counter capture within bounds, and the error that names a capture that cannot be read."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import Final, TextIO

from aaco.contract.errors import AacoError

MAX_BYTES: Final = 256 * 1024 * 1024


class WorkloadError(AacoError):
    """A counter capture that cannot be read (names the file and what is wrong)."""


def open_csv(path: Path) -> TextIO:
    """``path`` opened for the csv module, refused past ``MAX_BYTES`` (``WorkloadError`` naming it)."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise WorkloadError(f"more than {MAX_BYTES} bytes", subject=path)
        return open(path, newline="", encoding="utf-8", errors="replace")
    except OSError as exc:
        raise WorkloadError(f"cannot read: {exc.strerror or exc}", subject=path) from exc


def head(path: Path, size: int = 256) -> bytes:
    """A capture's first ``size`` bytes, decompressed when it is a ``.gz`` (``WorkloadError`` naming it)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path) as fh:
                return fh.read(size)
        with open(path, "rb") as fh:
            return fh.read(size)
    except (OSError, EOFError, zlib.error) as exc:
        raise WorkloadError(f"cannot read: {exc}", subject=path) from exc
