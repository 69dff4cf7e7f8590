"""How long the ``deviceq`` command takes to start: ``deviceq --version``, ``deviceq --help``,
``deviceq task show --help`` and ``deviceq task show ID`` (a real task, on a private
redis-server; as text and with ``--json``), against the reference
``python -c "import redis, click"`` (the two libraries no deviceq command can do without), in
one run: each round runs every command once, in turn, so all see the same load of the machine.

Each command runs as the console script does (``from deviceq.cli import main; main()``, a fresh
interpreter each time) on this tree's ``src/``; with ``--baseline REV`` (repeatable) also on
the tree of git revision REV (``git archive`` into a temporary folder). Reported per command:
the median and the min of the wall times, and their ratio to the reference's. One more line,
``floor of task show`` (``python -c "import click, deviceq.core.connection"`` on this tree), is
what any command that reads Redis starts with. Every tree is byte-compiled first
(``compileall``, as ``pip install`` does), so that no run compiles deviceq's source: an
environment with ``PYTHONDONTWRITEBYTECODE`` set would otherwise time the compiler too.

Run from the repository root: ``python -m bench.cli.start [--runs 30] [--baseline REV]
[--json]``."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "src"))

from bench.support.procs import baseline_tree  # noqa: E402
from deviceq import Client  # noqa: E402
from deviceq.core.redis_server import RedisServer  # noqa: E402

POOL = "clistart"
LAUNCH = "import sys; from deviceq.cli import main; sys.argv[0] = 'deviceq'; sys.exit(main())"
REFERENCE = "import redis, click"
FLOOR = "import click, deviceq.core.connection"
"""What ``task show`` cannot start without: the pool's connection (the Redis client of any URL
deviceq takes, Sentinel, Cluster redirects and TLS included) and its scripts."""


def commands(url: str, task_id: str) -> dict[str, list[str]]:
    """What is timed: each a deviceq argument list."""
    show = ["--redis-url", url, "--pool", POOL, "task", "show", task_id]
    return {
        "--version": ["--version"],
        "--help": ["--help"],
        "task show --help": ["task", "show", "--help"],
        "task show ID": show,
        "task show ID --json": [*show, "--json"],
    }


def timed(argv: list[str], env: dict[str, str]) -> float:
    """Wall seconds of one run (it must succeed)."""
    t0 = time.perf_counter()
    out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(f"{argv} exited {out.returncode}: {out.stderr[-2000:]}")
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=30, help="runs of each command (default 30)")
    p.add_argument("--baseline", metavar="REV", action="append", default=[],
                   help="also time the tree of git revision REV (repeatable)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    a = p.parse_args()

    base_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base_env["COLUMNS"] = "80"
    with tempfile.TemporaryDirectory(prefix="deviceq-clistart-") as tmp, RedisServer() as srv:
        trees = {"this tree": REPO}
        for rev in a.baseline:
            trees[f"revision {rev}"] = baseline_tree(Path(tmp), rev)
        with Client(srv.url, POOL) as client:
            task_id = client.submit("say hi", driver_type="android")
        runs: dict[str, list[str]] = {"reference": [sys.executable, "-c", REFERENCE]}
        envs: dict[str, dict[str, str]] = {"reference": base_env}
        runs["floor of task show"] = [sys.executable, "-c", FLOOR]
        envs["floor of task show"] = {**base_env, "PYTHONPATH": str(REPO / "src")}
        for name, tree in trees.items():
            env = {**base_env, "PYTHONPATH": str(tree / "src")}
            for what, args in commands(srv.url, task_id).items():
                key = f"{what} ({name})"
                runs[key] = [sys.executable, "-c", LAUNCH, *args]
                envs[key] = env
        for tree in trees.values():  # bytecode as an installed package has it
            subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "src")],
                           check=True)  # fmt: skip
        for key in runs:  # warm the file cache once
            timed(runs[key], envs[key])
        times: dict[str, list[float]] = {key: [] for key in runs}
        for _ in range(a.runs):
            for key, argv in runs.items():
                times[key].append(timed(argv, envs[key]))

    ref_med = statistics.median(times["reference"])
    ref_min = min(times["reference"])
    results: dict[str, Any] = {
        "runs": a.runs,
        "python": sys.version.split()[0],
        "command": " ".join(
            [
                "python -m bench.cli.start",
                f"--runs {a.runs}",
                *(f"--baseline {r}" for r in a.baseline),
            ]
        ),  # fmt: skip
        "results": {},
    }
    for key, ts in times.items():
        med, low = statistics.median(ts), min(ts)
        results["results"][key] = {
            "median_ms": round(med * 1000, 1),
            "min_ms": round(low * 1000, 1),
            "ratio_median": round(med / ref_med, 2),
            "ratio_min": round(low / ref_min, 2),
        }
    if a.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{a.runs} runs of each, interleaved; python {results['python']}")
    head = ("command", "median ms", "min ms", "x ref (median)", "x ref (min)")
    print(f"{head[0]:<44} {head[1]:>10} {head[2]:>8} {head[3]:>15} {head[4]:>12}")
    for key, r in results["results"].items():
        print(f"{key:<44} {r['median_ms']:>10.1f} {r['min_ms']:>8.1f} "
              f"{r['ratio_median']:>15.2f} {r['ratio_min']:>12.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
