"""Copies of real ``nvidia-smi -q -x`` captures with one health field changed (tests; nothing checked in).

``with_field(src, dst, path, value)`` rewrites the text of the first element at ``path`` (slash-separated
tags under ``<gpu>``, as in the XML) and leaves every other byte of the document as it was.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

from tests.conftest import ROOT

H100 = ROOT / "examples" / "data" / "nvidia-smi" / "h100-sxm5-v13.xml.gz"
A100 = ROOT / "examples" / "data" / "nvidia-smi" / "a100-sxm4-v12.xml.gz"
T4 = ROOT / "tests" / "data" / "nvidia-smi" / "tesla-t4.xml"


def read_text(path: Path) -> str:
    """The capture's XML text (gzip or not)."""
    data = path.read_bytes()
    return (gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data).decode()


def with_field(src: Path, dst: Path, path: str, value: str) -> Path:
    """``src`` with the text of ``<gpu>/path`` set to ``value``, written (uncompressed) to ``dst``."""
    text = read_text(src)
    pattern = r"<gpu\b.*?" + r".*?".join(rf"<{tag}>" for tag in path.split("/")) + r"(?P<old>[^<]*)</"
    m = re.search(pattern, text, flags=re.DOTALL)
    if m is None:
        raise ValueError(f"{src.name}: no <gpu>/{path}")
    dst.write_text(text[: m.start("old")] + value + text[m.end("old") :])
    return dst
