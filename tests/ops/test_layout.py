"""The layout of src/deviceq shows its structure: rooms (its subpackages) in layers, no import
from a room up to a higher layer (`LAYERS`), no import cycle between its modules, and the
architecture map (docs/internals/architecture.md) names every module. A module past a size
limit is only warned about: a module is one concept, split by what it holds, never to meet a
line count.

The import graph is read with ``ast`` (nothing is imported): every ``import``/``from ...
import`` in a module is an edge, a function-level one too (it runs as soon as the function
does), and one under ``if TYPE_CHECKING:`` as well (it never runs, but it is a dependence all
the same: a cycle it closes is a cycle of concepts). And the command line starts without the
heavy libraries (each command imports what it runs when it runs)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "deviceq"
ARCHITECTURE = ROOT / "docs" / "internals" / "architecture.md"

MAX_LINES = 500
"""A module longer than this is warned about (a hint to look at it, never a reason to split)."""

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"core"}),
    frozenset({"artifacts", "suites"}),
    frozenset({"producer", "scheduler", "host"}),
    frozenset({"ops"}),
    frozenset({"services"}),
    frozenset({"api", "dashboard"}),
    frozenset({"cli"}),
    frozenset({"deviceq", "deviceq.__main__"}),
)
"""The rooms of src/deviceq, lowest first: a module may import from its own room and from the
rooms of lower layers only. The shared core; the artifact store; the three roles (the
scheduler holding its placement pipeline); the operator's tools (admin, status, explain,
verify, acl, demo); the runtime services the scheduler runs (webhooks, schedules, metrics:
they read the operator's status views); the HTTP service and the dashboard; the command line;
the package's face (``deviceq/__init__.py``: every public name, imported on first use)."""


def module_files() -> dict[str, Path]:
    """Every module of the package by its dotted name."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under ``node`` but those of an ``if TYPE_CHECKING:`` body."""
    found: list[ast.Import | ast.ImportFrom] = []
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking(child.test):
            for other in child.orelse:
                found += _imports_of(other)
            continue
        found += _imports_of(child)
    return found


def _imports_of(node: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    own = [node] if isinstance(node, ast.Import | ast.ImportFrom) else []
    return own + _imports(node)


def every_import(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement under ``tree``, those under ``if TYPE_CHECKING:`` too."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {module of the package it imports: line of the first such import}, run-time
    and ``TYPE_CHECKING`` imports alike. ``from pkg import name`` names the submodule
    ``pkg.name`` when there is one, else ``pkg``."""
    modules = module_files()
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in sorted(every_import(tree), key=lambda n: n.lineno):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [
                    f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                    for a in node.names
                ]
            for target in targets:
                while target not in modules and "." in target:
                    target = target.rpartition(".")[0]
                if target in modules and target != name:
                    edges.setdefault(target, node.lineno)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan), as the list of
    modules ``a -> b -> ... -> a``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_one_cycle(graph, group) for group in groups]


def _one_cycle(graph: dict[str, dict[str, int]], group: set[str]) -> list[str]:
    """A shortest cycle from the group's first module back to it, inside the group."""
    start = min(group)
    paths = {start: [start]}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(graph[v]):
            if w == start:
                return [*paths[v], start]
            if w in group and w not in paths:
                paths[w] = [*paths[v], w]
                queue.append(w)
    raise AssertionError(f"no cycle in {group}")


def describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in zip(cycle, cycle[1:], strict=False)]
    return "\n  ".join(steps)


def test_the_import_graph_has_no_cycles() -> None:
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles:\n  " + "\n\n  ".join(describe(graph, c) for c in found)


def room_of(module: str) -> str:
    """A module's room: its top subpackage (``deviceq.host.runners.base`` -> ``host``); the
    package's own ``__init__`` and ``__main__`` are rooms of their own."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return module
    return parts[1]


def layer_of(room: str) -> int:
    for i, rooms in enumerate(LAYERS):
        if room in rooms:
            return i
    raise AssertionError(f"room {room} is in no layer of LAYERS: place it")


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """Each import of a module from a room of a higher layer than its own."""
    return [
        f"{a} (line {line}) -> {b}"
        for a, edges in sorted(graph.items())
        for b, line in sorted(edges.items())
        if layer_of(room_of(b)) > layer_of(room_of(a))
    ]


def test_no_room_imports_a_room_above_it() -> None:
    graph = import_graph()
    up = upward_imports(graph)
    assert not up, "imports from a higher layer (see LAYERS):\n  " + "\n  ".join(up)


def test_the_layer_check_sees_an_import_up_and_lets_one_down_pass() -> None:
    graph = {
        "deviceq.core.keys": {},
        "deviceq.host.link": {"deviceq.core.keys": 3},
        "deviceq.host.lists": {"deviceq.cli.files": 7},
        "deviceq.cli.files": {"deviceq.host.link": 9},
    }
    assert upward_imports(graph) == ["deviceq.host.lists (line 7) -> deviceq.cli.files"]
    assert {room_of(m) for m in graph} | {room_of("deviceq"), room_of("deviceq.__main__")} <= {
        r for rooms in LAYERS for r in rooms
    }


def test_the_cycle_finder_sees_a_function_level_import_and_a_type_checking_one(
    tmp_path: Path,
) -> None:
    tree = ast.parse(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .b import B\n"
        "def f():\n    from .c import C\n"
    )
    names = [node.module for node in _imports(tree) if isinstance(node, ast.ImportFrom)]
    assert names == ["typing", "c"]  # what runs
    every = [node.module for node in every_import(tree) if isinstance(node, ast.ImportFrom)]
    assert sorted(every, key=str) == ["b", "c", "typing"]  # what the graph holds
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert "a (line 1) -> b" in describe(graph, ["a", "b", "c", "a"])


def test_modules_over_the_line_limit_are_warned_about() -> None:
    """A warning, never a failure: a long module is worth a look, not a split by count."""
    sizes = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in module_files().values()
    }
    assert sizes and all(n > 0 for m, n in sizes.items() if not m.endswith("__init__.py"))
    over = sorted(f"{m} ({n} lines)" for m, n in sizes.items() if n > MAX_LINES)
    if over:
        warnings.warn(f"modules over {MAX_LINES} lines: {over}", stacklevel=1)


def architecture_map() -> str:
    return ARCHITECTURE.read_text(encoding="utf-8")


def test_the_architecture_map_names_every_module() -> None:
    """Each module by its path under src/deviceq (``host/log_stream.py``); a package's
    ``__init__.py`` by its folder (``ops/verify/``)."""
    section = architecture_map()
    missing = []
    for path in module_files().values():
        rel = path.relative_to(PACKAGE).as_posix()
        if path.name == "__init__.py":
            rel = rel.removesuffix("__init__.py") or "__init__.py"
        if not re.search(rf"(?<![\w/.]){re.escape(rel)}(?![\w/])", section):
            missing.append(rel)
    assert not missing, f"{ARCHITECTURE.relative_to(ROOT)} does not name: {missing}"


HEAVY = ("pydantic", "pydantic_settings", "rich", "yaml", "starlette", "uvicorn", "httpx",
         "fsspec", "deviceq.core.models", "deviceq.producer", "deviceq.scheduler")  # fmt: skip
"""What ``deviceq --help``, ``--version`` and a command's ``--help`` must start without (each
command imports what it runs inside its function)."""


def test_the_command_line_starts_without_the_heavy_modules() -> None:
    probe = (
        "import sys\n"
        "from deviceq.cli import main\n"
        "for args in (['--version'], ['--help'], ['task', 'show', '--help']):\n"
        "    try:\n"
        "        main(args, prog_name='deviceq')\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"heavy = {HEAVY!r}\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)), file=sys.stderr)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "deviceq, version" in out.stdout and "Commands:" in out.stdout
    assert "Show every field of a task" in out.stdout
    assert out.stderr.strip() == "[]", f"imported to start: {out.stderr}"


def _type_checking_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        if isinstance(node, ast.If) and _type_checking(node.test):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import | ast.ImportFrom):
                    names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
    return names


def runtime_uses_of_type_only_names(tree: ast.Module) -> list[tuple[int, str]]:
    """Names imported only under ``if TYPE_CHECKING:`` and used where the code runs (not in
    an annotation, and not in a function that imports the name itself): a NameError then."""
    only_typed = _type_checking_names(tree)
    annotations = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and arg.annotation is not None:
                    annotations.add(id(arg.annotation))
            if node.returns is not None:
                annotations.add(id(node.returns))
        elif isinstance(node, ast.AnnAssign):
            annotations.add(id(node.annotation))
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST, bound: frozenset[str]) -> None:
        if id(node) in annotations:
            return
        if isinstance(node, ast.If) and _type_checking(node.test):
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            own = {
                (a.asname or a.name).split(".")[0]
                for sub in ast.walk(node)
                if isinstance(sub, ast.Import | ast.ImportFrom)
                for a in sub.names
            }
            bound = bound | own
        elif isinstance(node, ast.Name) and node.id in only_typed and node.id not in bound:
            found.append((node.lineno, node.id))
        for child in ast.iter_child_nodes(node):
            visit(child, bound)

    visit(tree, frozenset())
    return found


def test_no_name_imported_for_type_checking_only_is_used_at_run_time() -> None:
    """What moving imports into the functions that use them can break, unseen by ruff and
    mypy: a name left only under ``if TYPE_CHECKING:`` that the code uses."""
    found = [
        f"{path.relative_to(PACKAGE).as_posix()}:{line}: {name}"
        for path in module_files().values()
        for line, name in runtime_uses_of_type_only_names(ast.parse(path.read_text("utf-8")))
    ]
    assert not found, f"used at run time, imported only under TYPE_CHECKING: {found}"
    sample = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from x import A, B\n"
        "def f(a: A) -> B:\n    return B()\n"
        "def g() -> A:\n    from x import A\n    return A()\n"
    )
    assert runtime_uses_of_type_only_names(sample) == [(5, "B")]
