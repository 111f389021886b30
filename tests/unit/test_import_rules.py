"""The import rule of docs/ARCHITECTURE.md, checked on the source: every module under hpc_grpo/ is parsed with `ast`
and every import statement counts, module-level and nested (inside a function, a method, `if TYPE_CHECKING:`).

1. No import cycle. A nested import breaks a cycle only at run time, so it does not count as broken here: the fix is
   to move what both modules need into the lower one.
2. Layers, lowest first (LAYERS): a module imports only from its own layer or lower ones, never higher.

`from hpc_grpo.x import y` where y is a module counts as importing hpc_grpo.x.y; `from hpc_grpo.x import name` counts
as importing hpc_grpo.x (its __init__). A package's __init__ runs before its submodules whatever the code says, so
that implicit import is not an edge; what an __init__ itself imports is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
PACKAGE = "hpc_grpo"

# Lowest first; the packages of one tuple are one layer. The same order, written out, is in docs/ARCHITECTURE.md.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("common",),
    ("config",),
    ("cluster",),
    ("runstate",),
    ("engines",),
    ("rewards", "data", "sandbox"),
    ("evaluation",),
    ("launch",),
    ("planning",),
    ("job",),
    ("commands",),
    ("cli",),
)
# Modules whose layer is not their package's, with the reason.
PLACED: dict[str, tuple[str, str]] = {
    # hpc_grpo/__init__.py: only __version__ (config.resolve freezes it into spec.yaml, render prints it).
    PACKAGE: ("common", "holds only __version__"),
}

Graph = dict[str, dict[str, int]]  # module -> {imported module: line of its first import}


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py under root/hpc_grpo (a package by its __init__.py)."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def import_graph(root: Path) -> Graph:
    """Every hpc_grpo import of every hpc_grpo module, wherever the statement sits in the file."""
    names = module_names(root)
    graph: Graph = {}
    for name, path in names.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}

        def add(target: str, line: int) -> None:
            if target != name and (target == PACKAGE or target.startswith(PACKAGE + ".")):
                edges.setdefault(target, line)

        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:  # relative: from the module's package, one level up per extra dot
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                for alias in node.names:
                    sub = f"{source}.{alias.name}"
                    add(sub if sub in names else source, node.lineno)
        graph[name] = dict(sorted(edges.items(), key=lambda kv: kv[1]))
    return graph


def layer_of(module: str) -> tuple[int, str] | None:
    """(rank, layer name) of a module: PLACED first, else its top-level package's layer; None if it has none."""
    if module in PLACED:
        package = PLACED[module][0]
    else:
        package = module.split(".")[1] if "." in module else ""
    for rank, layer in enumerate(LAYERS):
        if package in layer:
            return rank, "/".join(layer)
    return None


def layer_violations(graph: Graph) -> list[str]:
    """One line per import the rule forbids: importing module, imported module, line, and the rule broken."""
    out = []
    for src, targets in sorted(graph.items()):
        here = layer_of(src)
        if here is None:
            out.append(f"{src} is in no layer: add its package to LAYERS in {Path(__file__).name} and to the import "
                       "rule in docs/ARCHITECTURE.md")
            continue
        for dst, line in targets.items():
            there = layer_of(dst)
            if there is None:
                out.append(f"{src} imports {dst} (line {line}), which is in no layer")
            elif there[0] > here[0]:
                out.append(f"{src} imports {dst} (line {line}): layer {here[1]} is below layer {there[1]}, and a lower "
                           "layer never imports a higher one; move what it needs down (docs/ARCHITECTURE.md)")
    return out


