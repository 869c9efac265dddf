"""The AACO node agent: sources, pipeline, service lifecycle and command line."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    """``__version__`` is read from the installed metadata on first use (see ``aaco.contract.version``)."""
    if name != "__version__":
        raise AttributeError(name)
    from aaco.contract.version import version

    return version()
