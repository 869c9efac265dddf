"""The ``file`` backend's reader: a captured tool output or sysfs tree, recognised by content.

``amd-smi metric --json`` (a JSON list, or ``{"gpu_data": [...]}``), ``rocm-smi --json``
(``{"card0": {...}}``), ``nvidia-smi -q -x`` (XML) and a sysfs tree as a ttar archive, each as it is or
gzip-compressed (decompressed within the same byte limit). The file is read again at every sample (a
capture that another process rewrites shows its new values; a truncated or malformed one is reported
with its name and the field at fault).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Final

import orjson

from aaco.agent.sources.smi.amd_smi import parse_amd_smi
from aaco.agent.sources.smi.nvidia_smi import parse_nvidia_smi
from aaco.agent.sources.smi.rocm_smi import parse_rocm_smi
from aaco.agent.sources.smi.sysfs import read_sysfs
from aaco.agent.sources.smi.sysfs_tree import ArchiveTree
from aaco.agent.sources.smi.ttar import TtarError
from aaco.agent.sources.smi.ttar import read as read_archive
from aaco.agent.sources.smi.values import TelemetryFormatError
from aaco.contract.telemetry import Snapshot

MAX_CAPTURE_BYTES: Final = 64 * 1024 * 1024
GZIP_MAGIC: Final = b"\x1f\x8b"
FORMATS: Final = ("amd-smi", "rocm-smi", "nvidia-smi", "sysfs")


def sniff(data: bytes) -> str:
    """Which capture format ``data`` is (one of ``FORMATS``), or ``""``."""
    head = data[:4096].lstrip()
    if head.startswith((b"<?xml", b"<nvidia_smi_log", b"<!DOCTYPE nvidia_smi_log")):
        return "nvidia-smi"
    first = next((ln for ln in head.splitlines() if ln.strip() and not ln.startswith(b"#")), b"")
    if first.startswith((b"Directory: ", b"Path: ")):
        return "sysfs"
    if head.startswith(b"["):
        return "amd-smi"
    if head.startswith(b"{"):
        return "amd-smi" if b'"gpu_data"' in head else "rocm-smi"
    return ""


def read_capture(path: Path, max_bytes: int = MAX_CAPTURE_BYTES) -> Snapshot:
    """Parse one capture file; ``TelemetryFormatError`` (naming the file) when it cannot be read at all."""
    subject = os.fspath(path)
    data = load(path, max_bytes)
    kind = sniff(data)
    if kind == "nvidia-smi":
        return parse_nvidia_smi(data, subject)
    if kind == "sysfs":
        try:
            archive = read_archive(data.decode(errors="replace"))
        except TtarError as exc:
            raise TelemetryFormatError(f"not a readable ttar archive: {exc}", subject=subject) from exc
        return read_sysfs(ArchiveTree(archive, subject))
    if kind in ("amd-smi", "rocm-smi"):
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            raise TelemetryFormatError(f"invalid or truncated JSON: {exc}", subject=subject) from exc
        return parse_amd_smi(doc, subject) if kind == "amd-smi" else parse_rocm_smi(doc, subject)
    raise TelemetryFormatError(
        "not a telemetry capture: expected amd-smi or rocm-smi JSON, nvidia-smi XML, or a sysfs ttar archive",
        subject=subject,
    )


def load(path: Path, max_bytes: int = MAX_CAPTURE_BYTES) -> bytes:
    """A capture file's bytes, decompressed if gzip; ``TelemetryFormatError`` naming it when it cannot be read."""
    subject = os.fspath(path)
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise TelemetryFormatError(f"{size} bytes, more than the {max_bytes}-byte limit", subject=subject)
        data = path.read_bytes()
    except FileNotFoundError as exc:
        raise TelemetryFormatError("no such file", subject=subject) from exc
    except IsADirectoryError as exc:
        raise TelemetryFormatError("is a directory, expected a capture file", subject=subject) from exc
    except OSError as exc:
        raise TelemetryFormatError(f"cannot read: {exc.strerror or exc}", subject=subject) from exc
    if data.startswith(GZIP_MAGIC):
        data = _gunzip(data, max_bytes, subject)
    return data


def _gunzip(data: bytes, max_bytes: int, subject: str) -> bytes:
    """A gzip capture decompressed, refused past ``max_bytes`` or when damaged."""
    d = zlib.decompressobj(31)
    try:
        out = d.decompress(data, max_bytes + 1)
    except zlib.error as exc:
        raise TelemetryFormatError(f"damaged gzip: {exc}", subject=subject) from exc
    if len(out) > max_bytes:
        raise TelemetryFormatError(f"more than the {max_bytes}-byte limit once decompressed", subject=subject)
    if not d.eof:
        raise TelemetryFormatError("cut gzip: the compressed stream ends early", subject=subject)
    return out
