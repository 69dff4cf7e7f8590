"""What loading a script's helpers costs per call: every transition script called with no
arguments (each refuses that with an ``INVALID`` or ``AUTH`` reply before any read or write,
so the call is the script's load, its helper files' and the settings tables', plus one check),
for this tree and for a reference tree (``git archive REV``), side by side on one private
redis-server, interleaved round by round. Per call: the server's ``EVALSHA`` usec (from
``INFO commandstats``) and redis-server CPU (user + sys), the part above a bare
``return 1``, and the bytes of the script as sent.

Run through ``python bench/lifecycle/transitions.py --library [--baseline REV]``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis

from bench.support.common import (
    commandstats,
    machine,
    median,
    private_redis,
    raw_client,
    redis_cpu_s,
    table,
)
from bench.support.procs import REPO, baseline_tree

PREFIX = "dq:{bench}:"

FLOOR = "return 1"
SOURCES = (
    "import json\n"
    "from deviceq.core import scripts\n"
    "from deviceq.core.config import PoolConfig\n"
    "out = {n: [scripts.source(n), (scripts.lua_dir() / f'{n}.lua').read_text()]\n"
    "       for n in scripts.names()}\n"
    "out[''] = [PoolConfig.lua_defaults(), '']\n"
    "print(json.dumps(out))\n"
)


def tree_sources(tree: Path) -> dict[str, list[str]]:
    """Every script of ``tree``: as that tree's deviceq sends it, and its own text (in a
    process of its own)."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    out = subprocess.run([sys.executable, "-c", SOURCES], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"reading the scripts of {tree} failed:\n{out.stderr[-2000:]}")
    sources: dict[str, list[str]] = json.loads(out.stdout)
    return sources


def calls(r: redis.Redis, sha: str, n: int) -> tuple[float, float]:
    """``n`` argument-less EVALSHAs of ``sha`` (pipelined, 500 a batch): server usec and
    redis-server CPU usec per call."""
    before, cpu0 = commandstats(r), redis_cpu_s(r)
    left = n
    while left:
        p = r.pipeline(transaction=False)
        for _ in range(min(500, left)):
            p.evalsha(sha, 1, PREFIX)
        p.execute(raise_on_error=False)
        left -= min(500, left)
    cpu = (redis_cpu_s(r) - cpu0) * 1e6 / n
    after = commandstats(r)
    got = after["evalsha"]["calls"] - before.get("evalsha", {}).get("calls", 0)
    assert got == n, (got, n)
    usec = after["evalsha"]["usec"] - before.get("evalsha", {}).get("usec", 0)
    return usec / n, cpu


def run(rev: str, rounds: int, n: int) -> str:
    with tempfile.TemporaryDirectory(prefix="dq-bench-lib-") as tmp:
        trees = {
            "this tree": tree_sources(REPO),
            f"{rev}": tree_sources(baseline_tree(Path(tmp), rev)),
        }
    here, ref = trees
    scripts = sorted(set(trees[here]) & set(trees[ref]) - {""})
    # each variant's text: the refused call (the script as sent) and its load alone (what is
    # sent before the script's own text, then `return 1`)
    texts: dict[tuple[str, str, str], str] = {}
    for t in trees:
        for s in scripts:
            full, body = trees[t][s]
            assert full.endswith(body), (t, s)
            texts[(t, s, "call")] = full
            texts[(t, s, "load")] = full[: len(full) - len(body)] + "\n" + FLOOR
        texts[(t, "", "load")] = trees[t][""][0] + "\n" + FLOOR  # the settings tables alone
    results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    load0 = machine()
    with private_redis() as server:
        r = raw_client(server.url)
        shas = {key: r.script_load(text) for key, text in texts.items()}
        floor = r.script_load(FLOOR)
        for sha in [*shas.values(), floor]:  # warm: every script compiled and run once
            calls(r, sha, 10)
        for i in range(rounds):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            results.setdefault(("", "", "floor"), []).append(calls(r, floor, n))
            for t in order:
                results.setdefault((t, "", "load"), []).append(calls(r, shas[(t, "", "load")], n))
            for s in scripts:
                for v in ("load", "call"):
                    for t in order:
                        results.setdefault((t, s, v), []).append(calls(r, shas[(t, s, v)], n))
        r.close()
    load1 = machine()

    def med(t: str, s: str, v: str, i: int) -> float:
        """Median over rounds of server usec (i = 0) or redis CPU (i = 1) per call."""
        if s == "mean":
            return sum(med(t, x, v, i) for x in scripts) / len(scripts)
        return median(x[i] for x in results[(t, s, v)])

    f_us, f_cpu = med("", "", "floor", 0), med("", "", "floor", 1)
    rows: list[list[Any]] = []
    for s in [*scripts, "mean"]:
        size: list[Any] = ["", ""]
        if s != "mean":
            size = [len(texts[(here, s, "call")]), len(texts[(ref, s, "call")])]
        load = [med(t, s, "load", 1) - f_cpu for t in trees]
        cpu = [med(t, s, "call", 1) for t in trees]
        usec = [med(t, s, "call", 0) for t in trees]
        label = s if s != "mean" else f"mean of the {len(scripts)} scripts"
        rows.append([label, *size, *load, load[0] / load[1], *cpu, cpu[0] / cpu[1],
                     *usec, usec[0] / usec[1]])  # fmt: skip
    tables = [med(t, "", "load", 1) - f_cpu for t in trees]
    rows.append(["the settings tables alone (DEFAULTS, BOUNDS, SDEFAULTS)",
                 len(trees[here][""][0]), len(trees[ref][""][0]), *tables, tables[0] / tables[1],
                 float("nan"), float("nan"), float("nan"), float("nan"), float("nan"),
                 float("nan")])  # fmt: skip
    rows.append([f"ref: EVALSHA `{FLOOR}`", len(FLOOR), len(FLOOR), 0.0, 0.0, float("nan"),
                 f_cpu, f_cpu, 1.0, f_us, f_us, 1.0])  # fmt: skip
    head = [
        "script",
        "bytes sent (this)",
        f"bytes sent ({ref})",
        "load: redis CPU µs/call (this)",
        f"load ({ref})",
        "x",
        "refused call: redis CPU µs (this)",
        f"refused call ({ref})",
        "x",
        "refused call: server µs (this)",
        f"server µs ({ref})",
        "x",
    ]
    return "\n".join(
        [
            f"machine before: {load0}",
            table(head, rows),
            "load = what is sent before the script's own text (settings tables, helpers), then "
            f"`{FLOOR}`, minus a bare `{FLOOR}`; refused call = the script as sent, called "
            "with no arguments (INVALID / AUTH before any read)",
            f"{rounds} rounds x {n:,} calls per variant, script and tree (pipelined, 500 a batch),"
            " medians over rounds; the two trees alternate within a round, on one server",
            f"machine after: {load1}",
        ]
    )
