"""What a trace format declares (``TraceFormat``) and the registry that recognises and parses by it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from aaco.agent.sources.traces.context import TraceContext
from aaco.agent.sources.traces.files import TraceFile
from aaco.agent.sources.traces.limits import TraceLimits
from aaco.agent.sources.traces.parsed import ParsedTrace

Sniff = Callable[[bytes], str | None]
Parse = Callable[[TraceFile, TraceContext, TraceLimits], Iterator[ParsedTrace]]


@dataclass(frozen=True)
class TraceFormat:
    """One trace format: the names its ``sniff`` gives, and the ``parse`` of a file of any of them.

    ``sniff(head)`` looks at the first ``files.SNIFF_BYTES`` of the (decompressed) content and gives
    one of ``names`` or None; it must not claim another registered format's files. ``parse(tf, ctx,
    limits)`` yields ``ParsedTrace`` chunks read within ``limits`` (bad rows counted, never raised).
    ``boottime``: its times are CLOCK_BOOTTIME (``clock_anchor`` re-anchors a file from another boot).
    ``iterations_first``: names whose files hold only iterations (published before kernel files).
    ``tailable``: names a tail reader can follow while the file grows.
    """

    names: tuple[str, ...]
    sniff: Sniff
    parse: Parse
    boottime: bool = False
    iterations_first: frozenset[str] = frozenset()
    tailable: frozenset[str] = frozenset()


class FormatRegistry:
    """The trace formats, in the order their sniffs are tried; a new format is one ``register`` line."""

    def __init__(self) -> None:
        self._formats: list[TraceFormat] = []
        self._by_name: dict[str, TraceFormat] = {}

    def register(self, fmt: TraceFormat) -> None:
        """Add a format; a name registered twice is a programming error."""
        for name in fmt.names:
            if name in self._by_name:
                raise ValueError(f"trace format {name!r} registered twice")
            self._by_name[name] = fmt
        self._formats.append(fmt)

    def sniff(self, head: bytes) -> str | None:
        """The name of the format whose content starts with ``head``, or None."""
        for fmt in self._formats:
            if (name := fmt.sniff(head)) is not None:
                return name
        return None

    def __iter__(self) -> Iterator[TraceFormat]:
        """The formats, in registration order."""
        return iter(self._formats)

    def get(self, name: str) -> TraceFormat | None:
        """The format that gives ``name``, None when no registered format does."""
        return self._by_name.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a sniff can give, in registration order."""
        return tuple(self._by_name)

    @property
    def boottime(self) -> frozenset[str]:
        """Names of the formats whose times are CLOCK_BOOTTIME."""
        return frozenset(n for f in self._formats if f.boottime for n in f.names)

    @property
    def iterations_first(self) -> frozenset[str]:
        """Names whose files hold iterations only (read them before the kernel traces of the same run)."""
        return frozenset().union(*(f.iterations_first for f in self._formats))

    @property
    def tailable(self) -> frozenset[str]:
        """Names a tail reader can follow while the file grows."""
        return frozenset().union(*(f.tailable for f in self._formats))
