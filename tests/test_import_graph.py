"""No import circle in any Python module of ours (``runner/``, ``bench/``, ``harness/``,
``tests/``, ``model/``, ``docs/hooks.py``, ``run.py``: ``tests/ours.py``): every import
counts (at module level and inside function bodies; imports under ``if TYPE_CHECKING:``
are for the type checker only), and importing ``a.b.c`` imports the packages ``a`` and
``a.b`` too.  Code two modules share goes to a third that both import."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.ours import our_modules


def _imports(name: str, path: Path, modules: set[str]) -> set[str]:
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                visit(node.orelse)
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            else:
                # statements nested in this one: function and class bodies, branches
                for child in ast.iter_child_nodes(node):
                    if isinstance(child, ast.stmt):
                        visit([child])
                    elif isinstance(child, ast.ExceptHandler | ast.match_case):
                        visit(child.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    edges: set[str] = set()
    for target in found:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        parts = target.split(".") if target else []
        edges.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return {e for e in edges if e in modules and e != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def _graph() -> dict[str, set[str]]:
    paths = our_modules()
    return {name: _imports(name, path, set(paths)) for name, path in paths.items()}


def test_no_import_circle_in_any_module_of_ours() -> None:
    graph = _graph()
    circles = _cycles(graph)
    shown = ["; ".join(f"{m} -> {', '.join(sorted(graph[m] & set(c)))}" for m in c)
             for c in circles]
    assert circles == [], ("import circles (each module, then the modules of its circle "
                           "it imports):\n  " + "\n  ".join(shown))


def test_the_walk_covers_every_part_of_the_repository() -> None:
    modules = set(_graph())
    assert {"runner", "runner.cli", "bench.run", "bench.webhook", "harness.invariants",
            "tests.test_import_graph", "model.tables", "docs.hooks", "run"} <= modules
    assert not any(".venv" in m or m.startswith("site.") for m in modules)


def test_the_walk_sees_imports_inside_functions_and_handlers_not_type_checking(
        tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import p.typing_only\n"
        "def f():\n    try:\n        pass\n    except ImportError:\n"
        "        from p.q import r\n"
        "class C:\n    def g(self):\n        import p.s\n", encoding="utf-8")
    modules = {"m", "p", "p.q", "p.s", "p.typing_only"}
    assert _imports("m", source, modules) == {"p", "p.q", "p.s"}


def test_the_walk_sees_a_circle_made_inside_a_function() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]
