"""The AACO node agent: sources, pipeline, service lifecycle and command line."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """``__version__`` is read from the installed metadata on first use (it costs ~30 ms at start-up)."""
    if name != "__version__":
        raise AttributeError(name)
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("aaco")
    except PackageNotFoundError:  # running from a source tree that was never installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value
