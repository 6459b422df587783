"""The house has no circles (no advmon module imports, at any depth, one that imports it back), its layers point
down, and the statistics engine (``advmon/stats/``) has one door."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "advmon"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts).removesuffix(".__init__")


def _absolute(node: ast.ImportFrom, package: str) -> str | None:
    """The module an ``ImportFrom`` names, relative ones (``from . import stats``) resolved."""
    if not node.level:
        return node.module
    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(parts + ([node.module] if node.module else []))


def _imports(tree: ast.AST, package: str = "advmon") -> set[str]:
    """Every advmon module imported anywhere in the file (functions included), TYPE_CHECKING blocks aside."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        module = _absolute(node, package) if isinstance(node, ast.ImportFrom) else None
        if module and module.startswith("advmon"):
            found.add(module)
            for alias in node.names:  # "from advmon import lifecycle" names a module
                candidate = f"{module}.{alias.name}"
                if (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists():
                    found.add(candidate)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("advmon"))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        # A package's own __init__ is what importing any of its modules runs first: not an edge.
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        imported = _imports(ast.parse(path.read_text()), package)
        graph[name] = {m for m in imported if m != "advmon" and not name.startswith(m + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                found.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target, stack)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_the_import_graph_has_no_circles():
    assert cycles(import_graph()) == []


ENGINE = "advmon.stats"


def _in_engine(module: str) -> bool:
    return module == ENGINE or module.startswith(ENGINE + ".")


def test_the_layers_point_down():
    graph = import_graph()
    engine = [m for m in graph if _in_engine(m)]
    assert len(engine) > 1, "the engine is a package: advmon/stats/"
    for module in engine:  # torch, NumPy, Triton; never anything else of advmon
        assert not {m for m in graph[module] if not _in_engine(m)}, module
    # The normalization kinds import the engine's group bounds: the catalog reads only the record's ratio.
    for module in ("advmon.rules", *(m for m in graph if m.startswith("advmon.alerts"))):
        assert not {m for m in graph[module] if m.startswith(("advmon.monitor", "advmon.normalization"))
                    or _in_engine(m)}, module
    for module in (m for m in graph if m.startswith("advmon.sinks")):
        assert "advmon.monitor" not in graph[module], module
    assert "advmon.monitor" not in graph["advmon.hooks"]


def _engine_names_used_outside() -> list[str]:
    """Every import, in advmon outside the engine, of a module inside it or of an underscore name from it."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        if _in_engine(name):
            continue
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = _absolute(node, package) or ""
                if _in_engine(module) and module != ENGINE:
                    found.append(f"{name}: from {module} import ...")
                elif module == ENGINE:
                    found += [f"{name}: from {module} import {a.name}" for a in node.names if a.name.startswith("_")
                              or (PACKAGE / "stats" / f"{a.name}.py").exists()]
            elif isinstance(node, ast.Import):
                found += [f"{name}: import {a.name}" for a in node.names if _in_engine(a.name) and a.name != ENGINE]
    return found


def test_the_engine_has_one_door():
    """advmon imports the engine's names from ``advmon.stats`` only: its modules and underscore names are its own."""
    assert _engine_names_used_outside() == []
    import advmon.stats

    exported = advmon.stats.__all__
    assert len(exported) == len(set(exported))
    assert not [n for n in exported if n.startswith("_") or not hasattr(advmon.stats, n)]
    # A name of the door never hides one of its modules (``import advmon.stats.rows as m`` would get the name).
    modules = {path.stem for path in (PACKAGE / "stats").glob("*.py")}
    assert not modules & set(exported)


def test_relative_imports_count_as_edges():
    tree = ast.parse("from . import base\nfrom .. import record\nfrom ..stats import summarize\n")
    assert _imports(tree, "advmon.sinks") == {
        "advmon.sinks", "advmon.sinks.base", "advmon", "advmon.record", "advmon.stats",
    }
