"""Assignment cost of ``fair_share`` with 100 tenants and aging on, against plain ``fifo_match``
(the target: within 1.5x of plain fifo_match at 1k and 1M queued tasks).

The method is bench/scheduler/assign.py's. For each queue size, one private redis-server
(``deviceq.core.redis_server.RedisServer``) holds two pools, each loaded with ``queued`` tasks by
``Client.submit_many`` (chunks of 1000, progress on stderr):

- pool ``plain``: tasks without tenant, one priority (0), ``aging_seconds`` 0 (off);
- pool ``tenants``: each task has a random tenant of 100 (``t0..t99``, weights 1..5 set with
  ``PoolAdmin.set_tenant``, no caps) and a random priority 0..9; ``aging_seconds`` 1, so the
  snapshot reads the heads' submit times (several priorities are servable) and aging applies.

Each pool gets 1,000 devices without constraints (hosts of 100 devices, one heartbeat each).
Three configurations are measured side by side, interleaved one pass each in turn (in a rotating
order), on every server in turn, so that machine noise hits them all alike:

  (a) ``fifo_match`` on ``plain`` (the reference);
  (b) ``fair_share`` on ``tenants``;
  (c) ``priority_match`` on ``tenants`` (context);
  (d) ``fifo_match`` on ``tenants``: the plain strategy on the same queue (what the policy
  itself costs).

Each configuration has its own ``TaskScheduler`` (default batch 200) and one unmeasured warm-up
pass. Before every measured pass, unmeasured: the pool's hosts claim and report done every
assigned task, and the pool is topped back up to ``queued``. Measured around ``assign()`` only
(with the helpers of ``bench.support.assignment``): wall time of the pass in this process, Redis
CPU of the main thread (INFO cpu) and command time (INFO commandstats, every command but INFO),
with the cost of the INFO calls themselves subtracted. Ratios divide by (a) on the same server.

Usage: ``python bench/scheduler/policy.py [--quick] [--queued 1000,1000000] [--passes N]
[--out bench/scheduler/RESULTS-policy.md]`` (``--quick``: 1k and 100k queued, fewer passes,
< 3 min).
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.assignment import GOAL, finish_all, stats, stats_overhead  # noqa: E402
from deviceq import Client, DeviceReport, HostClient, PoolAdmin  # noqa: E402
from deviceq.core.redis_server import RedisServer  # noqa: E402
from deviceq.scheduler.task_scheduler import DEFAULT_BATCH, TaskScheduler  # noqa: E402

DEVICES_PER_HOST = 100
CHUNK = 1000
LOAD_STEP = 50_000  # tasks generated per submit_many call while loading (progress granularity)
TENANTS = 100
PRIORITIES = 10

# config -> (pool, strategy)
CONFIGS = {
    "a": ("plain", "fifo_match"),
    "b": ("tenants", "fair_share"),
    "c": ("tenants", "priority_match"),
    "d": ("tenants", "fifo_match"),
}
LABELS = {
    "a": "(a) fifo_match, no tenant, 1 priority, aging off",
    "b": "(b) fair_share, 100 tenants, prio 0..9, aging 1 s",
    "c": "(c) priority_match, same queue as (b)",
    "d": "(d) fifo_match, same queue as (b)",
}


@dataclass
class Cell:
    queued: int
    config: str
    walls_ms: list[float] = field(default_factory=list)  # per pass
    assigned: list[int] = field(default_factory=list)
    cpu_us: list[float] = field(default_factory=list)  # Redis CPU per pass
    cmd_us: list[float] = field(default_factory=list)
    calls: list[int] = field(default_factory=list)
    heads: list[int] = field(default_factory=list)  # head tasks in the final snapshot
    buckets: list[int] = field(default_factory=list)
    rejected: int = 0

    @property
    def total(self) -> int:
        return sum(self.assigned)

    def cpu_per(self) -> list[float]:
        return [c / a for c, a in zip(self.cpu_us, self.assigned, strict=True) if a]

    def cmd_per(self) -> float:
        return sum(self.cmd_us) / self.total if self.total else float("nan")

    def calls_per(self) -> float:
        return sum(self.calls) / self.total if self.total else float("nan")


def med(xs: list[float] | list[int]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def tenant_weight(i: int) -> int:
    return 1 + i % 5  # weights 1..5, 20 tenants each


def make_specs(pool: str, n: int, rng: random.Random) -> list[dict[str, Any]]:
    if pool == "plain":
        return [{"goal": GOAL} for _ in range(n)]
    return [
        {
            "goal": GOAL,
            "tenant": f"t{rng.randrange(TENANTS)}",
            "priority": rng.randrange(PRIORITIES),
        }
        for _ in range(n)
    ]


def add_fleet(url: str, admin: PoolAdmin, n: int) -> list[HostClient]:
    """``n`` devices without constraints on hosts of DEVICES_PER_HOST, one heartbeat each."""
    hosts = []
    for h in range(0, n, DEVICES_PER_HOST):
        host_id = f"{admin.pool}-h{h // DEVICES_PER_HOST}"
        token = admin.add_host(host_id)
        hc = HostClient(url, admin.pool, host_id, token)
        hc.heartbeat(
            [
                DeviceReport(f"{admin.pool}-dev{i}", "d0", ())
                for i in range(h, min(n, h + DEVICES_PER_HOST))
            ]
        )
        hosts.append(hc)
    return hosts


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def mem_available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024 / 1024
    return float("nan")


class Server:
    """One private redis-server with the two pools of ``queued`` tasks and their fleets."""

    def __init__(self, queued: int, devices: int, rng: random.Random, log: Any) -> None:
        self.queued, self.rng, self.log = queued, rng, log
        self.srv = RedisServer().start()
        self.r = redis.Redis.from_url(self.srv.url, decode_responses=True)
        self.clients: dict[str, Client] = {}
        self.admins: dict[str, PoolAdmin] = {}
        self.hosts: dict[str, list[HostClient]] = {}
        self.load_s: dict[str, float] = {}
        for pool in ("plain", "tenants"):
            self.clients[pool] = Client(self.srv.url, pool)
            admin = self.admins[pool] = PoolAdmin(self.srv.url, pool)
            settings = {"max_queue_depth": queued * 2 + 100_000, "claim_ttl": 3600,
                        "lease_ttl": 3600, "host_timeout": 3600,
                        "aging_seconds": 0 if pool == "plain" else 1}  # fmt: skip
            for k, v in settings.items():
                admin.set_config(k, v)
            if pool == "tenants":
                for i in range(TENANTS):
                    admin.set_tenant(f"t{i}", weight=tenant_weight(i), max_devices=0)
            self.load(pool)
        self.pid = int(self.r.info("server")["process_id"])
        mem = self.r.info("memory")["used_memory_human"]
        log(
            f"  server {queued:,}: redis {mem} (rss {rss_mb(self.pid):,.0f} MB), "
            f"machine MemAvailable {mem_available_gb():.1f} GiB"
        )
        for pool, admin in self.admins.items():
            self.hosts[pool] = add_fleet(self.srv.url, admin, devices)
        self.scheds = {
            c: TaskScheduler(self.admins[p], strategy=s) for c, (p, s) in CONFIGS.items()
        }
        for c, sched in self.scheds.items():  # warm-up: device and bucket caches
            pool = CONFIGS[c][0]
            self.top_up(pool, finish_all(self.hosts[pool]))
            sched.assign()
        self.cpu_oh, self.us_oh = stats_overhead(self.r)
        self.cells = {c: Cell(queued, c) for c in CONFIGS}

    def load(self, pool: str) -> None:
        t0 = time.perf_counter()
        done = 0
        while done < self.queued:
            n = min(LOAD_STEP, self.queued - done)
            self.clients[pool].submit_many(make_specs(pool, n, self.rng), chunk=CHUNK)
            done += n
            el = time.perf_counter() - t0
            if done == self.queued or done % 200_000 == 0:
                self.log(
                    f"  loading {pool} ({self.queued:,}): {done:,} in {el:.0f}s "
                    f"({done / el:,.0f}/s)"
                )
        self.load_s[pool] = time.perf_counter() - t0

    def top_up(self, pool: str, n: int) -> None:
        if n:
            self.clients[pool].submit_many(make_specs(pool, n, self.rng), chunk=CHUNK)

    def measure(self, config: str) -> None:
        pool = CONFIGS[config][0]
        self.top_up(pool, finish_all(self.hosts[pool]))
        sched, cell = self.scheds[config], self.cells[config]
        cpu0, us0, calls0 = stats(self.r)
        t = time.perf_counter()
        res = sched.assign()
        wall = time.perf_counter() - t
        cpu1, us1, calls1 = stats(self.r)
        cell.walls_ms.append(wall * 1000)
        cell.assigned.append(res.assigned)
        cell.cpu_us.append(max(0.0, cpu1 - cpu0 - self.cpu_oh))
        cell.cmd_us.append(max(0.0, us1 - us0 - self.us_oh))
        cell.calls.append(calls1 - calls0 - 1)  # minus the first INFO's own call
        cell.heads.append(res.heads)
        cell.buckets.append(res.buckets)
        cell.rejected += res.rejected_total

    def depth(self, pool: str) -> int:
        return int(self.clients[pool].counts()["queued"])

    def close(self) -> None:
        self.r.close()
        self.srv.stop()


def fmt_range(xs: list[float], digits: int = 1) -> str:
    if not xs:
        return "-"
    return f"{med(xs):.{digits}f} ({min(xs):.{digits}f}–{max(xs):.{digits}f})"


def table(cells: list[Cell]) -> str:
    ref = {c.queued: c for c in cells if c.config == "a"}
    lines = [
        "| queued | configuration | passes | assigned/pass | ms/pass median (min–max) | ratio "
        "| Redis CPU µs/assign median (min–max) | ratio | cmd µs/assign | calls/assign "
        "| heads/pass (snapshot) | buckets/pass |",
        "|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in sorted(cells, key=lambda c: (c.queued, c.config)):
        a = ref.get(c.queued)
        rw = med(c.walls_ms) / med(a.walls_ms) if a and a.walls_ms else float("nan")
        rc = med(c.cpu_per()) / med(a.cpu_per()) if a and a.cpu_per() else float("nan")
        lines.append(
            f"| {c.queued:,} | {LABELS[c.config]} | {len(c.walls_ms)} | {med(c.assigned):.0f} "
            f"| {fmt_range(c.walls_ms)} | **{rw:.2f}** | {fmt_range(c.cpu_per())} | {rc:.2f} "
            f"| {c.cmd_per():.1f} | {c.calls_per():.1f} | {med(c.heads):.0f} "
            f"| {med(c.buckets):.0f} |"
        )
    return "\n".join(lines)


def verdict(cells: list[Cell], limit: float = 1.5) -> str:
    """Per queue size, (b) fair_share against (a) and against (d), as sentences."""
    against = {
        "a": "(a) fifo_match",
        "d": "(d) fifo_match on the same 100-tenant queue",
    }
    out = []
    by = {(c.queued, c.config): c for c in cells}
    for q in sorted({c.queued for c in cells}):
        b = by.get((q, "b"))
        for ref, name in against.items():
            r = by.get((q, ref))
            if not b or not r:
                continue
            rw = med(b.walls_ms) / med(r.walls_ms)
            rc = med(b.cpu_per()) / med(r.cpu_per())
            ok = "within" if rw <= limit else "NOT within"
            out.append(
                f"- {q:,} queued: (b) fair_share is {ok} {limit}x of {name} in wall time per "
                f"pass ({rw:.2f}x; Redis CPU per assignment {rc:.2f}x)"
            )
    return "\n".join(out)


def redis_version() -> str:
    try:
        out = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()
        return out[2].removeprefix("v=")
    except (OSError, IndexError):
        return "?"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="1k and 100k queued, fewer passes")
    ap.add_argument("--queued", default="1000,1000000")
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--passes", type=int, default=60, help="measured passes per configuration")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", help="also write the markdown table to this file")
    args = ap.parse_args()
    # SIGTERM unwinds normally, so every private redis-server is stopped and removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.quick:
        args.queued, args.passes = "1000,100000", 30
    queued = [int(x) for x in args.queued.split(",")]
    rng = random.Random(args.seed)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    log(
        f"scheduler.policy: queued={queued} devices={args.devices} passes={args.passes} "
        f"batch={DEFAULT_BATCH} load={os.getloadavg()[0]:.1f}"
    )
    started = time.time()
    servers: list[Server] = []
    try:
        for q in queued:
            servers.append(Server(q, args.devices, rng, log))
        t_meas = time.time()
        keys = list(CONFIGS)
        for i in range(args.passes):
            order = keys[i % len(keys) :] + keys[: i % len(keys)]
            for s in servers:
                for c in order:
                    s.measure(c)
        measure_s = time.time() - t_meas
        cells: list[Cell] = []
        for s in servers:
            for c, cell in s.cells.items():
                log(
                    f"  queued={s.queued:>9,} {c}: {cell.total} assignments in "
                    f"{len(cell.walls_ms)} passes, {med(cell.walls_ms):.1f} ms/pass, redis cpu "
                    f"{med(cell.cpu_per()):.1f} us/assign, rejected {cell.rejected} "
                    f"(depth now {s.depth(CONFIGS[c][0]):,})"
                )
                cells.append(cell)
        loads = "; ".join(
            f"{s.queued:,}: " + ", ".join(f"{p} {t:.0f}s" for p, t in s.load_s.items())
            for s in servers
        )
        mem = "; ".join(f"{s.queued:,}: {s.r.info('memory')['used_memory_human']}" for s in servers)
    finally:
        for s in servers:
            s.close()
    text = table(cells)
    meta = (
        f"Python {platform.python_version()}, redis-server {redis_version()}, "
        f"{platform.machine()}, {os.cpu_count()} cpus, devices {args.devices} "
        f"(hosts of {DEVICES_PER_HOST}), batch {DEFAULT_BATCH}, {args.passes} measured passes "
        f"per configuration, load average at end {os.getloadavg()[0]:.1f}; "
        f"loading: {loads}; redis memory (both pools): {mem}; "
        f"measuring took {measure_s:.0f}s, total {time.time() - started:.0f}s"
    )
    print(text)
    print()
    print(verdict(cells))
    print()
    print(meta)
    if args.out:
        Path(args.out).write_text(text + "\n\n" + verdict(cells) + "\n\n" + meta + "\n")


if __name__ == "__main__":
    main()
