"""ONNX graph summary: node count including subgraphs (If, Loop, Scan), op histogram, opsets.

The denominator of KAR. A node's subgraphs live in its attributes (``g`` for GRAPH, ``graphs`` for
GRAPHS); they are walked recursively and every node in them counts, since ONNX Runtime executes
them as nodes too. Nodes inside model-local functions are reported separately, not added: a call
to a function is one node of the graph that calls it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx


@dataclass(frozen=True)
class GraphSummary:
    """What a model's graph holds."""

    nodes: int
    top_level_nodes: int
    subgraphs: int
    ops: dict[str, int] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=dict)
    function_nodes: int = 0
    inputs: int = 0
    initializers: int = 0

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``aaco graph --json``)."""
        return {
            "nodes": self.nodes,
            "top_level_nodes": self.top_level_nodes,
            "subgraphs": self.subgraphs,
            "ops": dict(sorted(self.ops.items(), key=lambda kv: (-kv[1], kv[0]))),
            "opset": self.opsets,
            "function_nodes": self.function_nodes,
            "inputs": self.inputs,
            "initializers": self.initializers,
        }


def _walk(graph: onnx.GraphProto, ops: Counter[str]) -> tuple[int, int]:
    """Count nodes of ``graph`` and of every nested subgraph; return (nodes, subgraphs)."""
    import onnx

    nodes, subgraphs = 0, 0
    for node in graph.node:
        nodes += 1
        ops[node.op_type if not node.domain else f"{node.domain}.{node.op_type}"] += 1
        for attr in node.attribute:
            inner = []
            if attr.type == onnx.AttributeProto.GRAPH:
                inner = [attr.g]
            elif attr.type == onnx.AttributeProto.GRAPHS:
                inner = list(attr.graphs)
            for sub in inner:
                n, s = _walk(sub, ops)
                nodes += n
                subgraphs += s + 1
    return nodes, subgraphs


def summarize(model: onnx.ModelProto) -> GraphSummary:
    """Summarise a loaded model (pure: no file access)."""
    import onnx

    ops: Counter[str] = Counter()
    nodes, subgraphs = _walk(model.graph, ops)
    fn_ops: Counter[str] = Counter()
    fn_nodes = sum(_walk(onnx.GraphProto(node=f.node), fn_ops)[0] for f in model.functions)
    init_names = {i.name for i in model.graph.initializer}
    return GraphSummary(
        nodes=nodes,
        top_level_nodes=len(model.graph.node),
        subgraphs=subgraphs,
        ops=dict(ops),
        opsets={(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        function_nodes=fn_nodes,
        inputs=sum(1 for i in model.graph.input if i.name not in init_names),
        initializers=len(init_names),
    )
