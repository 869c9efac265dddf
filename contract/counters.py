"""Hardware counters per dispatch (docs/counters.md): one row per kernel dispatch and counter.

Read from rocprofv3's counter collection (``--pmc``) and rocprof-compute workloads; joined to the
kernel rows by the dispatch (its ``correlation_id`` where the capture has one, else its
``dispatch_id`` and device). ``start_ns``/``end_ns`` are the dispatch's where the capture times it
(0 where it does not).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple


class CounterRow(NamedTuple):
    """One counter's value for one dispatch."""

    start_ns: int
    end_ns: int
    pid: int | None
    device: str
    dispatch_id: int
    correlation_id: int | None
    kernel: str
    counter: str
    value: float
    op_name: str = ""  # the framework operator that launched it, innermost (PyTorch's aten::cudnn_convolution)
    top_op: str = ""  # the outermost one (aten::conv2d)


@dataclass
class Dispatch:
    """One dispatch and its counters (by name)."""

    dispatch_id: int
    kernel: str
    device: str
    start_ns: int
    end_ns: int
    correlation_id: int | None = None
    pid: int | None = None
    counters: dict[str, float] = field(default_factory=dict)

    def rows(self) -> Iterator[CounterRow]:
        """One row per counter."""
        for name, value in self.counters.items():
            yield CounterRow(
                self.start_ns,
                self.end_ns,
                self.pid,
                self.device,
                self.dispatch_id,
                self.correlation_id,
                self.kernel,
                name,
                value,
            )


def dispatches(rows: Iterable[CounterRow]) -> list[Dispatch]:
    """Rows folded into their dispatches (by pid, device and dispatch id), in order of first appearance."""
    out: dict[tuple[int | None, str, int], Dispatch] = {}
    for r in rows:
        key = (r.pid, r.device, r.dispatch_id)
        d = out.get(key)
        if d is None:
            d = out[key] = Dispatch(r.dispatch_id, r.kernel, r.device, r.start_ns, r.end_ns, r.correlation_id, r.pid)
        d.counters[r.counter] = r.value
    return list(out.values())
