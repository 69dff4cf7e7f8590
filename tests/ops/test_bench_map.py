"""bench/ keeps its map: few entries at its top, every runnable script listed in bench/README.md
with a command, every command and results file named there existing, every ``bench.*`` import
(and ``bench.MODULE:NAME`` runner path) resolving, and every benchmark module importing.

Imports are checked twice: statically with ``ast`` (every ``from bench... import NAME`` names a
module of bench/ that defines NAME), and by importing every module in one child interpreter. A
module may fail that import only for want of a package of the ``bench`` extra (psutil, the peer
queues), which the test extras do not install."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from docs_pages import README as DOCS_README
from docs_pages import pages

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
README = BENCH / "README.md"
MAX_TOP = 15

COMMAND = re.compile(r"`python\s+(?:-m\s+(bench[\w.]*)|(bench/[a-z_/]+\.py))")
RESULTS = re.compile(r"`(bench/[\w/-]+\.md)`")
RUNNER_PATH = re.compile(r"[\"'`](bench(?:\.\w+)+):(\w+)")


def bench_files() -> list[Path]:
    return sorted(p for p in BENCH.rglob("*.py") if "__pycache__" not in p.parts)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_file(name: str) -> Path | None:
    """The file of module (or package) ``name`` under the repository root, None if none."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def runnable(path: Path) -> bool:
    return path.name == "__main__.py" or '__name__ == "__main__"' in path.read_text()


def readme_commands() -> tuple[set[str], set[str]]:
    """The modules (``python -m``) and the script paths (``python bench/...``) README runs."""
    text = README.read_text(encoding="utf-8")
    found = COMMAND.findall(text)
    return {m for m, _ in found if m}, {p for _, p in found if p}


