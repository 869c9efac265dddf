"""Devices: rocprof agent labels and handles translated to the GPU ordinals the telemetry sources use.

Rocprof tools name an agent (a CPU or GPU node of the HSA topology) in several ways
(``Agent 4`` by absolute or logical node index, ``GPU 0`` by index among GPUs, a bare node id in
older layouts, an opaque handle in JSON). A user grouping kernels by device expects one group per
physical GPU, named the way the telemetry sources name it: the GPU ordinal (``"0"``, ``"1"``,
...), which is the agent's index among GPU agents (``logical_node_type_id``). ``AgentMap`` does
that translation when agent information is available (``agent_info.csv``, JSON ``agents``, rocpd
``rocpd_info_agent``) and keeps the device's names (``gfx90a``, ``AMD Instinct MI210``) in
``ParsedTrace.devices``: ``{"0": {"name": ..., "product_name": ..., "agent": ..., ...}}``. Without
agent information the device is the label the tool wrote (``Agent 4``), unchanged.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from aaco.agent.sources.traces.tables import STR
from aaco.agent.sources.traces.u64 import U64_MASK

_LABEL = re.compile(r"^\s*(?:(Agent|GPU|CPU)\s+)?(-?\d+)\s*$", re.I)


@dataclass(frozen=True)
class Agent:
    """One HSA agent as the trace describes it."""

    node_id: int | None
    logical_node_id: int | None
    type: str  # "GPU" | "CPU" | "UNK"
    type_index: int | None  # index among agents of its type: the GPU ordinal for GPUs
    name: str | None = None  # gfx target, e.g. gfx90a
    product_name: str | None = None  # e.g. AMD Instinct MI210
    handle: int | None = None  # the JSON agent handle / rocpd row id

    @property
    def device(self) -> str:
        """The ``device`` string of this agent's events: the GPU ordinal, or ``cpu<N>``."""
        if self.type == "GPU" and self.type_index is not None:
            return str(self.type_index)
        if self.type == "CPU":
            return f"cpu{self.type_index if self.type_index is not None else self.node_id}"
        return f"agent{self.node_id}"

    def describe(self, label: str | None = None) -> dict[str, Any]:
        """The documented mapping entry kept in ``ParsedTrace.devices``."""
        return {
            "type": self.type,
            "name": self.name,
            "product_name": self.product_name,
            "node_id": self.node_id,
            "logical_node_id": self.logical_node_id,
            **({"label": label} if label is not None else {}),
        }


class AgentMap:
    """Translates the agent labels and handles a trace uses into device strings (see module doc)."""

    def __init__(self, agents: Iterable[Agent] = ()) -> None:
        self.agents = list(agents)
        self._by_node = {a.node_id: a for a in self.agents if a.node_id is not None}
        self._by_logical = {a.logical_node_id: a for a in self.agents if a.logical_node_id is not None}
        self._by_handle = {a.handle & U64_MASK: a for a in self.agents if a.handle is not None}
        self._gpus = {a.type_index: a for a in self.agents if a.type == "GPU" and a.type_index is not None}
        self.used: dict[str, dict[str, Any]] = {}

    @staticmethod
    def with_type_indexes(agents: list[Agent]) -> list[Agent]:
        """Fill in missing type indexes: agents of one type numbered in logical-node order."""
        out: list[Agent] = []
        counters: Counter[str] = Counter()
        for a in sorted(agents, key=lambda a: a.logical_node_id if a.logical_node_id is not None else 1 << 30):
            idx = a.type_index if a.type_index is not None else counters[a.type]
            counters[a.type] += 1
            out.append(Agent(a.node_id, a.logical_node_id, a.type, idx, a.name, a.product_name, a.handle))
        return out

    def __bool__(self) -> bool:
        return bool(self.agents)

    def resolve_label(self, label: str | None) -> str | None:
        """Device string for an agent label (``Agent 4``, ``GPU 0``, ``4``); the label itself if unknown."""
        if label is None:
            return None
        m = _LABEL.match(label)
        agent: Agent | None = None
        if m:
            kind, num = (m.group(1) or "").lower(), int(m.group(2))
            if kind == "gpu":
                agent = self._gpus.get(num)
                if agent is None:
                    return str(num)  # type-relative labels already are GPU ordinals
            elif kind == "cpu":
                return f"cpu{num}"
            else:  # absolute (node id) first, then logical index: they agree on almost every system
                agent = self._by_node.get(num) or self._by_logical.get(num)
        if agent is None:
            return label
        self.used.setdefault(agent.device, agent.describe(label))
        return agent.device

    def resolve_handle(self, handle: int | None) -> str | None:
        """Device string for a JSON agent handle / rocpd agent row id; ``agent<handle>`` if unknown.

        Handles are unsigned 64-bit (``u64``): a negative int means the same 64 bits.
        """
        if handle is None:
            return None
        handle &= U64_MASK
        agent = self._by_handle.get(handle)
        if agent is None:
            return f"agent{handle}"
        self.used.setdefault(agent.device, agent.describe())
        return agent.device

    def map_labels(self, labels: pa.Array | pa.ChunkedArray) -> pa.Array:
        """Vectorised ``resolve_label`` over a string or dictionary column (few distinct values)."""
        if isinstance(labels, pa.ChunkedArray):
            labels = labels.combine_chunks() if labels.num_chunks != 1 else labels.chunk(0)
        if not pa.types.is_dictionary(labels.type):
            labels = pc.dictionary_encode(labels)
        values = [self.resolve_label(v) for v in labels.dictionary.to_pylist()]
        return pa.array(values, STR).take(labels.indices)

    def map_handles(self, handles: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
        """Vectorised ``resolve_handle`` over a ``uint64`` (or int64, same bits) array; null where not ``valid``."""
        if handles.size == 0:
            return pa.array([], STR)
        uniq, inv = np.unique(handles.view(np.uint64), return_inverse=True)
        values = [self.resolve_handle(int(h)) for h in uniq]
        mask = None if valid is None else ~valid
        return pa.array(values, STR).take(pa.array(inv.reshape(-1).astype(np.int64), mask=mask))
