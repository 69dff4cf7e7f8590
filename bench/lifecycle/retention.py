"""Retention you can see: Redis memory before, at the peak of, and after a ``--tasks`` run.

A private ``redis-server``; one pool with ``retention`` = ``--retention`` seconds and one host
of 100 devices. The baseline is that pool after a warm-up (200 tasks run and pruned: every
script loaded, as in a pool that has worked), with its fleet and no task. Then ``--tasks``
tasks go through their whole life (``submit_many``, the scheduler's ``assign``, the host's
``claim`` and ``report_many``, all through the library, batches of 1,000); the peak is taken
when all are done. After ``retention`` has passed, the scheduler's expiry pass
(``TaskScheduler.expire``, bounded batches, as ``deviceq scheduler run`` does every tick)
trims the terminal indexes and the event stream, and Redis's own key expiry removes the
finished tasks' keys. Reported: how long memory took to come back within ``--within`` (10 %)
of the baseline, and what was left.

    python -m bench.lifecycle.retention [--tasks 100000] [--retention 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import redis

from bench.support.procs import log
from deviceq import DeviceReport, HostClient, PoolAdmin, Report
from deviceq.core.redis_server import RedisServer
from deviceq.producer import Client
from deviceq.scheduler import TaskScheduler

POOL = "retention"
DEVICES = 100
BATCH = 1000
WARMUP = 200


def used(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


class Pool:
    """The pool under test: its producer, scheduler and one host of ``DEVICES`` devices."""

    def __init__(self, r: redis.Redis, retention: float) -> None:
        self.r = r
        admin = PoolAdmin(r, POOL)
        admin.set_config("retention", retention)
        self.events_key = admin.keys.events
        self.done_key, self.task_keys = admin.keys.status("done"), admin.keys.task("*")
        self.host = HostClient(r, POOL, "h1", admin.add_host("h1"))
        self.heartbeat()
        self.client, self.sched = Client(r, POOL), TaskScheduler(admin)

    def no_tasks_left(self) -> bool:
        """No finished task indexed and no task key left (a bounded SCAN: a small database)."""
        if self.r.zcard(self.done_key):
            return False
        return next(iter(self.r.scan_iter(match=self.task_keys, count=1000)), None) is None

    def heartbeat(self) -> None:
        self.host.heartbeat([DeviceReport(f"d{i:03d}", "android") for i in range(DEVICES)])

    def run(self, n: int) -> None:
        """``n`` tasks submitted, assigned, claimed and reported done, a batch at a time (the
        host heartbeats every batch: it would be dead after ``host_timeout``)."""
        left = n
        while left:
            k = min(BATCH, left)
            self.client.submit_many([{"goal": f"task {left - i}: open the app, log in, check"}
                                     for i in range(k)])  # fmt: skip
            left -= k
            self.heartbeat()
            while True:
                got = self.host.claim(DEVICES)
                if got:
                    done = [Report(a.task.id, a.lease_id, "done", None, "ok") for a in got]
                    self.host.report_many(done)
                elif not self.sched.assign(expire=False).assigned:
                    if self.client.counts()["queued"]:
                        raise RuntimeError("tasks left queued with idle devices")
                    break

    def prune(self, until: Callable[[], bool], limit_s: float) -> float:
        """Run the scheduler's expiry pass (and the host's heartbeat) once a second until
        ``until()``; returns the seconds it took (``limit_s`` at most)."""
        began = time.monotonic()
        while time.monotonic() - began < limit_s:
            self.sched.expire()
            self.heartbeat()
            if until():
                break
            time.sleep(1.0)
        return time.monotonic() - began


def measure(tasks: int, retention: float, within: float, limit_s: float) -> dict[str, Any]:
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url, decode_responses=True)
        pool = Pool(r, retention)
        empty = used(r)
        # warm-up: every script loaded and one small run pruned; the baseline is that pool
        pool.run(WARMUP)
        time.sleep(retention + 1.0)
        pool.prune(pool.no_tasks_left, limit_s)
        baseline = used(r)
        began = time.monotonic()
        pool.run(tasks)
        ran_s = time.monotonic() - began
        counts = pool.client.counts()
        peak, peak_keys = used(r), int(r.dbsize())
        log(f"{tasks} tasks done in {ran_s:.1f} s; memory {peak / 2**20:.1f} MiB")
        time.sleep(retention + 1.0)
        back_s = retention + 1.0 + pool.prune(lambda: used(r) <= baseline * (1 + within), limit_s)
        after = used(r)
        return {
            "tasks": tasks,
            "done": counts["done"],
            "retention_s": retention,
            "lifecycles_s": round(ran_s, 1),
            "empty_bytes": empty,
            "baseline_bytes": baseline,
            "peak_bytes": peak,
            "peak_keys": peak_keys,
            "after_bytes": after,
            "after_keys": int(r.dbsize()),
            "after_over_baseline": round(after / baseline, 3),
            "back_s_after_last_finish": round(back_s, 1),
            "events_left": int(r.xlen(pool.events_key)),
            "ok": after <= baseline * (1 + within),
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000, help="tasks to run (100000)")
    ap.add_argument("--retention", type=float, default=30.0, help="retention seconds (30)")
    ap.add_argument("--within", type=float, default=0.10, help="of the baseline (0.10)")
    ap.add_argument("--limit", type=float, default=600.0, help="seconds to wait at most (600)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    if args.tasks < 1 or args.retention < 1:
        ap.error("--tasks and --retention must be at least 1")
    res = measure(args.tasks, args.retention, args.within, args.limit)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        mib = 2**20
        print(
            f"{res['tasks']} tasks ({res['done']} done) in {res['lifecycles_s']} s; "
            f"retention {res['retention_s']:.0f} s\n"
            f"redis memory: baseline {res['baseline_bytes'] / mib:.2f} MiB, peak "
            f"{res['peak_bytes'] / mib:.2f} MiB ({res['peak_keys']} keys), after retention "
            f"{res['after_bytes'] / mib:.2f} MiB ({res['after_keys']} keys, "
            f"{res['events_left']} events) = {res['after_over_baseline']:.2f}x the baseline, "
            f"{res['back_s_after_last_finish']} s after the last task finished (empty pool "
            f"before the warm-up: {res['empty_bytes'] / mib:.2f} MiB)"
        )
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
