"""ONNX graph summary: all nodes and the nodes that run, op histogram, what is folded at load, opsets.

The denominator of KAR (docs/kar.md). ``nodes`` counts every node, subgraphs included: a node's
subgraphs live in its attributes (``g`` for GRAPH, ``graphs`` for GRAPHS) and are walked
recursively. ``running_nodes`` leaves out the nodes ONNX Runtime folds at load (constant folding,
rule below), which launch no work. Nodes inside model-local functions are reported separately, not
added: a call to a function is one node of the graph that calls it.

The folding rule, after ONNX Runtime's ``ConstantFolding`` transformer (on at every optimisation
level above "disabled"). A node is folded when:

- its op is deterministic and free of side effects: an op of the ONNX domain other than the random
  ones and Dropout, or ``com.microsoft`` QuantizeLinear / DequantizeLinear; ops of any other domain
  (custom ops, model-local functions) are assumed to run, as ONNX Runtime assumes;
- it holds no subgraph (If, Loop, Scan are never folded themselves) and its outputs are tensors
  (sequence and optional producers are not folded);
- every input is a constant: an initializer, an empty optional input (``""``) or an output of a
  folded node. Graph inputs are not constants; an initializer that is also listed as a graph input
  is one only below IR version 4 (from IR 4 on it is a default the caller may override).

``Constant`` (no inputs) and ``ConstantOfShape`` of a constant shape follow from the rule. Inside a
subgraph the constants of the enclosing scopes stay visible and the subgraph's own inputs are not
constants, so a Loop body's nodes that read only outer constants fold and count as folded.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import onnx

ONNX_DOMAINS = frozenset({"", "ai.onnx"})
# ONNX Runtime's optimizer_utils::IsOperationDeterministic: the ONNX ops it never folds, and the only
# com.microsoft ops it does fold (every other domain is assumed non-deterministic).
NON_DETERMINISTIC_ONNX_OPS = frozenset(
    {"RandomUniform", "RandomNormal", "RandomUniformLike", "RandomNormalLike", "Multinomial", "Dropout"}
)
DETERMINISTIC_MS_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})
# ONNX ops whose output is a sequence or an optional, not a tensor: ONNX Runtime folds tensors only.
NON_TENSOR_OUTPUT_OPS = frozenset(
    {"SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SplitToSequence", "Optional"}
)


@dataclass(frozen=True)
class GraphSummary:
    """What a model's graph holds: all nodes and those that run once ONNX Runtime has folded constants."""

    nodes: int
    top_level_nodes: int
    subgraphs: int
    running_nodes: int = 0
    ops: dict[str, int] = field(default_factory=dict)
    folded_ops: dict[str, int] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=dict)
    function_nodes: int = 0
    inputs: int = 0
    initializers: int = 0

    @property
    def folded_nodes(self) -> int:
        """Nodes folded at load (``nodes - running_nodes``)."""
        return self.nodes - self.running_nodes

    def opset_text(self) -> str:
        """The opsets as ``domain:version`` pairs, e.g. ``ai.onnx:17 com.microsoft:1``."""
        return " ".join(f"{d}:{v}" for d, v in sorted(self.opsets.items())) or "-"

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``aaco graph --json``)."""

        def by_count(counts: dict[str, int]) -> dict[str, int]:
            return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

        return {
            "nodes": self.nodes,
            "running_nodes": self.running_nodes,
            "folded_nodes": self.folded_nodes,
            "top_level_nodes": self.top_level_nodes,
            "subgraphs": self.subgraphs,
            "ops": by_count(self.ops),
            "folded_ops": by_count(self.folded_ops),
            "opset": self.opsets,
            "function_nodes": self.function_nodes,
            "inputs": self.inputs,
            "initializers": self.initializers,
        }


class _Scope:
    """The constants visible in one graph: its own, then its enclosing scopes' (minus names it shadows)."""

    def __init__(self, constants: set[str], shadowed: set[str], parent: _Scope | None) -> None:
        self.constants = constants
        self.shadowed = shadowed
        self.parent = parent

    def is_constant(self, name: str) -> bool:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.constants:
                return True
            if name in scope.shadowed:
                return False
            scope = scope.parent
        return False


