"""The module import graph has no cycle: every import statement of the project's modules
(at module level or inside a function: a lazy import is still a dependency) is an edge,
and no strongly connected component has more than one module (tarjan's algorithm)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"grid": "grid", "schemes": "schemes", "variants": "variants"}
PACKAGES.update({"validation": "validation", "tpde": "tpde"})


def module_name(path: Path) -> str:
    """``tpde.grid.circle`` for grid/circle.py, ``tpde.io`` for tpde/io.py."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    head = [] if parts[0] == "tpde" else ["tpde"]
    return ".".join(head + parts)


def import_graph() -> dict[str, set[str]]:
    files = [p for folder in PACKAGES for p in (ROOT / folder).rglob("*.py")]
    modules = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([base] if base else []))
                targets = [base] + [f"{base}.{a.name}" for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and not name.startswith(target + "."):
                    edges.add(target)  # (a package's own __init__ is no cycle of its modules)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_lazy_imports():
    graph = import_graph()
    assert "tpde.references" in graph["tpde.circle"]  # a function-level import is an edge
    assert "tpde.config_core" in graph["tpde.circle"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_import_cycle():
    graph = import_graph()
    found = cycles(graph)
    print(f"\n{len(graph)} modules, {sum(map(len, graph.values()))} import edges, cycles: {found}")
    assert found == []


#: the layers, lowest first: a module imports only its own layer and those below it
LAYERS = ("grid", "schemes", "variants", "validation", "face")


def layer(module: str) -> int:
    """0 for ``tpde.grid...``, 4 for the face (``tpde.io``, ``tpde.cli``, ``tpde``)."""
    part = module.split(".")[1] if "." in module else "face"
    return LAYERS.index(part) if part in LAYERS else LAYERS.index("face")


def test_no_upward_import():
    graph = import_graph()
    upward = sorted(
        (name, target)
        for name, edges in graph.items()
        for target in edges
        if layer(target) > layer(name)
    )
    counts = {part: sum(layer(m) == i for m in graph) for i, part in enumerate(LAYERS)}
    print(f"\nmodules per layer: {counts}; upward imports: {upward}")
    assert layer("tpde.grid.circle") == 0 and layer("tpde.io") == 4 and layer("tpde") == 4
    assert upward == []
