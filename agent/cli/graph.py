"""``aaco graph``: an ONNX model's graph summary (the denominator of KAR), as a table or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from aaco.agent.cli.common import AsJson, fail, out_console, table
from aaco.contract.errors import AacoError


def graph(
    model: Annotated[Path, typer.Argument(help="ONNX model file.")],
    as_json: AsJson = False,
) -> None:
    """Summarise an ONNX graph: all nodes and the nodes that run (KAR's denominator, docs/kar.md), ops, opsets."""
    from aaco.agent.sources.ort.models import load_model
    from aaco.agent.sources.ort.onnx_graph import summarize

    try:
        summary = summarize(load_model(model, given_as="the MODEL argument of aaco graph"))
    except AacoError as exc:
        raise fail(exc) from None
    doc = summary.to_dict()
    if as_json:
        out_console.print_json(json.dumps(doc))
        return
    out_console.print(
        f"{model}: {doc['nodes']} nodes ({doc['top_level_nodes']} top level, {doc['subgraphs']} subgraphs), "
        f"{doc['running_nodes']} running, {doc['folded_nodes']} folded at load; opset {summary.opset_text()}",
        highlight=False,
        soft_wrap=True,  # one line however long the path: the terminal wraps it, not rich
    )
    out = table("op", "nodes", "folded", "running", right={"nodes", "folded", "running"})
    folded = doc["folded_ops"]
    for op, n in doc["ops"].items():
        out.add_row(op, str(n), str(folded.get(op, 0)), str(n - folded.get(op, 0)))
    out.add_row("total", str(doc["nodes"]), str(doc["folded_nodes"]), str(doc["running_nodes"]), style="bold")
    out_console.print(out)