def cycles(graph: Graph) -> list[list[str]]:
    """Each strongly connected set of more than one module, as one concrete cycle through it (a -> ... -> a)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan; the package has ~60 modules, recursion depth is no concern
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, group) for group in found]


def _one_cycle(graph: Graph, group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group (breadth first)."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in graph.get(v, {}):
            if w == start:
                return paths[v] + [start]
            if w in group and w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return sorted(group)  # not reached: a strongly connected group always has a cycle through its members


def describe_cycle(graph: Graph, cycle: list[str]) -> str:
    steps = [f"{a} -> {b} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])]
    return "import cycle: " + ", ".join(steps) + "; move what both need into the lower module"


# ------------------------------------------------------------------------------------------------ the package
@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph(REPO)


def test_no_import_cycles(graph: Graph) -> None:
    found = [describe_cycle(graph, c) for c in cycles(graph)]
    assert not found, "\n".join(found)


def test_lower_layers_never_import_higher_ones(graph: Graph) -> None:
    found = layer_violations(graph)
    assert not found, "\n".join(found)


def test_every_layer_names_a_real_package(graph: Graph) -> None:
    """A package renamed on disk but not here would leave its modules unchecked (they would have no layer)."""
    packages = {m.split(".")[1] for m in graph if m.count(".") >= 1 and (REPO / PACKAGE / m.split(".")[1]).is_dir()}
    named = {p for layer in LAYERS for p in layer}
    assert named == packages, (sorted(named - packages), sorted(packages - named))
    assert set(PLACED) <= set(graph), sorted(set(PLACED) - set(graph))


def test_architecture_doc_states_the_same_order() -> None:
    """docs/ARCHITECTURE.md writes the order on one line; it must be the one enforced here."""
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    order = " < ".join("/".join(layer) for layer in LAYERS)
    assert f"`{order}`" in doc, f"docs/ARCHITECTURE.md should state the import rule as `{order}`"
    for module in PLACED:
        if module != PACKAGE:
            assert module.removeprefix(PACKAGE + ".").replace(".", "/") in doc, module


# ------------------------------------------------------------------------- the checker itself can fail
def test_a_synthetic_upward_import_and_cycle_are_reported(tmp_path: Path) -> None:
    """A small package on disk with the faults the rule forbids, nested imports included: each one is named."""
    files = {
        "__init__.py": "",
        "common/__init__.py": "",
        "common/low.py": "def f():\n    from hpc_grpo.cli import app  # nested: still an upward import\n    return app\n",
        "config/__init__.py": "",
        "config/a.py": "from hpc_grpo.config import b\n",
        "config/b.py": "def g():\n    from hpc_grpo.config.a import something\n    return something\n",
        "cli/__init__.py": "",
        "cli/app.py": "from hpc_grpo.submit import TrainJob\nfrom . import main\n",
        "cli/main.py": "",
        "submit.py": "from hpc_grpo.cli.app import x\n",
        "newpkg/__init__.py": "",
        "newpkg/thing.py": "import hpc_grpo.common.low\n",
    }
    for rel, text in files.items():
        path = tmp_path / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    g = import_graph(tmp_path)
    assert g["hpc_grpo.common.low"] == {"hpc_grpo.cli.app": 2}  # `from hpc_grpo.cli import app`: app is a module
    assert g["hpc_grpo.config.b"] == {"hpc_grpo.config.a": 2}  # `something` is not: the edge is to config.a
    assert g["hpc_grpo.cli.app"] == {"hpc_grpo.submit": 1, "hpc_grpo.cli.main": 2}  # `from . import main`
    assert g["hpc_grpo.newpkg.thing"] == {"hpc_grpo.common.low": 1}

    found = layer_violations(g)
    assert ("hpc_grpo.common.low imports hpc_grpo.cli.app (line 2): layer common is below layer cli, and a lower "
            "layer never imports a higher one; move what it needs down (docs/ARCHITECTURE.md)") in found
    # a module beside the packages (hpc_grpo/submit.py) belongs to no layer: neither it nor an import of it passes
    assert "hpc_grpo.cli.app imports hpc_grpo.submit (line 1), which is in no layer" in found, found
    assert any(v.startswith("hpc_grpo.submit is in no layer") for v in found), found
    assert any(v.startswith("hpc_grpo.newpkg.thing is in no layer") for v in found), found

    loops = sorted(cycles(g))  # config.a <-> config.b through a nested import; cli.app <-> submit
    assert loops == [["hpc_grpo.cli.app", "hpc_grpo.submit", "hpc_grpo.cli.app"],
                     ["hpc_grpo.config.a", "hpc_grpo.config.b", "hpc_grpo.config.a"]], loops
    assert describe_cycle(g, loops[1]) == ("import cycle: hpc_grpo.config.a -> hpc_grpo.config.b (line 1), "
                                           "hpc_grpo.config.b -> hpc_grpo.config.a (line 2); move what both need "
                                           "into the lower module")


def test_layer_of_uses_placements_and_packages() -> None:
    assert layer_of("hpc_grpo.engines.verl")[1] == "engines"
    assert layer_of("hpc_grpo")[1] == "common"
    assert layer_of("hpc_grpo.cluster.clusterpick")[1] == "cluster" and layer_of("hpc_grpo.config.spec")[1] == "config"
    assert layer_of("hpc_grpo.rewards.code") == layer_of("hpc_grpo.data.gsm8k")
    assert layer_of("hpc_grpo.nowhere.x") is None
