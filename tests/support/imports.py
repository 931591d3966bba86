"""The import graph of a package, read from its source (every import, lazy ones inside functions included)."""

from __future__ import annotations

import ast
from pathlib import Path


def _module_name(root: Path, path: Path, package: str) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """module -> the package's modules it imports (``from a import b`` counts ``a.b`` when that is a module).

    Imports under ``if TYPE_CHECKING:`` are left out: they never run. A submodule's implicit import of its parent
    packages is not an edge (``pkg/__init__`` may import its submodules; that alone is no cycle).
    """
    files = {_module_name(root, p, package): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), str(path))
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _is_type_checking(node):
                skip.update(id(n) for child in node.body for n in ast.walk(child))
        edges: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # ``from pkg import mod`` imports the module; ``from mod import name`` the module it names
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            for target in targets:
                if target in files and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found
