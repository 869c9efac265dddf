"""ONNX graph summary: nodes including subgraphs, ops, opsets, functions."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from aaco.agent.sources.ort.onnx_graph import summarize


def test_light_resnet50_has_415_nodes(resnet50):
    model = onnx.load(str(resnet50), load_external_data=False)
    g = summarize(model)
    assert g.nodes == 415
    assert g.top_level_nodes == 415
    assert g.subgraphs == 0
    assert sum(g.ops.values()) == 415
    assert g.ops["Conv"] == 53  # ResNet-50: 49 convolutions in blocks + 3 projection shortcuts + the stem
    assert g.opsets.get("ai.onnx") == max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    d = g.to_dict()
    assert d["nodes"] == 415
    assert list(d["ops"].values()) == sorted(d["ops"].values(), reverse=True)
    assert d["opset"] == g.opsets


def _vi(name: str, elem=TensorProto.FLOAT, shape=(1,)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def control_flow_model() -> onnx.ModelProto:
    # If: then-branch has 2 nodes, else-branch has 1 node.
    then_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["t1"]), helper.make_node("Abs", ["t1"], ["then_out"])],
        "then",
        [],
        [_vi("then_out")],
    )
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["else_out"])], "else", [], [_vi("else_out")])
    if_node = helper.make_node("If", ["cond"], ["y"], then_branch=then_g, else_branch=else_g)
    # Loop: the body has 3 nodes, one of which is itself an If with a 1-node branch each.
    inner_then = helper.make_graph([helper.make_node("Neg", ["v"], ["it"])], "ithen", [], [_vi("it")])
    inner_else = helper.make_graph([helper.make_node("Abs", ["v"], ["ie"])], "ielse", [], [_vi("ie")])
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "v_in"], ["v"]),
            helper.make_node("If", ["cond_in"], ["v_out"], then_branch=inner_then, else_branch=inner_else),
        ],
        "body",
        [_vi("iter", TensorProto.INT64, ()), _vi("cond_in", TensorProto.BOOL, ()), _vi("v_in")],
        [_vi("cond_out", TensorProto.BOOL, ()), _vi("v_out")],
    )
    loop = helper.make_node("Loop", ["trip", "cond", "y"], ["z"], body=body)
    relu = helper.make_node("Relu", ["z"], ["out"])
    init = helper.make_tensor("trip", TensorProto.INT64, [], [3])
    graph = helper.make_graph(
        [if_node, loop, relu],
        "cf",
        [_vi("cond", TensorProto.BOOL, ()), _vi("x"), _vi("trip", TensorProto.INT64, ())],
        [_vi("out")],
        initializer=[init],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def test_subgraph_nodes_count():
    g = summarize(control_flow_model())
    # top level 3; If branches 2 + 1; Loop body 3 + inner If branches 1 + 1
    assert g.top_level_nodes == 3
    assert g.nodes == 3 + 3 + 3 + 2
    assert g.subgraphs == 5  # then, else, body, inner then, inner else
    assert g.ops == {"If": 2, "Loop": 1, "Relu": 1, "Neg": 2, "Abs": 2, "Identity": 2, "Add": 1}
    assert g.opsets == {"ai.onnx": 17, "com.microsoft": 1}
    assert g.inputs == 2  # trip is an initializer
    assert g.initializers == 1
    # every node reads a graph input or a subgraph's own input (trip, an initializer listed as a graph
    # input from IR 4 on, is an overridable default, not a constant): nothing is folded
    assert (g.running_nodes, g.folded_ops) == (g.nodes, {})


def test_graphs_attribute_is_walked():
    sub1 = helper.make_graph([helper.make_node("Neg", ["a"], ["b"])], "s1", [], [_vi("b")])
    sub2 = helper.make_graph(
        [helper.make_node("Abs", ["a"], ["c"]), helper.make_node("Neg", ["c"], ["d"])], "s2", [], [_vi("d")]
    )
    node = helper.make_node("Custom", ["a"], ["o"], domain="my.domain", branches=[sub1, sub2])
    graph = helper.make_graph([node], "g", [_vi("a")], [_vi("o")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("my.domain", 2)])
    g = summarize(model)
    assert g.nodes == 4
    assert g.subgraphs == 2
    assert g.ops == {"my.domain.Custom": 1, "Neg": 2, "Abs": 1}
    assert g.opsets == {"ai.onnx": 17, "my.domain": 2}


def test_function_nodes_reported_separately():
    fn = helper.make_function(
        "local",
        "Twice",
        ["x"],
        ["y"],
        [helper.make_node("Neg", ["x"], ["t"]), helper.make_node("Neg", ["t"], ["y"])],
        [helper.make_opsetid("", 17)],
    )
    graph = helper.make_graph(
        [helper.make_node("Twice", ["a"], ["b"], domain="local"), helper.make_node("Relu", ["b"], ["c"])],
        "g",
        [_vi("a")],
        [_vi("c")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("local", 1)], functions=[fn]
    )
    g = summarize(model)
    assert g.nodes == 2
    assert g.function_nodes == 2
    assert g.ops == {"local.Twice": 1, "Relu": 1}
    assert g.to_dict()["function_nodes"] == 2
