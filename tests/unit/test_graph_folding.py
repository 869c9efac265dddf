"""The folding rule behind KAR's denominator (analyzers.graph, docs/kar.md), checked against ONNX Runtime.

Each small graph states which of its nodes run; where ONNX Runtime can load the graph, the nodes of
the model it writes after its basic optimisations (with only constant folding left on) must number
exactly the running nodes the rule counts.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from aaco.agent.sources.ort.onnx_graph import summarize

# The basic-level transformers other than ConstantFolding that could remove nodes of these graphs.
OTHER_BASIC_TRANSFORMERS = ["Level1_RuleBasedTransformer", "CommonSubexpressionElimination", "ConstantSharing"]


def vi(name: str, elem: int = TensorProto.FLOAT, shape=("N", 4)) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def tensor(name: str, values, elem: int = TensorProto.FLOAT) -> onnx.TensorProto:
    a = np.asarray(values)
    return helper.make_tensor(name, elem, list(a.shape), a.flatten().tolist())


W = tensor("w", [[0.5, 0.25, 2.0, 3.0]])


def model(nodes, inputs, outputs, inits=(), ir: int = 8, opset: int = 17, domains=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", opset), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir)


def count_nodes(graph: onnx.GraphProto) -> int:
    n = 0
    for node in graph.node:
        n += 1
        for attr in node.attribute:
            n += sum(count_nodes(g) for g in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs))
    return n


def ort_running_nodes(m: onnx.ModelProto, tmp_path) -> int:
    """Nodes, subgraphs included, of the model ONNX Runtime keeps after constant folding."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    so.optimized_model_filepath = str(tmp_path / "folded.onnx")
    so.log_severity_level = 3
    ort.InferenceSession(
        m.SerializeToString(), so, providers=["CPUExecutionProvider"], disabled_optimizers=OTHER_BASIC_TRANSFORMERS
    )
    return count_nodes(onnx.load(so.optimized_model_filepath).graph)


def constant_chain() -> onnx.ModelProto:
    # Constant -> Neg -> Add(initializer) fold; Mul with the graph input runs.
    return model(
        [
            helper.make_node("Constant", [], ["c"], value=tensor("v", [[1.5, 2.5, 3.5, 4.5]])),
            helper.make_node("Neg", ["c"], ["n"]),
            helper.make_node("Add", ["n", "w"], ["a"]),
            helper.make_node("Mul", ["x", "a"], ["y"]),
        ],
        [vi("x")],
        [vi("y")],
        [W],
    )


def constant_of_constant_shape() -> onnx.ModelProto:
    return model(
        [
            helper.make_node("ConstantOfShape", ["s"], ["k"], value=tensor("v", [0.75])),
            helper.make_node("Add", ["x", "k"], ["y"]),
        ],
        [vi("x")],
        [vi("y")],
        [tensor("s", [4], TensorProto.INT64)],
    )


def constant_of_runtime_shape() -> onnx.ModelProto:
    # The shape comes from the input (its batch dimension is symbolic): nothing folds.
    return model(
        [
            helper.make_node("Shape", ["x"], ["s"]),
            helper.make_node("ConstantOfShape", ["s"], ["k"], value=tensor("v", [0.75])),
            helper.make_node("Add", ["x", "k"], ["y"]),
        ],
        [vi("x")],
        [vi("y")],
    )


def mixed_inputs() -> onnx.ModelProto:
    # Mul(w, w) folds; Add(initializer, graph input) runs, and so does what follows it.
    return model(
        [
            helper.make_node("Mul", ["w", "w"], ["ww"]),
            helper.make_node("Add", ["ww", "x"], ["a"]),
            helper.make_node("Relu", ["a"], ["y"]),
        ],
        [vi("x")],
        [vi("y")],
        [W],
    )


def random_ops() -> onnx.ModelProto:
    # Random ops have no graph input to wait for, yet are not deterministic: they run, and so
    # does the Neg on their output.
    return model(
        [
            helper.make_node("RandomNormal", [], ["r"], shape=[1, 4], seed=1.0),
            helper.make_node("RandomUniformLike", ["w"], ["u"], seed=2.0),
            helper.make_node("Neg", ["r"], ["nr"]),
            helper.make_node("Add", ["nr", "u"], ["k"]),
            helper.make_node("Add", ["x", "k"], ["y"]),
        ],
        [vi("x")],
        [vi("y")],
        [W],
    )


