"""The architecture, checked from the code's own imports (docs/architecture.md).

Every ``import`` statement counts, at module level or inside a function (a lazy import is still an
edge): the rule is about what a module can reach, not about when. The folders are read with ``ast``
rather than imported, so a broken layer cannot hide behind an import-time side effect. (import-linter
cannot walk this tree: ``aaco`` is a namespace package assembled by setuptools' ``package-dir``.)
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "agent": "aaco.agent",
    "analyzers": "aaco.analyzers",
    "exporters": "aaco.exporters",
    "contract": "aaco.contract",
}
MAX_LINES = 500
GENERATED = ("_pb2.py", "_pb2_grpc.py")

# layer -> the layers it may import (besides itself). The rest of ``aaco.agent`` is the composition root.
ALLOWED = {
    "contract": set(),
    "sources": {"contract"},
    "receivers": {"contract"},
    "analyzers": {"contract"},
    "exporters": {"contract"},
    "agent": {"contract", "sources", "receivers", "analyzers", "exporters"},
}


def layer(module: str) -> str:
    """The layer a module of ours belongs to."""
    for prefix, name in (
        ("aaco.agent.sources", "sources"),
        ("aaco.agent.receivers", "receivers"),
        ("aaco.analyzers", "analyzers"),
        ("aaco.exporters", "exporters"),
        ("aaco.contract", "contract"),
    ):
        if module == prefix or module.startswith(prefix + "."):
            return name
    return "agent"


def modules() -> dict[str, Path]:
    """Every hand-written module of the four folders, by its import name."""
    out: dict[str, Path] = {}
    for folder, package in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name.endswith(GENERATED):
                continue
            parts = [package, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = modules()


def imported(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """The modules of ours that ``module`` imports, with the line of each import."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from a.b import c`` reaches module a.b.c when c is one, else module a.b
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in targets:
            target = name
            while target and target not in MODULES:  # ``import a.b.C`` style: the longest module prefix
                target = target.rpartition(".")[0]
            if target and target != module:
                yield target, node.lineno


GRAPH = {m: sorted(set(imported(m, p))) for m, p in MODULES.items()}


def test_the_scan_sees_the_code() -> None:
    """Guards the test itself: the folders are found and their imports are read."""
    assert len(MODULES) > 100
    assert any(layer(t) == "contract" for m in GRAPH for t, _ in GRAPH[m] if layer(m) == "analyzers")


def test_no_module_imports_across_the_layers() -> None:
    """Sources, receivers, analyzers and exporters import only the contract and their own folder."""
    crossings = [
        f"{MODULES[m].relative_to(ROOT)}:{line} ({layer(m)}) imports {t} ({layer(t)})"
        for m, targets in GRAPH.items()
        for t, line in targets
        if layer(t) != layer(m) and layer(t) not in ALLOWED[layer(m)]
    ]
    assert not crossings, "imports across the layers:\n" + "\n".join(crossings)


def test_no_relative_imports() -> None:
    """Every import names its module in full, so a grep finds every user of a module."""
    relative = [
        f"{p.relative_to(ROOT)}:{node.lineno}"
        for p in MODULES.values()
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, ast.ImportFrom) and node.level
    ]
    assert not relative, "relative imports: " + ", ".join(relative)


def cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root, edges_of_root in graph.items():
        if root in index:
            continue
        work = [(root, iter(edges_of_root))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for target, _ in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(graph[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    """No two modules reach each other, lazy imports included."""
    assert not cycles(GRAPH), "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles(GRAPH))


def test_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": [("a", 1)]}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": [("b", 1)], "b": []}) == []


def test_no_module_is_over_500_lines() -> None:
    """No hand-written module over 500 lines (docs/architecture.md)."""
    sizes = {p: len(p.read_text().splitlines()) for p in MODULES.values()}
    large = [f"{p.relative_to(ROOT)} has {n} lines" for p, n in sizes.items() if n > MAX_LINES]
    assert not large, f"modules over {MAX_LINES} lines: " + ", ".join(large)
