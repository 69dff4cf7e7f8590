"""Scheduler assignment cost vs queue length, fleet size and constraint signatures.

For every cell of the grid (queued tasks x devices x signatures) on a private redis-server
(``deviceq.core.redis_server.RedisServer``, one per (queued, signatures) pair, loaded once with
``Client.submit_many`` in chunks; the servers of one signature count run side by side and
their cells are measured interleaved, one pass on each in turn, so that the contention of a
shared machine hits every queue size alike):

1. register the devices (hosts of at most 100 devices, one heartbeat each);
2. run one unmeasured warm-up pass of ``TaskScheduler.assign()``;
3. repeat: finish every assigned task (hosts claim + report done) and top the queue back up to
   its size (``submit_many``) -- both unmeasured -- then run one measured ``assign()`` pass;
4. remove the hosts (next device count).

Measured per pass, around the ``assign()`` call only:
- wall time of the pass in this process (planning in Python included) -> assignments/s;
- Redis CPU from ``INFO cpu`` (``used_cpu_user_main_thread + used_cpu_sys_main_thread``);
- Redis command time from ``INFO commandstats`` (sum of ``usec`` over all commands but INFO,
  scripts included: the server-side cost of exactly what the pass sent).
The cost of the INFO calls themselves is measured (back-to-back pairs) and subtracted.
Costs are reported per assignment; the ratio column divides by the 1k-queued cell with the same
devices and signatures.

Signatures: 1 = no constraints; 100 = driver type d0..d3 x one required tag t0..t24, every
device of type dX has all 25 tags (so a device serves 25 signatures); tasks pick a signature at
random.

Usage: ``python bench/scheduler/assign.py [--quick] [--queued 1000,100000,1000000]
[--devices 10,1000,10000] [--sigs 1,100] [--assignments N] [--out bench/scheduler/RESULTS.md]``
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.assignment import (
    GOAL,
    POOL,
    add_fleet,
    finish_all,
    signatures,
    stats,
    stats_overhead,
)
from deviceq import Client, HostClient, PoolAdmin
from deviceq.core.redis_server import RedisServer
from deviceq.scheduler.task_scheduler import DEFAULT_BATCH, TaskScheduler

CHUNK = 1000


@dataclass
class Cell:
    queued: int
    devices: int
    sigs: int
    passes: int = 0
    assigned: int = 0
    wall_s: float = 0.0
    cpu_us: float = 0.0
    cmd_us: float = 0.0
    cmd_calls: int = 0
    load_s: float = 0.0
    rejected: int = 0
    samples: list[float] = field(default_factory=list)  # Redis CPU us/assignment per pass

    @property
    def per_s(self) -> float:
        return self.assigned / self.wall_s if self.wall_s else 0.0

    @property
    def cpu_per(self) -> float:
        return self.cpu_us / self.assigned if self.assigned else float("nan")

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")

    @property
    def cmd_per(self) -> float:
        return self.cmd_us / self.assigned if self.assigned else float("nan")

    @property
    def calls_per(self) -> float:
        return self.cmd_calls / self.assigned if self.assigned else float("nan")


def specs(n: int, sigs: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    return [{"goal": GOAL, **rng.choice(sigs)} for _ in range(n)]


class Bench:
    """One private redis-server holding one pool of ``queued`` tasks."""

    def __init__(self, queued: int, sigs: int, rng: random.Random, log: Any) -> None:
        self.queued, self.sigs, self.rng = queued, sigs, rng
        self.srv = RedisServer().start()
        self.r = redis.Redis.from_url(self.srv.url, decode_responses=True)
        self.client = Client(self.srv.url, POOL)
        self.admin = PoolAdmin(self.srv.url, POOL)
        settings = {"max_queue_depth": queued * 2 + 100_000, "claim_ttl": 3600,
                    "lease_ttl": 3600, "host_timeout": 3600}  # fmt: skip
        for k, v in settings.items():
            self.admin.set_config(k, v)
        self.sig_list = signatures(sigs)
        t0 = time.perf_counter()
        for start in range(0, queued, 50_000):
            self.submit(min(50_000, queued - start))
        self.load_s = time.perf_counter() - t0
        mem = self.r.info("memory")["used_memory_human"]
        log(f"  loaded {queued} tasks / {sigs} sigs in {self.load_s:.1f}s (redis {mem})")
        self.hosts: list[HostClient] = []

    def submit(self, n: int) -> None:
        self.client.submit_many(specs(n, self.sig_list, self.rng), chunk=CHUNK)

    def start_cell(self, devices: int) -> Cell:
        depth = self.client.counts()["queued"]
        if depth < self.queued:  # top up what the previous cell's last pass took
            self.submit(self.queued - depth)
        self.hosts = add_fleet(self.srv.url, self.admin, devices, self.sigs, f"f{devices}")
        self.sched = TaskScheduler(self.admin)
        self.sched.assign()  # warm-up: device and signature caches
        self.cpu_oh, self.us_oh = stats_overhead(self.r)
        return Cell(self.queued, devices, self.sigs, load_s=self.load_s)

    def measure(self, cell: Cell) -> None:
        """Finish what is assigned and top the queue up (unmeasured), then one pass."""
        done = finish_all(self.hosts)
        if done:
            self.submit(done)
        cpu0, us0, calls0 = stats(self.r)
        t = time.perf_counter()
        res = self.sched.assign()
        wall = time.perf_counter() - t
        cpu1, us1, calls1 = stats(self.r)
        cell.passes += 1
        cell.assigned += res.assigned
        cell.rejected += res.rejected_total
        cell.wall_s += wall
        cpu = max(0.0, cpu1 - cpu0 - self.cpu_oh)
        cell.cpu_us += cpu
        if res.assigned:
            cell.samples.append(cpu / res.assigned)
        cell.cmd_us += max(0.0, us1 - us0 - self.us_oh)
        cell.cmd_calls += calls1 - calls0 - 1  # minus the first INFO's own call

    def end_cell(self) -> int:
        finish_all(self.hosts)
        for h in self.hosts:
            self.admin.remove_host(h.host_id)
        self.hosts = []
        return int(self.client.counts()["queued"])

    def close(self) -> None:
        self.r.close()
        self.srv.stop()


def run_group(
    queued: list[int],
    sigs: int,
    devices: list[int],
    target: int,
    max_passes: int,
    rng: random.Random,
    log: Any,
) -> list[Cell]:
    """All queue sizes of one signature count, each on its own server, measured interleaved
    (one pass on each in turn) so that machine contention hits every queue size alike."""
    out: list[Cell] = []
    benches = []
    try:
        for q in queued:
            benches.append(Bench(q, sigs, rng, log))
        for d in devices:
            cells = [b.start_cell(d) for b in benches]
            while any(c.assigned < target and c.passes < max_passes for c in cells):
                for b, c in zip(benches, cells, strict=True):
                    if c.assigned < target and c.passes < max_passes:
                        b.measure(c)
            for b, c in zip(benches, cells, strict=True):
                depth = b.end_cell()
                log(
                    f"  queued={c.queued:>8} devices={d:>6} sigs={sigs:>3}: {c.assigned} "
                    f"assignments in {c.passes} passes, {c.per_s:,.0f}/s, "
                    f"redis cpu {c.cpu_per:.1f} us, cmd {c.cmd_per:.1f} us / assignment "
                    f"(depth now {depth})"
                )
            out += cells
    finally:
        for b in benches:
            b.close()
    return out


def table(cells: list[Cell]) -> str:
    base = {(c.devices, c.sigs): c for c in cells if c.queued == min(x.queued for x in cells)}
    lines = [
        "| queued | devices | sigs | passes | assigned | assign/s | Redis CPU us/assign "
        "| ratio | median of passes | ratio | cmd us/assign | ratio | calls/assign |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in sorted(cells, key=lambda c: (c.sigs, c.devices, c.queued)):
        b = base.get((c.devices, c.sigs))
        rc = c.cpu_per / b.cpu_per if b and b.cpu_per else float("nan")
        rm = c.cmd_per / b.cmd_per if b and b.cmd_per else float("nan")
        rmed = c.cpu_median / b.cpu_median if b and b.cpu_median else float("nan")
        lines.append(
            f"| {c.queued:,} | {c.devices:,} | {c.sigs} | {c.passes} | {c.assigned:,} "
            f"| {c.per_s:,.0f} | {c.cpu_per:.1f} | {rc:.2f} | {c.cpu_median:.1f} | {rmed:.2f} "
            f"| {c.cmd_per:.1f} | {rm:.2f} | {c.calls_per:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small grid, a few seconds")
    ap.add_argument("--queued", default="1000,100000,1000000")
    ap.add_argument("--devices", default="10,1000,10000")
    ap.add_argument("--sigs", default="1,100")
    ap.add_argument(
        "--assignments",
        type=int,
        default=3000,
        help="measured assignments per cell (at most --max-passes passes)",
    )
    ap.add_argument("--max-passes", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="also write the markdown table to this file")
    args = ap.parse_args()
    # SIGTERM unwinds normally, so every private redis-server is stopped and removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.queued, args.devices, args.sigs = "1000,20000", "10,500", "1,100"
        args.assignments, args.max_passes = 400, 60
    queued = [int(x) for x in args.queued.split(",")]
    devices = [int(x) for x in args.devices.split(",")]
    sigs = [int(x) for x in args.sigs.split(",")]
    rng = random.Random(args.seed)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    log(
        f"scheduler.assign: queued={queued} devices={devices} sigs={sigs} batch={DEFAULT_BATCH} "
        f"load={os.getloadavg()[0]:.1f}"
    )
    started = time.time()
    cells: list[Cell] = []
    for s in sigs:
        cells += run_group(queued, s, devices, args.assignments, args.max_passes, rng, log)
    text = table(cells)
    meta = (
        f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus, "
        f"load average at end {os.getloadavg()[0]:.1f}, took {time.time() - started:.0f}s"
    )
    print(text)
    print(meta)
    if args.out:
        Path(args.out).write_text(text + "\n\n" + meta + "\n")


if __name__ == "__main__":
    main()
