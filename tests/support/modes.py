"""File modes in a tree: what the agent writes must be private (files 0640, directories 0750, or tighter)."""

from __future__ import annotations

import stat
from pathlib import Path


def loose(root: Path) -> list[str]:
    """Everything under ``root`` (``root`` included) looser than 0640 for files or 0750 for directories."""
    out = []
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        allowed = 0o750 if stat.S_ISDIR(st.st_mode) else 0o640
        if stat.S_IMODE(st.st_mode) & ~allowed:
            out.append(f"{path.relative_to(root)} {stat.S_IMODE(st.st_mode):o}")
    return out
