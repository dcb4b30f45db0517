"""The package layout: no import cycle between modules, no upward import between layers.

The import graph of ``src/memnets`` is read from the source (``ast``), not by importing it.
Module-level imports (also under ``if``/``try`` at module level; not under
``if TYPE_CHECKING:``) make the graph that must be acyclic; an import inside a function is
a lazy import and may point anywhere. The layer rules hold for every import, lazy ones
included: the kernels in ``ops/`` and the memories in ``memories/`` never reach up into the
models, the training engine, the tasks or the command line.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "memnets"

# layer -> the packages it must not import from (at module level or lazily)
FORBIDDEN = {
    "ops": ("memories", "models", "train", "tasks", "cli"),
    "memories": ("models", "train", "tasks", "cli"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = path.relative_to(SRC).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """``(node, lazy)`` for every import statement; ``lazy``: inside a function (or class body
    method), i.e. not run when the module is imported."""
    def walk(nodes, lazy):
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, lazy
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(ast.iter_child_nodes(node), True)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                yield from walk(node.orelse, lazy)  # the TYPE_CHECKING branch never runs
            else:
                yield from walk(ast.iter_child_nodes(node), lazy)
    yield from walk(tree.body, False)


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The memnets modules an import statement loads (a name imported from a package resolves
    to its submodule when there is one)."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names if a.name in MODULES}
    is_pkg = MODULES[module].name == "__init__.py"
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = set()
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in MODULES:
            out.add(sub)
        elif source in MODULES:
            out.add(source)
    return out


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(module-level edges, all edges)`` between memnets modules."""
    eager: dict[str, set[str]] = {m: set() for m in MODULES}
    every: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, lazy in _imports(tree):
            targets = _targets(module, node) - {module}
            every[module] |= targets
            if not lazy:
                eager[module] |= targets
    return eager, every


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


EAGER, EVERY = _graph()


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and MODULES[module].name == "__init__.py") else None


def test_graph_is_read():
    assert "memnets.ops.dnc.recurrence" in MODULES and "memnets.memories.dnc" in MODULES
    assert "memnets.ops.dnc" in EAGER["memnets.memories.dnc"]
    assert "memnets.registry" in EAGER["memnets.pretrained"]


def test_no_import_cycle():
    cycles = _cycles(EAGER)
    assert not cycles, "module-level import cycles (make one side a lazy import or move the shared piece " \
                       "down a layer):\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_no_upward_import(layer):
    bad = []
    for module, targets in sorted(EVERY.items()):
        if _layer(module) != layer:
            continue
        for target in sorted(targets):
            if _layer(target) in FORBIDDEN[layer]:
                bad.append(f"{module} imports {target}")
    assert not bad, f"{layer}/ must not import from {', '.join(FORBIDDEN[layer])}:\n" + "\n".join(bad)


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
