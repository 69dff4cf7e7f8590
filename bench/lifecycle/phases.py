"""Where the CPU of one task lifecycle goes, phase by phase, without contention.

One process drives a private redis-server in lock step: ``Client.submit_many`` (the producer),
one ``TaskScheduler.assign(expire=False)`` pass (the scheduler daemon between
ticks), then for every host ``HostClient.claim``
and ``report_many(done)`` (the workers). Each phase is timed separately: client CPU
(``time.process_time`` of this process), Redis CPU (``INFO cpu`` delta, the INFO call's own
cost subtracted) and wall time, per task. ``--profile PHASE`` adds a cProfile of that phase.

Usage: ``python bench/lifecycle/phases.py [--rounds 40] [--batch 200] [--backlog 5000]
[--profile scheduler|submit|claim|report]``"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.common import (
    GOAL,
    add_hosts,
    machine,
    private_redis,
    raw_client,
    redis_cpu_s,
    table,
)
from deviceq.host.link import Report
from deviceq.host.redis_link import HostClient
from deviceq.ops.admin import PoolAdmin
from deviceq.producer import Client
from deviceq.scheduler import TaskScheduler

POOL = "bench"
PHASES = ("submit", "scheduler", "claim", "report")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--batch", type=int, default=200, help="tasks submitted per round")
    ap.add_argument("--backlog", type=int, default=5000, help="tasks queued before measuring")
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--devices", type=int, default=25)
    ap.add_argument("--profile", choices=PHASES, default=None)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    print(f"machine: {machine()}")
    prof = cProfile.Profile() if args.profile else None
    with private_redis() as server:
        r = raw_client(server.url)
        admin = PoolAdmin(r, POOL)
        admin.set_config("max_queue_depth", 10_000_000)
        fleet = add_hosts(admin, server.url, args.hosts, args.devices)
        client = Client(r, POOL)
        hosts = [HostClient(r, POOL, h, tok) for h, tok, _ in fleet]
        sched = TaskScheduler(r, POOL)
        spec = {"goal": GOAL, "driver_type": "android"}

        def assign() -> Any:
            try:
                return sched.assign(expire=False)
            except TypeError:  # an older TaskScheduler (before/after comparisons)
                return sched.assign()

        for _ in range(args.backlog // 500):
            client.submit_many([spec] * 500)
        # INFO's own cost, subtracted from every Redis CPU delta
        c0 = redis_cpu_s(r)
        for _ in range(20):
            redis_cpu_s(r)
        info_cost = (redis_cpu_s(r) - c0) / 21
        cpu = dict.fromkeys(PHASES, 0.0)
        rcpu = dict.fromkeys(PHASES, 0.0)
        wall = dict.fromkeys(PHASES, 0.0)
        done = 0

        def phase(name: str, fn: Any) -> Any:
            rc0, c0, w0 = redis_cpu_s(r), time.process_time(), time.perf_counter()
            if prof and args.profile == name:
                prof.enable()
            out = fn()
            if prof and args.profile == name:
                prof.disable()
            w1, c1, rc1 = time.perf_counter(), time.process_time(), redis_cpu_s(r)
            wall[name] += w1 - w0
            cpu[name] += c1 - c0
            rcpu[name] += rc1 - rc0 - info_cost
            return out

        for _ in range(args.rounds):
            phase("submit", lambda: client.submit_many([spec] * args.batch))
            # as the daemon does between ticks: no expiry step (transitions.py has its cost)
            res = phase("scheduler", assign)
            got_all = phase("claim", lambda: [(hc, hc.claim(args.devices)) for hc in hosts])
            for hc, got in got_all:
                if got:
                    phase(
                        "report",
                        lambda hc=hc, got=got: hc.report_many(
                            [Report(a.task.id, a.lease_id, "done", None, "ok") for a in got]
                        ),
                    )
                    done += len(got)
            assert res.assigned > 0
        rows = []
        for name in PHASES:
            rows.append(
                [name, cpu[name] / done * 1e6, rcpu[name] / done * 1e6, wall[name] / done * 1e6]
            )
        rows.append(
            [
                "total",
                sum(cpu.values()) / done * 1e6,
                sum(rcpu.values()) / done * 1e6,
                sum(wall.values()) / done * 1e6,
            ]
        )
        print(
            f"{done:,} lifecycles in {args.rounds} rounds, backlog {args.backlog:,}, "
            f"{args.hosts} x {args.devices} devices"
        )
        print(table(["phase", "client CPU µs/task", "redis CPU µs/task", "wall µs/task"], rows))
        r.close()
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
