"""What loading a script's helpers costs per call: every transition script called with no
arguments (each refuses that with an ``INVALID`` or ``AUTH`` reply before any read or write,
so the call is the script's load, its helper files' and the settings tables', plus one check),
for this tree and for a reference tree (``git archive REV``), side by side on one private
redis-server, interleaved round by round. Per call: the server's ``EVALSHA`` usec (from
``INFO commandstats``) and redis-server CPU (user + sys), the part above a bare
``return 1``, and the bytes of the script as sent.

Run through ``python bench/bench_transitions.py --library [--baseline REV]``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis

from common import commandstats, machine, median, private_redis, raw_client, redis_cpu_s, table

REPO = Path(__file__).resolve().parents[1]
PREFIX = "dq:{bench}:"

SOURCES = (
    "import json\n"
    "from deviceq.core import scripts\n"
    "print(json.dumps({n: scripts.source(n) for n in scripts.names()}))\n"
)


def tree_sources(tree: Path) -> dict[str, str]:
    """Every script of ``tree`` as that tree's deviceq sends it (in a process of its own)."""
    env = dict(os.environ, PYTHONPATH=str(tree / "src"))
    out = subprocess.run([sys.executable, "-c", SOURCES], cwd=tree, env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"reading the scripts of {tree} failed:\n{out.stderr[-2000:]}")
    sources: dict[str, str] = json.loads(out.stdout)
    return sources


def archive(rev: str, dest: Path) -> Path:
    """The files of git revision ``rev`` of this repository, under ``dest``."""
    data = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                          capture_output=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(dest)], input=data, check=True)
    return dest


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
        trees = {"this tree": tree_sources(REPO), f"{rev}": tree_sources(archive(rev, Path(tmp)))}
    here, ref = trees
    common_names = sorted(set(trees[here]) & set(trees[ref]))
    floor_src = "return 1"
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    load0 = machine()
    with private_redis() as server:
        r = raw_client(server.url)
        shas = {(t, s): r.script_load(trees[t][s]) for t in trees for s in common_names}
        floor = r.script_load(floor_src)
        for sha in [*shas.values(), floor]:  # warm: every script compiled and run once
            calls(r, sha, 10)
        for i in range(rounds):
            order = list(trees) if i % 2 == 0 else list(reversed(trees))
            results.setdefault(("floor", "return 1"), []).append(calls(r, floor, n))
            for s in common_names:
                for t in order:
                    results.setdefault((t, s), []).append(calls(r, shas[(t, s)], n))
        r.close()
    load1 = machine()

    def med(key: tuple[str, str], i: int) -> float:
        return median(x[i] for x in results[key])

    f_us, f_cpu = med(("floor", "return 1"), 0), med(("floor", "return 1"), 1)
    rows: list[list[Any]] = []
    sums = {t: [0.0, 0.0] for t in trees}
    for s in common_names:
        a_us, b_us = med((here, s), 0), med((ref, s), 0)
        a_cpu, b_cpu = med((here, s), 1), med((ref, s), 1)
        for t, us, cpu in ((here, a_us, a_cpu), (ref, b_us, b_cpu)):
            sums[t][0] += us
            sums[t][1] += cpu
        rows.append([s, len(trees[here][s]), len(trees[ref][s]), a_us, b_us, a_us / b_us,
                     a_us - f_us, b_us - f_us, (a_us - f_us) / (b_us - f_us), a_cpu, b_cpu,
                     a_cpu / b_cpu])  # fmt: skip
    k = len(common_names)
    a_us, a_cpu = sums[here][0] / k, sums[here][1] / k
    b_us, b_cpu = sums[ref][0] / k, sums[ref][1] / k
    mean = [a_us, b_us, a_us / b_us, a_us - f_us, b_us - f_us, (a_us - f_us) / (b_us - f_us)]
    rows.append([f"mean of the {k} scripts", "", "", *mean, a_cpu, b_cpu, a_cpu / b_cpu])
    rows.append(["ref: EVALSHA `return 1`", len(floor_src), len(floor_src), f_us, f_us, 1.0,
                 0.0, 0.0, float("nan"), f_cpu, f_cpu, 1.0])  # fmt: skip
    head = [
        "script (no arguments: refused at once)",
        "bytes sent (this)",
        f"bytes sent ({ref})",
        "server µs/call (this)",
        f"server µs/call ({ref})",
        "x",
        "above `return 1` (this)",
        f"above `return 1` ({ref})",
        "x",
        "redis CPU µs/call (this)",
        f"redis CPU µs/call ({ref})",
        "x",
    ]
    return "\n".join(
        [
            f"machine before: {load0}",
            table(head, rows),
            f"{rounds} rounds x {n:,} calls per script and tree (pipelined, 500 a batch), "
            f"medians over rounds; the two trees alternate within a round, on one server",
            f"machine after: {load1}",
        ]
    )
