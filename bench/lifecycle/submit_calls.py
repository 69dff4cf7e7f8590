"""How long one ``submit.lua`` call of a big ``Client.submit_many`` holds Redis.

Per task shape (a short goal; 16 KiB goals; 8,192 two-byte characters; a list of 1,000
tests, 2,000 such tasks), on a fresh private redis-server (under SCHED_FIFO when run as
root, so that SLOWLOG times the calls' own work rather than the time this process takes the
CPU from it): one ``submit_many`` of N tasks (100,000; 20,000 for the big shapes), then from ``INFO
commandstats`` the calls and Redis µs per task, and from ``SLOWLOG`` (every call over 0.5 ms)
the longest call, the 99th percentile and the median of the calls logged, and how many took
over 5 ms. No script call may hold Redis over 5 ms (`deviceq.core.bounds`: ``submit_many``
sizes its all-or-nothing calls by the tasks' declared cost).

Usage: ``python bench/lifecycle/submit_calls.py [--tasks 100000] [--shapes short,goal16k]
[--out FILE]``"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.fleet.probes import read_slowlog
from bench.support.common import commandstats, machine, preload_scripts, raw_client, table
from deviceq import Client, PoolAdmin
from deviceq.core import scripts
from deviceq.core.redis_server import RedisServer

LOGGED_US = 500  # SLOWLOG keeps every call over this
SHAPES: dict[str, dict[str, Any]] = {
    "short": {"goal": "open the settings app"},
    "goal16k": {"goal": "x" * 16384},
    "utf8_16k": {"goal": "é" * 8192},
    "tests1k": {"goal": "run {tests}", "tests": [f"tests/m{i:04d}.py::case" for i in range(1000)]},
}
BIG = 20_000  # tasks of the big shapes (16 KiB each: 100,000 would hold 1.6 GB)
TESTS = 2_000  # tasks with a list of 1,000 tests (~22 KB each)


def realtime(pid: int) -> bool:
    """SCHED_FIFO for every thread of ``pid`` (root only): False when it cannot be set."""
    done = subprocess.run(["chrt", "-a", "-f", "-p", "10", str(pid)], capture_output=True)
    return done.returncode == 0


def measure(shape: str, n: int) -> list[Any]:
    srv = RedisServer().start()
    try:
        fifo = srv.proc is not None and realtime(srv.proc.pid)
        r = raw_client(srv.url)
        PoolAdmin(srv.url, "sub").set_config("max_queue_depth", n + 1000)
        preload_scripts(r)
        r.config_set("slowlog-log-slower-than", LOGGED_US)
        r.config_set("slowlog-max-len", 100_000)
        r.slowlog_reset()
        sha = scripts.sha("submit")
        before = commandstats(r).get("evalsha", {})
        t = time.perf_counter()
        ids = Client(srv.url, "sub").submit_many([dict(SHAPES[shape]) for _ in range(n)])
        wall = time.perf_counter() - t
        after = commandstats(r).get("evalsha", {})
        calls = int(after.get("calls", 0) - before.get("calls", 0))
        usec = after.get("usec", 0) - before.get("usec", 0)
        logged = sorted(
            e.duration_ms for e in read_slowlog(r, {sha: "submit"}, 100_000) if e.script == "submit"
        )
        r.close()
    finally:
        srv.stop()
    longest = logged[-1] if logged else 0.0
    p99 = logged[min(len(logged) - 1, int(len(logged) * 0.99))] if logged else 0.0
    return [shape, len(ids), calls, round(len(ids) / max(1, calls), 1), usec / max(1, len(ids)),
            usec / max(1, calls) / 1000, longest, p99,
            statistics.median(logged) if logged else 0.0, sum(1 for d in logged if d > 5),
            "yes" if fifo else "no", round(wall, 1)]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000, help="tasks of a short shape [100000]")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"of {','.join(SHAPES)}")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    a = ap.parse_args()
    rows = []
    for shape in a.shapes.split(","):
        n = a.tasks if shape == "short" else min(a.tasks, TESTS if shape == "tests1k" else BIG)
        rows.append(measure(shape, n))
        print(rows[-1], file=sys.stderr, flush=True)
    text = table(["shape", "tasks", "calls", "tasks/call", "Redis µs/task", "mean call ms",
                  f"longest call ms (SLOWLOG > {LOGGED_US / 1000} ms)", "p99 ms", "median ms",
                  "calls > 5 ms", "SCHED_FIFO", "wall s"], rows)  # fmt: skip
    text += f"\n\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {machine()}\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
