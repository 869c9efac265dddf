"""Opening a counter capture within bounds, and the error that names a capture that cannot be read."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, TextIO

import orjson

from aaco.agent.sources.traces.limits import TraceLimits, read_document
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


def load_json(path: Path, problems: list[str]) -> Any:
    """A JSON capture's document, read within ``MAX_BYTES``; None (said in ``problems``) when its gzip is damaged."""
    try:
        doc = read_document(path, TraceLimits(max_file_bytes=MAX_BYTES))
    except OSError as exc:
        raise WorkloadError(f"cannot read: {exc}", subject=path) from exc
    if doc.damage:
        problems.append(f"{path}: damaged compression ({doc.damage}): not read")
        return None
    try:
        return orjson.loads(doc.data)
    except orjson.JSONDecodeError as exc:
        raise WorkloadError(f"not JSON: {exc}", subject=path) from exc
