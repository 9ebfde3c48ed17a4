"""How the package's modules depend on each other: no import cycles, the core never
reaches up into the command line, and no module reads another's private names.

Read from the source with ast: an import inside a function, or under TYPE_CHECKING, ties
two modules together as much as one at the top of the file, and counts the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The command line: click commands, each turning options into one library call.
COMMAND_LAYER = ("cronjob.cli", "cronjob.commands")
# What starts the command line, and so may import it (but not its commands).
ENTRY_POINTS = {"cronjob.__main__", "cronjob.django.management.commands.jobrunner"}


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` (a directory under `root`), by its dotted name."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def named_imports(name: str, path: Path) -> set[str]:
    """The absolute names the imports of module `name` (at `path`) give, wherever they stand.

    `from a.b import c` gives `a.b` and `a.b.c`: c may be a submodule or a name in `a.b`.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join([*base, module] if module else base)
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Each module of `package`, and the modules of `package` that importing it imports.

    Importing `a.b.c` runs `a` and `a.b` first, so they count too; a module's own
    packages do not (they run before it, whatever it imports).
    """
    found = modules(root, package)
    graph = {}
    for name, path in found.items():
        deps = set()
        for imported in named_imports(name, path):
            while imported and imported not in found:
                imported = imported.rpartition(".")[0]
            while imported:
                if imported != name and not name.startswith(imported + "."):
                    deps.add(imported)
                imported = imported.rpartition(".")[0]
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Each group of modules that import each other: one shortest cycle through it, as
    `a -> b -> a` from its first module by name, and the group's other modules."""
    importers: dict[str, set[str]] = {name: set() for name in graph}
    for name, deps in graph.items():
        for dep in deps:
            importers[dep].add(name)
    found, placed = [], set()
    for start in sorted(graph):
        if start in placed:
            continue
        # Breadth first, each module reached remembering the one it was reached from.
        reached_from: dict[str, str] = {}
        frontier = [start]
        while frontier and start not in reached_from:
            following = []
            for module in frontier:
                for dep in sorted(graph[module] - reached_from.keys()):
                    reached_from[dep] = module
                    following.append(dep)
            frontier = following
        if start not in reached_from:
            continue
        path = [start, reached_from[start]]
        while path[-1] != start:
            path.append(reached_from[path[-1]])
        group = _reachable(graph, start) & _reachable(importers, start)
        others = sorted(group - set(path))
        found.append(
            " -> ".join(reversed(path)) + (f" (with {', '.join(others)})" if others else "")
        )
        placed |= group
    return found


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    reached, frontier = {start}, {start}
    while frontier:
        frontier = set().union(*(graph[module] for module in frontier)) - reached
        reached |= frontier
    return reached


def _in_command_layer(name: str) -> bool:
    return any(name == layer or name.startswith(layer + ".") for layer in COMMAND_LAYER)


def test_no_module_of_the_package_imports_one_that_imports_it_back():
    graph = import_graph(ROOT, "cronjob")
    assert "cronjob.tick.drain" in graph  # the walk reaches subpackages
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(found)


def test_nothing_below_the_command_line_imports_it():
    graph = import_graph(ROOT, "cronjob")
    reaching_up = {
        f"{name} imports {dep}"
        for name, deps in graph.items()
        if not _in_command_layer(name)
        for dep in deps
        if _in_command_layer(dep) and not (name in ENTRY_POINTS and dep == "cronjob.cli")
    }
    assert not reaching_up, "\n".join(sorted(reaching_up))


def test_the_graph_counts_imports_in_functions_under_type_checking_and_relative(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "top.py").write_text("from pkg.sub import inner\n")
    (package / "sub" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..other import X\n"
    )
    (package / "sub" / "inner.py").write_text("def f():\n    from . import deep\n")
    (package / "sub" / "deep.py").write_text("def g():\n    import pkg.top\n")
    (package / "other.py").write_text("import json\n")

    graph = import_graph(tmp_path, "pkg")

    assert graph == {
        "pkg": set(),
        "pkg.top": {"pkg.sub", "pkg.sub.inner"},
        "pkg.sub": {"pkg.other"},
        "pkg.sub.inner": {"pkg.sub.deep"},
        "pkg.sub.deep": {"pkg.top"},
        "pkg.other": set(),
    }
    assert cycles(graph) == ["pkg.sub.deep -> pkg.top -> pkg.sub.inner -> pkg.sub.deep"]


# -- private names stay private --


# A named tuple's own API, underscored only so that it cannot clash with a field's name.
NAMED_TUPLE_API = frozenset({"_fields", "_field_defaults", "_make", "_replace", "_asdict"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in NAMED_TUPLE_API


def private_reads(name: str, path: Path) -> list[str]:
    """Where module `name` (at `path`) reads a private name of another module or object.

    `x._y` is allowed on `self`, `cls`, `super()`, a class of the module's own and a module
    from outside the package (the standard library's `sys._current_frames`); `from m import
    _y` only from the module's own package, whose `__init__` may hold underscored fragments
    its modules share (`cronjob.queries`).
    """
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    own = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    foreign = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.split(".")[0] != name.split(".")[0]
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in {"self", "cls", *own, *foreign}:
                continue
            if isinstance(owner, ast.Call) and ast.unparse(owner.func) == "super":
                continue
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and node.module != package:
            found += [
                (node.lineno, f"from {node.module} import {alias.name}")
                for alias in node.names
                if _private(alias.name)
            ]
    return [f"{name}:{line}: {read}" for line, read in sorted(found)]


def test_no_module_of_the_package_reads_another_ones_private_names():
    found = {
        name: reads
        for name, path in modules(ROOT, "cronjob").items()
        if (reads := private_reads(name, path))
    }
    assert found == {}


def test_the_private_name_check_finds_reads_from_outside_but_not_a_modules_own(tmp_path):
    source = tmp_path / "runner.py"
    source.write_text(
        "import sys\n"
        "from pkg import _SHARED\n"
        "from pkg.other import _helper\n"
        "class Own:\n"
        "    def __init__(self, ctx):\n"
        "        self._ctx = ctx\n"
        "        super()._setup()\n"
        "        sys._current_frames()\n"
        "        Own._code = ctx.run_id\n"
        "    def run(self, ctx):\n"
        "        return ctx._run, self._ctx._connect\n"
    )

    assert private_reads("pkg.runner", source) == [
        "pkg.runner:3: from pkg.other import _helper",
        "pkg.runner:11: ctx._run",
        "pkg.runner:11: self._ctx._connect",
    ]