def defined_names(path: Path) -> set[str]:
    """Names bound at the top level of a module (assignments, defs, classes, imports); a module
    with a ``__getattr__`` (a name built on first use) answers any name."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names | {"*"} if "__getattr__" in names else names


def defines(path: Path, name: str) -> bool:
    names = defined_names(path)
    return name in names or "*" in names


def test_bench_top_level_has_few_entries() -> None:
    top = sorted(p.name for p in BENCH.iterdir() if p.name != "__pycache__")
    assert len(top) <= MAX_TOP, top
    assert "README.md" in top and "__main__.py" in top


def test_every_runnable_script_is_in_the_map() -> None:
    modules, paths = readme_commands()
    scripts = [p for p in bench_files() if runnable(p)]
    assert len(scripts) >= 25, scripts  # (the benchmarks, the A/B tool and two entry points)
    missing = []
    for path in scripts:
        name = module_name(path).removesuffix(".__main__")
        if name not in modules and str(path.relative_to(ROOT)) not in paths:
            missing.append(str(path.relative_to(ROOT)))
    assert missing == [], f"runnable scripts without a command in bench/README.md: {missing}"


def test_every_command_and_results_file_in_the_map_exists() -> None:
    modules, paths = readme_commands()
    assert "bench" in modules and "bench.fleet" in modules and "bench.ab" in modules
    for name in modules:
        file = module_file(name)
        assert file is not None, f"bench/README.md runs {name}: no such module"
        if file.name == "__init__.py":  # (python -m of a package runs its __main__)
            assert (file.parent / "__main__.py").is_file(), name
        else:
            assert runnable(file), f"{name} has no __main__ block"
    for path in paths:
        assert (ROOT / path).is_file(), path
    named = set(RESULTS.findall(README.read_text(encoding="utf-8")))
    results = {str(p.relative_to(ROOT)) for p in BENCH.rglob("RESULTS*.md")}
    assert results - named == set(), "results files missing from bench/README.md"
    assert named - results - {"bench/README.md"} == set(), "bench/README.md names missing files"
    for path in results:
        first = (ROOT / path).read_text(encoding="utf-8").splitlines()[0]
        assert not re.search(r"\bissue\b", first, re.I), (path, first)


def test_bench_imports_and_runner_paths_resolve_statically() -> None:
    wrong = []
    for path in bench_files():
        text = path.read_text()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                if node.module != "bench" and not node.module.startswith("bench."):
                    continue
                target = module_file(node.module)
                if target is None:
                    wrong.append(f"{path.name}: no module {node.module}")
                    continue
                for alias in node.names:
                    sub = module_file(f"{node.module}.{alias.name}")
                    if not defines(target, alias.name) and sub is None:
                        wrong.append(f"{path.name}: {node.module} has no {alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("bench.") and module_file(alias.name) is None:
                        wrong.append(f"{path.name}: no module {alias.name}")
        for mod, attr in RUNNER_PATH.findall(text):
            target = module_file(mod)
            if target is None or not defines(target, attr):
                wrong.append(f"{path.name}: runner path {mod}:{attr} does not resolve")
    assert wrong == []


def test_every_bench_module_imports() -> None:
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    bench_extra = {
        re.split(r"[\[=<>~!; ]", req, maxsplit=1)[0].lower().replace("-", "_")
        for req in extra["optional-dependencies"]["bench"]
    }
    names = [module_name(p) for p in bench_files()]
    code = (
        "import importlib, json, sys\n"
        "out = {}\n"
        "for name in sys.argv[1:]:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as e:\n"
        "        out[name] = ['missing', e.name]\n"
        "    except Exception as e:\n"
        "        out[name] = ['error', repr(e)]\n"
        "print(json.dumps(out))\n"
    )
    src = str(ROOT / "src")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-c", code, *names],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    wrong = {
        name: why
        for name, why in failed.items()
        if not (why[0] == "missing" and (why[1] or "").split(".")[0] in bench_extra)
    }
    assert wrong == {}
    assert len(names) - len(failed) >= 10  # (most import without the bench extra)


# What the docs may name of bench/: a path (file or folder), a module (``python -m bench...``,
# ``bench.ab``) or a runner path (``bench.support.runners:incr``). Placeholders stand for any
# subject or script (``bench/SUBJECT/NAME.py``).
DOC_PATH = re.compile(r"(?<![\w./~-])bench/[\w./-]*")
DOC_MODULE = re.compile(r"(?<![\w./~-])(bench(?:\.[a-z_][a-z0-9_]*)*)(?::(\w+))?")
PLACEHOLDERS = {"SUBJECT", "NAME"}


def doc_sources() -> list[Path]:
    """The docs site's pages, README.md, mkdocs.yml and deviceq's own source (its help texts
    and comments)."""
    src = sorted((ROOT / "src").rglob("*.py"))
    return [*pages(), DOCS_README, ROOT / "mkdocs.yml", *src]


def stale_bench_names(text: str) -> list[str]:
    """Every ``bench/...`` path, ``bench...`` module and ``bench...:NAME`` runner named in
    ``text`` that does not exist in this tree (a ``python -m`` module must also be runnable)."""
    wrong = []

    def run_by_m(m: re.Match[str]) -> bool:
        return text[max(0, m.start() - 3) : m.start()] == "-m "

    for m in DOC_PATH.finditer(text):
        path = m.group(0).rstrip(".,;:")
        stem_parts = {Path(p).stem for p in path.split("/")}
        if stem_parts & PLACEHOLDERS:
            continue
        if not (ROOT / path).exists():
            wrong.append(path)
    for m in DOC_MODULE.finditer(text):
        name, attr = m.group(1), m.group(2)
        if name == "bench" and not run_by_m(m):
            continue  # the word "bench" itself, not a module run
        file = module_file(name)
        if file is None:
            wrong.append(name)
        elif attr and not defines(file, attr):
            wrong.append(f"{name}:{attr}")
        elif run_by_m(m):
            runs = file.parent / "__main__.py" if file.name == "__init__.py" else file
            if not (runs.is_file() and runnable(runs)):
                wrong.append(f"python -m {name} (not runnable)")
    return wrong


def test_stale_bench_names_are_found() -> None:
    text = (
        "`python -m bench.chaos`, `bench/bench_batch.py`, `bench/RESULTS-core.md`, "
        "`bench.runners:incr`, `bench.support.runners:nope`, `python -m bench.support`.\n"
        "Fine: `python -m bench --quick`, `python -m bench.faults.chaos`, "
        "`bench/SUBJECT/NAME.py`, `bench/support/`, `bench.support.runners:incr`, "
        "`bench/lifecycle/RESULTS.md`, ~/.cache/deviceq-bench/venv, a bench.\n"
    )
    assert stale_bench_names(text) == [
        "bench/bench_batch.py",
        "bench/RESULTS-core.md",
        "bench.chaos",
        "bench.runners",
        "bench.support.runners:nope",
        "python -m bench.support (not runnable)",
    ]


def test_the_docs_name_only_bench_paths_and_modules_that_exist() -> None:
    wrong, named = {}, 0
    for source in doc_sources():
        text = source.read_text(encoding="utf-8")
        named += len(DOC_PATH.findall(text)) + text.count("python -m bench")
        if bad := stale_bench_names(text):
            wrong[str(source.relative_to(ROOT))] = bad
    assert wrong == {}, f"stale bench/ names (see bench/README.md for the current ones): {wrong}"
    assert named >= 15, named  # (the pages do name benchmarks: the scan found them)
