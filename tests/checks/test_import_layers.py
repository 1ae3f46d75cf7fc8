"""The floors of the house (docs/architecture.md §9) hold: every import of a realhf module, at
module level or inside a function, goes to the same floor or one below, and no modules import
each other in a circle.

    0 base         utilities with no realhf dependency above them
    1 api          contracts: the config tree, agent / environment / tool / algorithm interfaces,
                   the trajectory message, the engine API and the batch it takes
    2 impl         the machinery: the trainer's model code and engine, the inference engine,
                   the prompt loaders
      plugins      the built-in agents, environments, tools and tasks, written against api as a
                   user's own would; nothing in impl or system imports them (the registries in
                   api name them by import path)
    3 system       the workers
    4 scheduler, experiments   launching, and assembling (and validating) an experiment
    5 apps, testing (a user's agent run outside a run) and the entry points at the top of the package
"""

import ast
from collections import defaultdict
from pathlib import Path

from helpers.paths import REPO

FLOORS = {
    "base": 0,
    "api": 1,
    "impl": 2,
    "plugins": 2,
    "system": 3,
    "scheduler": 4,
    "experiments": 4,
    "apps": 5,
    "testing": 5,
}
PACKAGE = Path(REPO) / "realhf"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _floor(module: str) -> int:
    parts = module.split(".")
    return FLOORS.get(parts[1], 5) if len(parts) > 1 else 5


def _is_module(name: str) -> bool:
    path = PACKAGE.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def import_graph() -> dict:
    """module -> the realhf modules it imports (`from realhf.x import y` counts realhf.x.y when
    y is a module)."""
    graph = defaultdict(set)
    for path in PACKAGE.rglob("*.py"):
        me = _module(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("realhf"):
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("realhf")]
            else:
                continue
            graph[me].update(n for n in names if _is_module(n) and n != me)
    return graph


def _cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
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

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_goes_up_a_floor():
    graph = import_graph()
    assert len(graph) > 100  # the walk found the package
    up = sorted(f"{a} -> {b}" for a, bs in graph.items() for b in bs if _floor(b) > _floor(a))
    assert up == [], "imports up a floor:\n" + "\n".join(up)


def _machinery_on_plugins(graph: dict) -> list:
    """Imports from the machinery (impl, system) into a built-in plug-in: there must be none, so
    the built-ins are found by name like a user's own and could be deleted."""
    return sorted(
        f"{a} -> {b}"
        for a, bs in graph.items()
        for b in bs
        if a.split(".")[1:2] in (["impl"], ["system"]) and b.split(".")[1:2] == ["plugins"]
    )


def test_no_machinery_imports_a_builtin_plugin():
    assert _machinery_on_plugins(import_graph()) == []


def test_the_plugin_check_sees_machinery_importing_a_plugin():
    graph = {"realhf.plugins.a": {"realhf.impl.b"}, "realhf.system.d": {"realhf.plugins.a"}}
    assert _machinery_on_plugins(graph) == ["realhf.system.d -> realhf.plugins.a"]


def test_no_modules_import_each_other_in_a_circle():
    assert _cycles(import_graph()) == []


def test_the_walk_sees_an_upward_import_and_a_circle():
    """The checks can fail: a made-up graph with one of each is caught."""
    graph = {
        "realhf.api.a": {"realhf.system.b"},
        "realhf.impl.c": {"realhf.impl.d"},
        "realhf.impl.d": {"realhf.impl.c"},
    }
    assert [(a, b) for a, bs in graph.items() for b in bs if _floor(b) > _floor(a)] == [
        ("realhf.api.a", "realhf.system.b")
    ]
    assert _cycles(graph) == [["realhf.impl.c", "realhf.impl.d"]]
