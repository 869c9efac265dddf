"""The lifecycle every component declares, and the registry each kind of component is built from.

A component (an exporter, a receiver, an analyzer) is built from its configuration by the factory
it registers, then ``start``ed, used, and ``shutdown`` once with a deadline in seconds:

- ``start`` may raise (a port in use, a bad certificate): the agent stops what it already started.
- ``shutdown(timeout_s)`` returns within ``timeout_s`` (plus a small constant), is idempotent, and is
  safe before ``start``; what it cannot finish in time it drops, counted.
- ``force_flush(timeout_s)`` (``Flushing`` components only) sends what is held and says whether all of
  it went.

Sources are threads rather than services: they ``run(ctx)`` until ``ctx.stop`` (aaco.agent.sources.base).
``tests/unit/test_component_contract.py`` runs every registered component through this lifecycle,
as the OpenTelemetry Collector's componenttest does.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aaco.contract.errors import ConfigError

T = TypeVar("T")


class Component(ABC):  # noqa: B024 - both hooks are optional; the class declares the contract
    """Something the agent starts once and shuts down once, against a deadline."""

    def start(self) -> None:  # noqa: B027 - optional hook
        """Acquire what the component needs (ports, threads, files)."""

    def shutdown(self, timeout_s: float) -> None:  # noqa: B027 - optional hook
        """Release everything within ``timeout_s``; idempotent, safe before ``start``."""


class Flushing(Component):
    """A component that holds data on its way out and can be asked to send it now."""

    @abstractmethod
    def force_flush(self, timeout_s: float) -> bool:
        """Send what is held within ``timeout_s``; True when nothing is left."""


@dataclass(frozen=True)
class Registration(Generic[T]):
    """One kind of component: its name in the configuration, its settings model and its factory."""

    kind: str
    config: type[Any]
    factory: Callable[..., T]


class Registry(Generic[T]):
    """The components of one kind, by name; a new component is one ``register`` line."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: dict[str, Registration[T]] = {}

    def register(self, kind: str, config: type[Any], factory: Callable[..., T]) -> None:
        """Add a component; a name registered twice is a programming error."""
        if kind in self._items:
            raise ValueError(f"{self.what} {kind!r} is registered twice")
        self._items[kind] = Registration(kind, config, factory)

    def __getitem__(self, kind: str) -> Registration[T]:
        try:
            return self._items[kind]
        except KeyError:
            known = ", ".join(sorted(self._items))
            raise ConfigError(None, [f"unknown {self.what} {kind!r}; known: {known}"]) from None

    def __contains__(self, kind: object) -> bool:
        return kind in self._items

    def __iter__(self) -> Iterator[Registration[T]]:
        return iter(self._items.values())

    def kinds(self) -> list[str]:
        """The registered names, in registration order."""
        return list(self._items)
