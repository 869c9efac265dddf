"""Kernel amplification ratio (KAR): kernels launched per iteration over the model's graph nodes that run.

``KAR = (kernels in iterations of the model / iterations of the model) / running graph nodes``. The
running nodes (``agent.sources.ort.onnx_graph``, rule in docs/kar.md) are the nodes of the model, subgraphs
included, less those ONNX Runtime folds at load (constant folding), which launch no work. The
source that knows the model carries them on the iteration rows as ``graph_nodes`` (the ``ort``
source counts them so). Only ``kind == "kernel"`` events count (copies and memsets are not launches
of graph work). With ONNX Runtime's optimised graph known (``graph_nodes_optimized``: after folding
and fusion), KAR against it is reported too. Bands follow the seeds: about 1 or below is well
fused, above 2 worth a look, above 5 severe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc

from aaco.analyzers.base import AgentHints, Analyzer, ratio
from aaco.analyzers.grouping import group
from aaco.contract.config_base import StrictModel
from aaco.contract.schemas import EventBatch
from aaco.contract.signals import MetricPoint, PointBuilder, define

KAR_RATIO = define(
    "aaco.kar",
    "aaco_kar_ratio",
    "gauge",
    "1",
    "Kernel amplification ratio: kernels per iteration / ONNX graph nodes that run (not folded at load).",
    ("node", "model"),
)
KERNELS_PER_ITERATION = define(
    "aaco.iteration.kernels",
    "aaco_kernels_per_iteration",
    "gauge",
    "{kernel}",
    "Mean kernels launched per iteration.",
    ("node", "model"),
)
GRAPH_NODES = define(
    "aaco.model.graph.nodes",
    "aaco_model_graph_nodes",
    "gauge",
    "{node}",
    "ONNX graph nodes of the model that run: subgraphs included, nodes folded at load left out.",
    ("node", "model"),
)


def kar_band(value: float | None) -> str | None:
    """Health band of a KAR value."""
    if value is None:
        return None
    if value <= 2.0:
        return "good"
    return "investigate" if value <= 5.0 else "severe"


@dataclass(frozen=True)
class KarRow:
    """KAR of one model: kernels per iteration over its running graph nodes (and its optimised ones)."""

    kar: float | None
    kernels_per_iteration: float | None
    graph_nodes: int | None
    graph_nodes_optimized: int | None
    kar_optimized: float | None
    iterations: int
    kernels: int

    @property
    def band(self) -> str | None:
        """The health band of ``kar``."""
        return kar_band(self.kar)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``band`` included)."""
        return {
            "kar": self.kar,
            "band": self.band,
            "kernels_per_iteration": self.kernels_per_iteration,
            "graph_nodes": self.graph_nodes,
            "graph_nodes_optimized": self.graph_nodes_optimized,
            "kar_optimized": self.kar_optimized,
            "iterations": self.iterations,
            "kernels": self.kernels,
        }


@dataclass(frozen=True)
class KarResult:
    """KAR per (node, model) and the headline value."""

    models: Mapping[tuple[str, str], KarRow]

    @property
    def value(self) -> float | None:
        """The headline KAR: the model's, or the iteration-weighted mean over models."""
        known = [(m.kar, m.iterations) for m in self.models.values() if m.kar is not None]
        if not known:
            return None
        weight = sum(w for _, w in known)
        return sum(k * w for k, w in known) / weight if weight else None

    def to_dict(self) -> dict[str, Any]:
        """``{"value", "band", "models": {...}}``."""
        nodes = {n for n, _ in self.models}
        return {
            "value": self.value,
            "band": kar_band(self.value),
            "models": {
                (m if len(nodes) <= 1 else f"{n}/{m}"): v.to_dict() for (n, m), v in sorted(self.models.items())
            },
        }

    def points(self) -> list[MetricPoint]:
        """KAR, kernels per iteration and graph node gauges."""
        pb = PointBuilder()
        for (node, model), m in self.models.items():
            if m.kar is not None:
                pb.add(KAR_RATIO, m.kar, node=node, model=model)
            if m.kernels_per_iteration is not None:
                pb.add(KERNELS_PER_ITERATION, m.kernels_per_iteration, node=node, model=model)
            if m.graph_nodes:
                pb.add(GRAPH_NODES, m.graph_nodes, node=node, model=model)
        return pb.points


class KarSettings(StrictModel):
    """Kernels per iteration (KAR): no settings of its own (analyzers.max_models bounds it)."""


class KarAnalyzer(Analyzer):
    """Counts iterations and their kernels per model."""

    name = "kar"
    kinds = frozenset({"iterations", "kernels"})

    def __init__(self, max_models: int = 256) -> None:
        self._max_models = max_models
        self._iterations: dict[tuple[str, str], int] = {}
        self._kernels: dict[tuple[str, str], int] = {}
        self._nodes: dict[tuple[str, str], tuple[int | None, int | None]] = {}

    def _room(self, key: tuple[str, str]) -> bool:
        if key in self._iterations or key in self._kernels:
            return True
        return len(set(self._iterations) | set(self._kernels)) < self._max_models

    def update(self, item: EventBatch) -> None:
        """Fold iterations (counts, graph sizes) or correlated kernels in."""
        b = item.batch
        if b.num_rows == 0:
            return
        if item.kind == "iterations":
            cols = b.select(["node", "model", "graph_nodes", "graph_nodes_optimized"]).to_pylist()
            for row in cols:
                key = (row["node"], row["model"] or "unknown")
                if not self._room(key):
                    continue
                self._iterations[key] = self._iterations.get(key, 0) + 1
                old = self._nodes.get(key, (None, None))
                self._nodes[key] = (row["graph_nodes"] or old[0], row["graph_nodes_optimized"] or old[1])
            return
        mask = pc.and_(
            pc.and_(pc.equal(b.column("kind"), "kernel"), pc.is_valid(b.column("model"))),
            pc.is_valid(b.column("iteration")),
        ).to_numpy(zero_copy_only=False)
        if not mask.any():
            return
        groups = group(b.column("node"), b.column("model"))
        counts = np.bincount(groups.index[mask], minlength=len(groups.keys))
        for key, n in zip(groups.keys, counts.tolist(), strict=True):
            if n and self._room(key):
                self._kernels[key] = self._kernels.get(key, 0) + n

    def snapshot(self) -> KarResult:
        """KAR per model from the counts so far, over the running graph nodes the iterations carried."""
        out: dict[tuple[str, str], KarRow] = {}
        for key in set(self._iterations) | set(self._kernels):
            iters = self._iterations.get(key, 0)
            kernels = self._kernels.get(key, 0)
            g, go = self._nodes.get(key, (None, None))
            kpi = ratio(kernels, iters)
            kar = ratio(kpi, g) if (kpi is not None and g) else None
            out[key] = KarRow(kar, kpi, g, go, ratio(kpi, go) if (kpi is not None and go) else None, iters, kernels)
        return KarResult(out)


def create(s: KarSettings, hints: AgentHints, max_models: int) -> KarAnalyzer:
    """The analyzer for its settings and what the agent derives from its sources."""
    return KarAnalyzer(max_models=max_models)