@dataclass
class _Tally:
    nodes: int = 0
    subgraphs: int = 0
    ops: Counter[str] = field(default_factory=Counter)
    folded: Counter[str] = field(default_factory=Counter)


def _op_key(node: onnx.NodeProto) -> str:
    return node.op_type if not node.domain else f"{node.domain}.{node.op_type}"


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    import onnx

    out: list[onnx.GraphProto] = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            out.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            out.extend(attr.graphs)
    return out


def _foldable_op(node: onnx.NodeProto) -> bool:
    """Whether ONNX Runtime may fold this node once its inputs are constants."""
    if node.domain in ONNX_DOMAINS:
        return node.op_type not in NON_DETERMINISTIC_ONNX_OPS and node.op_type not in NON_TENSOR_OUTPUT_OPS
    return node.domain == "com.microsoft" and node.op_type in DETERMINISTIC_MS_OPS


def _scope(graph: onnx.GraphProto, parent: _Scope | None, overridable: bool) -> _Scope:
    inputs = {i.name for i in graph.input}
    names = [t.name for t in graph.initializer] + [s.values.name for s in graph.sparse_initializer]
    constants = {n for n in names if not (overridable and n in inputs)}
    return _Scope(constants, inputs - constants, parent)


def _fold(graph: onnx.GraphProto, scope: _Scope, subs: list[list[onnx.GraphProto]]) -> list[bool]:
    """Which nodes of ``graph`` fold, adding their outputs to ``scope``'s constants.

    A worklist over input names rather than one pass in file order, so a graph whose nodes are not
    stored topologically (ONNX Runtime sorts them itself) folds the same; linear in the edges.
    """
    folded = [False] * len(graph.node)
    pending = [0] * len(graph.node)
    waiting: dict[str, list[int]] = {}
    ready: list[int] = []
    for i, node in enumerate(graph.node):
        if subs[i] or not _foldable_op(node):
            pending[i] = -1
            continue
        for name in {n for n in node.input if n}:
            if not scope.is_constant(name):
                pending[i] += 1
                waiting.setdefault(name, []).append(i)
        if pending[i] == 0:
            ready.append(i)
    while ready:
        i = ready.pop()
        folded[i] = True
        for name in graph.node[i].output:
            if not name or scope.is_constant(name):
                continue
            scope.constants.add(name)
            for j in waiting.pop(name, ()):
                pending[j] -= 1
                if pending[j] == 0:
                    ready.append(j)
    return folded


def _walk(graph: onnx.GraphProto, parent: _Scope | None, overridable: bool, tally: _Tally) -> None:
    """Count the nodes of ``graph`` and of every nested subgraph, and those folded at load."""
    scope = _scope(graph, parent, overridable)
    subs = [_subgraphs(node) for node in graph.node]
    folded = _fold(graph, scope, subs)
    for node, inner, is_folded in zip(graph.node, subs, folded, strict=True):
        key = _op_key(node)
        tally.nodes += 1
        tally.ops[key] += 1
        if is_folded:
            tally.folded[key] += 1
        for sub in inner:
            tally.subgraphs += 1
            _walk(sub, scope, overridable, tally)


def summarize(model: onnx.ModelProto) -> GraphSummary:
    """Summarise a loaded model (pure: no file access)."""
    import onnx

    tally = _Tally()
    # From IR version 4 on an initializer listed among the graph inputs is an overridable default.
    overridable = model.ir_version >= 4
    _walk(model.graph, None, overridable, tally)
    functions = _Tally()
    for f in model.functions:
        _walk(onnx.GraphProto(node=f.node), None, overridable, functions)
    init_names = {i.name for i in model.graph.initializer}
    return GraphSummary(
        nodes=tally.nodes,
        top_level_nodes=len(model.graph.node),
        subgraphs=tally.subgraphs,
        running_nodes=tally.nodes - sum(tally.folded.values()),
        ops=dict(tally.ops),
        folded_ops=dict(tally.folded),
        opsets={(o.domain or "ai.onnx"): int(o.version) for o in model.opset_import},
        function_nodes=functions.nodes,
        inputs=sum(1 for i in model.graph.input if i.name not in init_names),
        initializers=len(init_names),
    )