def overridable_initializer(ir: int) -> onnx.ModelProto:
    # "s" is an initializer and a graph input: a constant below IR 4, an overridable default from IR 4 on.
    return model(
        [
            helper.make_node("ConstantOfShape", ["s"], ["k"], value=tensor("v", [0.75])),
            helper.make_node("Add", ["x", "k"], ["y"]),
        ],
        [vi("x"), vi("s", TensorProto.INT64, (1,))],
        [vi("y")],
        [tensor("s", [4], TensorProto.INT64)],
        ir=ir,
        opset=9,
    )


def empty_optional_input() -> onnx.ModelProto:
    # Clip(w, <no min>, max) folds: an empty name is an absent optional input, not a runtime value.
    return model(
        [helper.make_node("Clip", ["w", "", "hi"], ["c"]), helper.make_node("Add", ["x", "c"], ["y"])],
        [vi("x")],
        [vi("y")],
        [W, tensor("hi", 1.0)],
    )


def sequence_ops() -> onnx.ModelProto:
    # ONNX Runtime folds tensors only: a sequence of constants is built at run time, and so is what reads it.
    return model(
        [
            helper.make_node("SequenceConstruct", ["w", "w"], ["seq"]),
            helper.make_node("SequenceAt", ["seq", "i"], ["e"]),
            helper.make_node("Add", ["x", "e"], ["y"]),
        ],
        [vi("x")],
        [vi("y")],
        [W, tensor("i", 1, TensorProto.INT64)],
    )


def dropout_of_constant() -> onnx.ModelProto:
    return model(
        [helper.make_node("Dropout", ["w"], ["d"]), helper.make_node("Add", ["x", "d"], ["y"])],
        [vi("x")],
        [vi("y")],
        [W],
    )


def unsorted_chain() -> onnx.ModelProto:
    # The constant chain stored in reverse order: the rule does not depend on the order of the file.
    m = constant_chain()
    nodes = list(m.graph.node)[::-1]
    del m.graph.node[:]
    m.graph.node.extend(nodes)
    return m


def control_flow() -> onnx.ModelProto:
    """If and Loop whose bodies read outer constants, their own inputs and the graph input.

    Outer: ``c = Neg(w)`` folds. Then-branch: ``Mul(c, c)`` folds (outer constants only), the Add with
    ``x`` runs. Else-branch: a Constant folds, the Sub with ``x`` runs. Loop body: ``Abs(c)`` folds,
    ``Add(v_in, a)`` reads the body's own input and runs, the Identity of the condition runs. If and
    Loop themselves always run.
    """
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["c", "c"], ["cc"]), helper.make_node("Add", ["x", "cc"], ["then_out"])],
        "then",
        [],
        [vi("then_out")],
    )
    else_g = helper.make_graph(
        [
            helper.make_node("Constant", [], ["k"], value=tensor("kv", [[1.25, 1.5, 1.75, 2.25]])),
            helper.make_node("Sub", ["x", "k"], ["else_out"]),
        ],
        "else",
        [],
        [vi("else_out")],
    )
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Abs", ["c"], ["a"]),
            helper.make_node("Add", ["v_in", "a"], ["v_out"]),
        ],
        "body",
        [vi("iter", TensorProto.INT64, ()), vi("cond_in", TensorProto.BOOL, ()), vi("v_in")],
        [vi("cond_out", TensorProto.BOOL, ()), vi("v_out")],
    )
    return model(
        [
            helper.make_node("Neg", ["w"], ["c"]),
            helper.make_node("If", ["cond"], ["b"], then_branch=then_g, else_branch=else_g),
            helper.make_node("Loop", ["trip", "cond", "b"], ["y"], body=body),
        ],
        [vi("cond", TensorProto.BOOL, ()), vi("x")],
        [vi("y")],
        [W, tensor("trip", 3, TensorProto.INT64)],
    )


CASES = [
    # (graph, running nodes, folded nodes by op type)
    (constant_chain, 1, {"Constant": 1, "Neg": 1, "Add": 1}),
    (constant_of_constant_shape, 1, {"ConstantOfShape": 1}),
    (constant_of_runtime_shape, 3, {}),
    (mixed_inputs, 2, {"Mul": 1}),
    (random_ops, 5, {}),
    (lambda: overridable_initializer(3), 1, {"ConstantOfShape": 1}),
    (lambda: overridable_initializer(8), 2, {}),
    (empty_optional_input, 1, {"Clip": 1}),
    (sequence_ops, 3, {}),
    (dropout_of_constant, 2, {}),
    (unsorted_chain, 1, {"Constant": 1, "Neg": 1, "Add": 1}),
    (control_flow, 6, {"Neg": 1, "Mul": 1, "Constant": 1, "Abs": 1}),
]
IDS = [
    "constant_chain",
    "constant_of_constant_shape",
    "constant_of_runtime_shape",
    "mixed_inputs",
    "random_ops",
    "initializer_input_ir3",
    "initializer_input_ir8",
    "empty_optional_input",
    "sequence_ops",
    "dropout",
    "unsorted_chain",
    "control_flow",
]


