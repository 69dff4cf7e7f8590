"""Where the host daemon's CPU per task goes, with deviceq's real daemons: ``deviceq scheduler
run`` and one ``deviceq host run`` serving ``--devices`` devices (goal runner
``bench.fleet.runners:hold_goal``: every task only sleeps ``--task-s`` seconds), on a private
redis-server of its own. Enough tasks are queued for ``--rounds`` rounds of every device; the
window runs from the end of the first round to the end of the last but one (the queue never
empty).

Over the window, per task done: the host daemon's CPU (``psutil``), split into its main
thread (claims and the inbox wait) and all its other threads (runner threads, reports,
renewals, heartbeats, the watchdog), from each thread's ``/proc/PID/task/TID/schedstat``
(nanoseconds on a CPU; the tick-based ``stat`` fields round a thread that runs for less than
a tick down to nothing); the scheduler daemon's CPU; redis-server's CPU; and the script calls
(``EVALSHA``) and inbox waits (``BLPOP``) the server ran, all clients together.

Usage: ``python bench/fleet/host_cpu.py [--task-s 1.0] [--rounds 20] [--devices 100] [--async]
[--out F]`` (``--async``: goal runner ``hold_goal_async``, an async runner on the host's event
loop);
side by side with a baseline:
``python -m bench.ab --baseline REV --rounds 3 bench/fleet/host_cpu.py``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.fleet.daemons import done_count, held_fleet, host_bench_args  # noqa: E402
from bench.support.common import redis_cpu_s
from bench.support.drain import tree_cpu_s  # noqa: E402
from bench.support.procs import Registry, log  # noqa: E402


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each live thread of ``pid`` (schedstat: nanoseconds on a CPU)."""
    out: dict[int, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError):
            continue  # (a thread that just ended)
    return out


def calls(r: redis.Redis) -> dict[str, int]:
    return {k: int(v["calls"]) for k, v in r.info("commandstats").items()}


def run(task_s: float, rounds: int, devices: int, asynchronous: bool = False) -> dict[str, float]:
    reg = Registry()
    try:
        fleet = held_fleet(reg, task_s, rounds, devices, asynchronous=asynchronous)
        procs, r = fleet.procs, fleet.r
        hpid = procs["host"].pid
        c0, cpu0 = done_count(r), {k: tree_cpu_s(p) for k, p in procs.items()}
        th0 = thread_cpu_s(hpid)
        calls0, rcpu0 = calls(r), redis_cpu_s(r)
        t0 = time.perf_counter()
        fleet.wait_last_but_one_round(devices, task_s, rounds)
        window = time.perf_counter() - t0
        th1 = thread_cpu_s(hpid)
        c1, cpu1 = done_count(r), {k: tree_cpu_s(p) for k, p in procs.items()}
        calls1, rcpu1 = calls(r), redis_cpu_s(r)
        tasks = c1 - c0
        per = 1e6 / tasks
        main = th1.get(hpid, 0.0) - th0.get(hpid, 0.0)
        host_cpu = cpu1["host"] - cpu0["host"]
        out = {
            "devices": devices,
            "task_s": task_s,
            "window_s": window,
            "tasks": tasks,
            "utilization": tasks * task_s / (devices * window),
            "host_us": host_cpu * per,
            "main_us": main * per,
            "other_us": (host_cpu - main) * per,
            "scheduler_us": (cpu1["scheduler"] - cpu0["scheduler"]) * per,
            "redis_us": (rcpu1 - rcpu0) * per,
            "evalsha": (calls1.get("cmdstat_evalsha", 0) - calls0.get("cmdstat_evalsha", 0))
            / tasks,
            "eval": (calls1.get("cmdstat_eval", 0) - calls0.get("cmdstat_eval", 0)) / tasks,
            "blpop": (calls1.get("cmdstat_blpop", 0) - calls0.get("cmdstat_blpop", 0)) / tasks,
        }
        log(
            f"  {tasks} tasks in {window:.1f} s: utilization {out['utilization']:.3f}, host "
            f"{out['host_us']:,.0f} us/task (main thread {out['main_us']:,.0f}), scheduler "
            f"{out['scheduler_us']:,.0f}, redis {out['redis_us']:,.0f}"
        )
        fleet.close()
        return out
    finally:
        reg.close()


def table(row: dict[str, float]) -> str:
    head = (
        "| devices | task s | tasks | window s | utilization | host daemon CPU µs/task | "
        "of which main thread | other threads | scheduler CPU µs/task | redis-server CPU "
        "µs/task | EVALSHA+EVAL / task | BLPOP / task |"
    )
    rule = "|" + "---:|" * 12
    cells = [
        f"{row['devices']:.0f}", f"{row['task_s']:g}", f"{row['tasks']:.0f}",
        f"{row['window_s']:.1f}", f"{row['utilization']:.3f}", f"{row['host_us']:.0f}",
        f"{row['main_us']:.0f}", f"{row['other_us']:.0f}", f"{row['scheduler_us']:.0f}",
        f"{row['redis_us']:.0f}", f"{row['evalsha'] + row['eval']:.2f}", f"{row['blpop']:.2f}",
    ]  # fmt: skip
    return "\n".join([head, rule, "| " + " | ".join(cells) + " |"]) + "\n"


def main() -> None:
    a = host_bench_args(__doc__.split("\n\n")[0])
    md = table(run(a.task_s, a.rounds, a.devices, a.asynchronous))
    print(md, end="")
    if a.out:
        a.out.write_text(md, encoding="utf-8")
    print(f"(machine: {psutil.cpu_count()} cpus, load {os.getloadavg()})", file=sys.stderr)


if __name__ == "__main__":
    main()
