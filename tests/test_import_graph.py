"""The house's walls (``docs/architecture.md``): no import cycles across ``fastgen`` and ``cli`` - counting imports
inside functions, not those under ``if TYPE_CHECKING:`` - and imports that point down the layers only. Read from the
source with ``ast`` (nothing is imported), so a failure names the cycle or the offending import and its line."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = {"fastgen": ROOT / "fastgen", "fastgen.cli": ROOT / "cli", "fastgen.templates": ROOT / "templates"}

# Bottom to top (docs/architecture.md): a module may import modules of its own layer and of the layers below. The
# longest matching prefix decides a module's layer. The config system (schema, LazyCall / instantiate, loading,
# overriding, serialising, checks) sits just above the ground: it names classes by dotted strings and reaches
# them only through ``locate``; the recipes and presets built with it sit near the top.
LAYERS: list[tuple[str, ...]] = [
    ("fastgen.utils",),
    ("fastgen.configs.schema", "fastgen.configs.instantiate", "fastgen.configs.config", "fastgen.configs.config_utils",
     "fastgen.configs.checks"),
    ("fastgen.distributed", "fastgen.checkpoint"),
    ("fastgen.networks", "fastgen.datasets"),
    ("fastgen.methods",),
    ("fastgen.callbacks", "fastgen.profiling", "fastgen.evaluation", "fastgen.pipelines"),
    ("fastgen.trainer",),
    ("fastgen.configs",),
    ("fastgen.cli", "fastgen.templates"),
]


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    stack = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                stack.extend(child.orelse)  # only the else branch runs
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child
            stack.append(child)


def imports(known: dict[str, Path]) -> dict[str, dict[str, int]]:
    """``{module: {imported project module: first line}}``."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        edges: dict[str, int] = {}
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[:len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    targets.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
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

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _layer(module: str) -> int | None:
    matches = [(len(p), level) for level, packages in enumerate(LAYERS) for p in packages
               if module == p or module.startswith(p + ".")]
    return max(matches)[1] if matches else None


def test_no_import_cycles() -> None:
    graph = imports(modules())
    found = cycles(graph)
    described = []
    for component in found:
        members = set(component)
        edges = [f"{a} -> {b} (line {graph[a][b]})" for a in component for b in graph[a] if b in members]
        described.append("; ".join(edges))
    assert not found, "import cycles:\n" + "\n".join(described)


def test_imports_point_down_the_layers() -> None:
    graph = imports(modules())
    upward = []
    for module, edges in graph.items():
        mine = _layer(module)
        if mine is None:
            continue
        for target, line in edges.items():
            theirs = _layer(target)
            if theirs is not None and theirs > mine:
                upward.append(f"{module} -> {target} (line {line})")
    assert not upward, "imports that point up a layer:\n" + "\n".join(sorted(upward))


def test_the_walk_finds_what_it_should(tmp_path: Path) -> None:
    """The checker itself: a function-local import counts, a TYPE_CHECKING one does not, relative imports resolve."""
    known = {"fastgen.a": tmp_path / "a.py", "fastgen.b": tmp_path / "b.py", "fastgen.c": tmp_path / "c.py"}
    known["fastgen.a"].write_text("def f():\n    from fastgen import b\n")
    known["fastgen.b"].write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from fastgen import c\n"
                                  "from . import a\n")
    known["fastgen.c"].write_text("import fastgen.b\n")
    graph = imports(known)
    assert graph == {"fastgen.a": {"fastgen.b": 2}, "fastgen.b": {"fastgen.a": 4}, "fastgen.c": {"fastgen.b": 1}}
    assert cycles(graph) == [["fastgen.a", "fastgen.b"]]
