"""The house has no circles (no advmon module imports, at any depth, one that imports it back, ``TYPE_CHECKING``
imports included), its layers point down (README's "Layout"), no module uses another's underscore names, and the
statistics engine (``advmon/stats/``) has one door."""

from __future__ import annotations

import ast
import re
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
    """Every advmon module imported anywhere in the file (functions and ``TYPE_CHECKING`` blocks included: a type
    that names a layer above is a dependency on it too)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
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
    for module in engine:  # torch, NumPy, Triton and the record's words (what it writes); nothing else of advmon
        assert not {m for m in graph[module] if not _in_engine(m) and m != "advmon.record"}, module
    assert not graph["advmon.record"], "the record's words import nothing of advmon (readers need no engine)"
    # The normalization kinds import the engine's group bounds: the catalog reads only the record's ratio.
    for module in ("advmon.rules", *(m for m in graph if m.startswith("advmon.alerts"))):
        assert not {m for m in graph[module] if m.startswith(("advmon.monitor", "advmon.normalization"))
                    or _in_engine(m)}, module
    for module in (m for m in graph if m.startswith("advmon.sinks")):
        assert "advmon.monitor" not in graph[module], module
    assert "advmon.monitor" not in graph["advmon.hooks"]


#: The layers, lowest first (README's "Layout"; ../shared/docs/style.md, "The house as it grows"). A module
#: imports only from its own layer or below.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("the record's words", ("advmon.record",)),  # what a record holds: the engine writes it, readers need no engine
    ("the engine", ("advmon.stats",)),
    ("shared words", ("advmon.errors", "advmon.redact", "advmon.progress", "advmon.rules", "advmon.lifecycle")),
    ("capture and sinks", ("advmon.hooks", "advmon.observation", "advmon.normalization", "advmon.sinks")),
    ("on-call and recorded runs", ("advmon.alerts", "advmon.dashboards", "advmon.runs")),
    ("configuration and reports", ("advmon.config", "advmon.reports")),
    ("the monitor", ("advmon.monitor", "advmon.assembly", "advmon.steps", "advmon.stopping", "advmon.host_half")),
    ("integrations", ("advmon.integrations",)),
    ("the face", ("advmon", "advmon.__main__", "advmon.cli", "advmon.demo", "advmon.simulation",
                  "advmon.activation")),
]

#: What a layer may not use although it sits higher (the style guide's "never uses" column).
NEVER: dict[str, tuple[str, ...]] = {
    "advmon.sinks": ("advmon.hooks", "advmon.observation", "advmon.normalization", "advmon.alerts",
                     "advmon.config"),
    "advmon.hooks": ("advmon.sinks",),
    "advmon.observation": ("advmon.sinks", "advmon.hooks"),
    "advmon.rules": ("advmon.stats", "advmon.sinks"),
    "advmon.alerts": ("advmon.stats", "advmon.hooks", "advmon.observation", "advmon.normalization"),
    "advmon.dashboards": ("advmon.stats", "advmon.hooks", "advmon.observation", "advmon.normalization",
                          "advmon.runs", "advmon.alerts"),
    "advmon.runs": ("advmon.hooks", "advmon.observation", "advmon.alerts"),
    "advmon.reports": ("advmon.hooks", "advmon.observation", "advmon.config"),
}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> int:
    """The layer a module stands in (the longest matching prefix decides: ``advmon.cli`` is the face, not
    ``advmon``'s)."""
    best = (-1, -1)
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or (prefix != "advmon" and _within(module, prefix))) and len(prefix) > best[1]:
                best = (rank, len(prefix))
    assert best[0] >= 0, f"{module} stands in no layer: add it to LAYERS (and to README's Layout)"
    return best[0]


def test_every_import_points_down_a_layer_or_stays_in_its_own():
    upward = []
    for module, imported in import_graph().items():
        upward += [f"{module} ({LAYERS[layer_of(module)][0]}) -> {target} ({LAYERS[layer_of(target)][0]})"
                   for target in sorted(imported) if layer_of(target) > layer_of(module)]
    assert upward == []


def test_no_layer_uses_what_the_house_says_it_never_uses():
    broken = []
    for module, imported in import_graph().items():
        for owner, never in NEVER.items():
            if _within(module, owner):
                broken += [f"{module} -> {t}" for t in sorted(imported) if any(_within(t, n) for n in never)]
    assert broken == []


def test_the_layer_rules_can_fail():
    assert layer_of("advmon.sinks.delivery") < layer_of("advmon.monitor") < layer_of("advmon.cli")
    assert layer_of("advmon.record") == 0 and layer_of("advmon.stats.groups") == 1
    assert layer_of("advmon") == len(LAYERS) - 1


def _private_names_used_across_modules() -> list[str]:
    """Underscore names a module imports from another advmon module, or reaches on another module's objects (an
    attribute ``x._name`` that only other modules define), the engine's modules among themselves aside."""
    trees = {_module_name(path): ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}
    defined: dict[str, set[str]] = defaultdict(set)
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined[node.name].add(module)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                defined[node.attr].add(module)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined[node.id].add(module)
    found = []
    for module, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("advmon"):
                found += [f"{module}: from {node.module} import {alias.name}" for alias in node.names
                          if _private(alias.name) and not (_in_engine(module) and _in_engine(node.module))]
            elif isinstance(node, ast.Attribute) and _private(node.attr) \
                    and ast.unparse(node.value) not in ("self", "cls"):
                owners = defined.get(node.attr, set())
                if owners and module not in owners and not (_in_engine(module) and all(map(_in_engine, owners))):
                    found.append(f"{module}: {ast.unparse(node)} (defined in {', '.join(sorted(owners))})")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_module_uses_another_modules_underscore_names():
    assert _private_names_used_across_modules() == []


def test_advmon_activation_is_the_integrations_module_itself():
    """docs/api.md promises ``advmon.activation.activate()``; the module moved to integrations/."""
    import advmon.activation
    import advmon.integrations.activation

    assert advmon.activation is advmon.integrations.activation
    from advmon.activation import activate, deactivate, install_sigterm_flush  # noqa: F401


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


def test_the_readme_layout_names_every_module_and_package_at_the_top():
    """README's "Layout" and the code agree: every top-level module and package is named there."""
    readme = (PACKAGE.parent / "README.md").read_text()
    layout = readme[readme.index("## Layout"):]
    layout = layout[: layout.index("\n## ", 1)] if "\n## " in layout[1:] else layout
    present = {f"{p.name}" for p in PACKAGE.glob("*.py") if p.name != "__main__.py"}
    present |= {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    named = set(re.findall(r"`([a-z_]+(?:\.py|/))`", layout))
    assert present - named == set(), "not in README's Layout"
