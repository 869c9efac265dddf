"""The AACO node agent: sources, pipeline, service lifecycle and command line."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("aaco")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"