@pytest.mark.parametrize(("build", "running", "folded"), CASES, ids=IDS)
def test_rule(build, running, folded):
    m = build()
    g = summarize(m)
    assert g.nodes == count_nodes(m.graph)
    assert g.running_nodes == running
    assert g.folded_ops == folded
    assert g.folded_nodes == g.nodes - running == sum(folded.values())
    d = g.to_dict()
    assert (d["nodes"], d["running_nodes"], d["folded_nodes"], d["folded_ops"]) == (
        g.nodes,
        running,
        g.nodes - running,
        folded,
    )


@pytest.mark.parametrize(("build", "running"), [(b, r) for b, r, _ in CASES], ids=IDS)
def test_rule_matches_onnx_runtime(build, running, tmp_path):
    assert ort_running_nodes(build(), tmp_path) == running


def test_control_flow_subgraphs_counted():
    g = summarize(control_flow())
    assert (g.nodes, g.top_level_nodes, g.subgraphs) == (10, 3, 3)
    # If, Loop, then Add, else Sub, body Identity and Add run
    assert g.running_nodes == 6


def test_other_domains_run_unless_known_deterministic():
    # A custom op and a model-local function call may have side effects: they run, inputs constant or not.
    # com.microsoft DequantizeLinear folds (ONNX Runtime's list); its other ops are assumed to run.
    fn = helper.make_function(
        "local", "Twice", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])], [helper.make_opsetid("", 17)]
    )
    m = model(
        [
            helper.make_node("Foo", ["w"], ["f"], domain="my.domain"),
            helper.make_node("Twice", ["w"], ["t"], domain="local"),
            helper.make_node("DequantizeLinear", ["q", "scale"], ["dq"], domain="com.microsoft"),
            helper.make_node("FusedGemm", ["w", "w"], ["fg"], domain="com.microsoft"),
            helper.make_node("Sum", ["x", "f", "t", "dq", "fg"], ["y"]),
        ],
        [vi("x")],
        [vi("y")],
        [W, tensor("q", [[1, 2, 3, 4]], TensorProto.INT8), tensor("scale", 0.5)],
        domains=("my.domain", "local", "com.microsoft"),
    )
    m.functions.append(fn)
    g = summarize(m)
    assert g.folded_ops == {"com.microsoft.DequantizeLinear": 1}
    assert g.running_nodes == 4
    assert g.function_nodes == 1


def test_subgraph_inputs_shadow_outer_constants():
    # A Loop body whose input reuses an outer constant's name reads its own (runtime) value.
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Neg", ["w"], ["v_out"]),
        ],
        "body",
        [vi("iter", TensorProto.INT64, ()), vi("cond_in", TensorProto.BOOL, ()), vi("w")],
        [vi("cond_out", TensorProto.BOOL, ()), vi("v_out")],
    )
    m = model(
        [helper.make_node("Loop", ["trip", "cond", "x"], ["y"], body=body)],
        [vi("cond", TensorProto.BOOL, ()), vi("x")],
        [vi("y")],
        [W, tensor("trip", 3, TensorProto.INT64)],
    )
    assert summarize(m).running_nodes == 3


def test_light_resnet50_runs_176_of_415(resnet50):
    # Its weights are ConstantOfShape stand-ins of constant shapes (IR version 3: initializers listed
    # as graph inputs are constants), folded at load; everything else takes the image.
    m = onnx.load(str(resnet50), load_external_data=False)
    g = summarize(m)
    assert m.ir_version == 3
    assert (g.nodes, g.running_nodes, g.folded_nodes) == (415, 176, 239)
    assert g.folded_ops == {"ConstantOfShape": 239}
    assert Counter(g.ops) - Counter(g.folded_ops) == Counter(
        {"Conv": 53, "BatchNormalization": 53, "Relu": 49, "Sum": 16}
        | {"MaxPool": 1, "AveragePool": 1, "Reshape": 1, "Gemm": 1, "Softmax": 1}
    )


def test_light_resnet50_matches_onnx_runtime(resnet50, tmp_path):
    m = onnx.load(str(resnet50), load_external_data=False)
    assert ort_running_nodes(m, tmp_path) == 176
