"""No import cycles inside the shipped ``nki_kernels`` package.

Every module of torch_ext/nki_kernels is parsed with ``ast``; every import statement counts,
also those inside functions (a lazy import that closes a cycle is still a cycle, only a
hidden one). Relative imports are resolved against the importing module. ``from pkg import
name`` is an edge to ``pkg.name`` when that is a module of the package, else to ``pkg``.
Importing ``pkg.sub`` is an edge to ``pkg.sub`` only (Python runs ``pkg/__init__`` first,
but that is not a dependency the importer chose).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "torch_ext" / "nki_kernels"
PACKAGE = "nki_kernels"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = [PACKAGE, *path.relative_to(PACKAGE_DIR).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _is_package(name: str, modules: dict[str, Path]) -> bool:
    return modules[name].name == "__init__.py"


def _edges(name: str, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
    package = name if _is_package(name, modules) else name.rpartition(".")[0]
    out: set[str] = set()

    def known(target: str) -> str | None:
        # the longest prefix of `target` that is a module of the package
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE and known(alias.name):
                    out.add(known(alias.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            elif (node.module or "").split(".")[0] == PACKAGE:
                base = node.module
            else:
                continue
            for alias in node.names:
                target = known(f"{base}.{alias.name}") if alias.name != "*" else None
                if target == f"{base}.{alias.name}":
                    out.add(target)
                elif known(base):
                    out.add(known(base))
    out.discard(name)
    return out


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _edges(name, modules) for name in modules}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 = on the DFS path, 2 = done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_lazy_and_relative_imports():
    graph = import_graph()
    assert "nki_kernels.simulator.isa.operands" in graph["nki_kernels.simulator.isa.alu"]
    # simulator.estimate imports the cost model inside the function: still an edge
    assert "nki_kernels.simulator.cost" in graph["nki_kernels.simulator"]


def test_cycle_finder_reports_the_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_the_package():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cost_model_never_imports_the_interpreter():
    graph = import_graph()
    interpreter = {"nki_kernels.simulator.interpreter", "nki_kernels.simulator.run",
                   "nki_kernels.simulator.modules", "nki_kernels.simulator.language",
                   "nki_kernels.simulator.isa", "nki_kernels.simulator"}
    for name, deps in graph.items():
        if name.startswith("nki_kernels.simulator.cost"):
            assert not deps & interpreter, f"{name} imports {sorted(deps & interpreter)}"
