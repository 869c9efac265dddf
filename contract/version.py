"""The installed AACO version, read from the package metadata once (it costs ~30 ms, so only on first use)."""

from __future__ import annotations

import functools


@functools.cache
def version() -> str:
    """The version of the installed ``aaco`` distribution, ``0+unknown`` in a never-installed tree."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("aaco")
    except PackageNotFoundError:
        return "0+unknown"
