"""One benchmark, this tree against a baseline revision, in one run: the benchmark script of
this tree is run alternately on this tree's ``src/`` and on the baseline's (``git archive``),
``--rounds`` times each (A B B A A B ...: each tree goes first as often), so the machine's
noise hits both alike. Each run writes its markdown table (``--out``); the tables must have
the same rows. Printed: per numeric cell, the median over the rounds of each tree and the
ratio this tree / baseline.

Usage, from the repository root::

    python -m bench.ab --baseline REV [--rounds 2] bench/scheduler/assign.py --quick

Everything after the script path is passed to it."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.support.procs import REPO, baseline_tree

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def rows(table: str) -> tuple[list[str], list[list[str]]]:
    """The header cells and the body rows' cells of the first markdown table in ``table``."""
    lines = [ln for ln in table.splitlines() if ln.startswith("|")]
    cells = [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]
    body = [c for c in cells[2:] if not all(set(x) <= set("-: ") for x in c)]
    return cells[0], body


def number(cell: str) -> float | None:
    """The first number of a cell (``1,234`` counts as 1234), None when it has none."""
    m = NUMBER.search(cell.replace(",", "").replace("**", ""))
    return float(m.group()) if m else None


def run_once(tree: Path, script: str, args: list[str], out: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # the tree's deviceq, this tree's benchmark code (a script of the ``bench`` package, e.g.
    # bench/__main__.py, imports it)
    env["PYTHONPATH"] = os.pathsep.join((str(tree / "src"), str(REPO)))
    t0 = time.time()
    subprocess.run(
        [sys.executable, str(REPO / script), *args, "--out", str(out)],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"  {tree.name}: {time.time() - t0:.0f}s", file=sys.stderr, flush=True)
    return out.read_text(encoding="utf-8")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--baseline", required=True, metavar="REV")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("script")
    p.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args()
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        base = baseline_tree(Path(tmp), a.baseline)
        trees = {"this tree": REPO, f"baseline {a.baseline}": base}
        tables: dict[str, list[list[list[str]]]] = {name: [] for name in trees}
        header: list[str] = []
        for r in range(a.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            print(f"round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)
            for name in order:
                text = run_once(trees[name], a.script, a.args, Path(tmp) / f"{r}-{len(name)}.md")
                header, body = rows(text)
                tables[name].append(body)
    new, old = tables["this tree"], tables[f"baseline {a.baseline}"]
    print(f"`{a.script} {' '.join(a.args)}`: this tree ({head}) / baseline {a.baseline}, "
          f"medians of {a.rounds} runs each, interleaved\n")  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for i, row in enumerate(new[0]):
        out = []
        for j, cell in enumerate(row):
            nv = [number(t[i][j]) for t in new]
            ov = [number(t[i][j]) for t in old]
            if j < 3 or None in nv or None in ov:
                out.append(cell)  # (the row's key, or text)
                continue
            n, o = statistics.median(nv), statistics.median(ov)  # type: ignore[type-var]
            ratio = f"{n / o:.2f}x" if o else "-"
            out.append(f"{n:g} / {o:g} = {ratio}")
        print("| " + " | ".join(out) + " |")


if __name__ == "__main__":
    main()
