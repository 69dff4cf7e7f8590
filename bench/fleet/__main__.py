"""Fleet-scale cost of deviceq's scheduler: ``python -m bench.fleet [--quick] [--json]
[--sizes 1000,10000,100000] [--passes N] [--out PATH] [--where]``. With ``--where`` every
device gets attributes (sent with its host's heartbeat, as a host daemon sends them) and the
measured 10-task passes carry 10 distinct ``--where`` expressions (`WHERE`).

Per fleet size (devices; hosts of 100 devices; one signature; batch 200), on a private
redis-server of its own (``deviceq.core.redis_server.RedisServer``), with in-process hosts
(``HostClient`` heartbeats register the devices) and ``TaskScheduler.assign()`` passes
measured as ``bench/scheduler/assign.py`` does (wall time in this process; Redis CPU from
``INFO cpu``; Redis command time from ``INFO commandstats``; the INFO calls' own cost
measured and subtracted -- its ``stats``/``stats_overhead``/``finish_all`` are reused):

1. fill: as many tasks as devices are queued (``Client.submit_many`` in chunks, unmeasured),
   then the assign passes until every device is busy are measured: placements/s;
2. ten: every task finished (hosts claim and report done, unmeasured), 10 tasks submitted,
   one measured pass; the median of a few such passes (wall ms, Redis CPU ms);
3. empty: a pass with nothing queued (median of a few);
4. the idle devices a pass sees (``AssignResult.idle_devices``) vs the idle devices of the
   pool (``ZCARD idle``) before it;
5. commit: 200 tasks queued, read and planned unmeasured, then the commit of the 200 pairs
   alone (``TaskScheduler.commit``, one ``lua/assign.lua`` call) measured (median);
then, on one more private server (``bench.fleet.probes``): the longest script calls in
``SLOWLOG`` (over 5 ms) through a 5,000-device host registering and heartbeating, 10,000
leases lapsing at once, a 100,000-task ``submit_many`` and a 200-pair commit; and Redis time
per heartbeat when nothing changed (10 and 5,000 devices); then device utilization and host
daemon CPU per task with the real daemons (``bench.fleet.daemons``: one host of 100 devices),
with a thread runner and then an async one.

Ratios divide by the 1,000-device figures. ``--quick`` (under five minutes: the 100k fill
takes about a minute) runs the same sizes with 5 passes per median (15 on a full run), fewer
heartbeats and a shorter utilization window; ``--sizes`` may name others (a size's keys are
named after it, e.g. ``_20k``; the ``_100k`` ones are then null). Progress goes to stderr;
``--json`` prints one JSON object on stdout: ``ten_pass_ratio_100k``/``empty_pass_ratio_100k``
divide the median pass wall time at 100k devices by 1k's (``*_redis_ratio_*``: Redis CPU;
``*_ms_*``: the raw medians), ``fill_per_s_100k`` placements/s, ``idle_seen_100k`` vs
``idle_in_pool_100k``, ``max_script_ms`` the longest script call of the SLOWLOG probes
(``max_script`` names it), ``heartbeat_unchanged_us`` Redis command time per unchanged
heartbeat by device count ("10", "5000"; beats 25 ms apart for both: ``*_back_to_back_us`` as
fast as each client goes; ``heartbeat_unchanged_alone_us``: the script's calls alone, back to
back with their arguments built first; ``script_floor_us``: a script of two commands, back to
back and paced alike), ``host_cpu_us_per_task`` and ``utilization`` from
the real daemons; ``sizes`` and ``slowlog`` hold every raw figure."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import redis

from bench.fleet import daemons
from bench.fleet.daemons import ASYNC_RUNNER, run_utilization
from bench.fleet.probes import (
    Scenario,
    enable_slowlog,
    longest,
    read_slowlog,
    run_probes,
)
from bench.fleet.probes import sha_names as script_names
from bench.fleet.report import Pass, Size, markdown, summary
from bench.support.assignment import (
    GOAL,
    POOL,
    add_fleet,
    device_kind,
    finish_all,
    stats,
    stats_overhead,
)
from bench.support.procs import REALTIME_ENV, realtime
from deviceq import Client, DeviceReport, PoolAdmin
from deviceq.core.redis_server import RedisServer
from deviceq.scheduler.task_scheduler import DEFAULT_BATCH, TaskScheduler

LOAD_CHUNK = 50_000  # tasks per submit_many call while loading (each sent in chunks of 1000)
WHERE = [*(f"sdk>={v}" for v in range(28, 36)), "battery>=50", "battery<30"]
"""``--where``: the 10 distinct expressions the measured tasks carry, in turn (every device
has ``sdk`` 28-35 and ``battery`` 0-100, spread by its number)."""


def log(msg: str) -> None:
    print(f"[fleet {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class FleetServer:
    """One private redis-server with one pool of ``devices`` idle devices."""

    def __init__(self, devices: int, where: bool = False) -> None:
        self.where = where
        self.srv = realtime(RedisServer().start())
        self.r = redis.Redis.from_url(self.srv.url, decode_responses=True)
        self.client = Client(self.srv.url, POOL)
        self.admin = PoolAdmin(self.srv.url, POOL)
        for k, v in {"max_queue_depth": devices * 2 + 100_000, "claim_ttl": 3600,
                     "lease_ttl": 3600, "host_timeout": 3600}.items():  # fmt: skip
            self.admin.set_config(k, v)
        enable_slowlog(self.r)
        self.size = Size(devices)
        t = time.perf_counter()
        self.hosts = add_fleet(self.srv.url, self.admin, devices, 1, f"f{devices}")
        self.size.register_s = time.perf_counter() - t
        self.size.hosts = len(self.hosts)
        if where:  # (attributes as hosts send them: with their heartbeats, only changes)
            t = time.perf_counter()
            for hc in self.hosts:
                ids = sorted(self.r.smembers(self.admin.keys.host_devices(hc.host_id)))
                nums = {d: int(d.rsplit("dev", 1)[1]) for d in ids}
                reports = [DeviceReport(d, *device_kind(i, 1)) for d, i in nums.items()]
                hc.heartbeat(reports, attributes={d: {"sdk": 28 + i % 8, "battery": i % 101}
                                                  for d, i in nums.items()})  # fmt: skip
            log(f"  attributes of {devices:,} devices sent in {time.perf_counter() - t:.1f}s")
        self.sched = TaskScheduler(self.admin)
        self.idle_key = self.sched.keys.idle
        self.cpu_oh, self.us_oh = stats_overhead(self.r)

    def submit(self, n: int, where: bool = False) -> None:
        for start in range(0, n, LOAD_CHUNK):
            m = min(LOAD_CHUNK, n - start)
            specs = [{"goal": GOAL, **({"where": [WHERE[i % len(WHERE)]]} if where else {})}
                     for i in range(m)]  # fmt: skip
            self.client.submit_many(specs, chunk=1000)

    def one_pass(self) -> Pass:
        pool_idle = int(self.r.zcard(self.idle_key))
        c0, u0, _ = stats(self.r)
        t = time.perf_counter()
        res = self.sched.assign()
        wall = time.perf_counter() - t
        c1, u1, _ = stats(self.r)
        return Pass(
            wall * 1000,
            max(0.0, c1 - c0 - self.cpu_oh) / 1000,
            max(0.0, u1 - u0 - self.us_oh) / 1000,
            res.assigned,
            res.idle_devices,
            pool_idle,
        )

    def run_fill(self) -> None:
        """Queue one task per device, then measure the passes until every device is busy."""
        s = self.size
        t = time.perf_counter()
        self.submit(s.devices)
        s.load_s = time.perf_counter() - t
        log(f"  {s.devices:,} devices: {s.hosts} hosts registered in {s.register_s:.1f}s, "
            f"{s.devices:,} tasks queued in {s.load_s:.1f}s")  # fmt: skip
        stuck = 0
        while s.fill_assigned < s.devices and stuck < 3:
            p = self.one_pass()
            s.fill_first = s.fill_first or p
            s.fill_passes += 1
            s.fill_assigned += p.assigned
            s.fill_wall_s += p.wall_ms / 1000
            s.fill_cpu_s += p.cpu_ms / 1000
            stuck = 0 if p.assigned else stuck + 1
        log(
            f"  fill: {s.fill_assigned:,} placed in {s.fill_passes} passes, "
            f"{s.fill_per_s:,.0f}/s, {s.fill_cpu_us_per:.0f} us Redis CPU/placement; "
            f"first pass saw {s.fill_first.seen_idle if s.fill_first else 0:,} of "
            f"{s.fill_first.pool_idle if s.fill_first else 0:,} idle devices"
        )

    def run_ten(self, passes: int) -> None:
        finish_all(self.hosts)
        self.submit(10, self.where)
        self.sched.assign()  # warm-up after the fill: the device cache sees them idle again
        for _ in range(passes):
            finish_all(self.hosts)
            self.submit(10, self.where)
            self.size.ten.append(self.one_pass())
        s = self.size
        log(
            f"  ten: {s.med(s.ten, 'wall_ms'):.1f} ms wall, {s.med(s.ten, 'cpu_ms'):.2f} ms "
            f"Redis CPU, {s.med(s.ten, 'assigned'):.0f} placed, idle seen "
            f"{s.med(s.ten, 'seen_idle'):,.0f} of {s.med(s.ten, 'pool_idle'):,.0f}"
        )

    def run_empty(self, passes: int) -> None:
        finish_all(self.hosts)
        self.sched.assign()
        for _ in range(passes):
            self.size.empty.append(self.one_pass())
        s = self.size
        log(
            f"  empty: {s.med(s.empty, 'wall_ms'):.1f} ms wall, "
            f"{s.med(s.empty, 'cpu_ms'):.2f} ms Redis CPU, idle seen "
            f"{s.med(s.empty, 'seen_idle'):,.0f} of {s.med(s.empty, 'pool_idle'):,.0f}"
        )

    def run_commit(self, passes: int) -> None:
        """The commit of one full batch alone (``TaskScheduler.commit`` of 200 pairs, read and
        planned unmeasured): does the write side grow with the fleet?"""
        for _ in range(passes):
            finish_all(self.hosts)
            self.submit(DEFAULT_BATCH)
            base, want, heads = self.sched.reader.read()
            _, pairs, _ = self.sched.plan_deep(base, want, heads)
            pool_idle = int(self.r.zcard(self.idle_key))
            c0, u0, _ = stats(self.r)
            t = time.perf_counter()
            out = self.sched.commit(pairs)
            wall = time.perf_counter() - t
            c1, u1, _ = stats(self.r)
            self.sched.reader.forget_all()  # its heads changed under it
            ok = sum(1 for o in out if o.startswith("ok:"))
            self.size.commit.append(Pass(wall * 1000, max(0.0, c1 - c0 - self.cpu_oh) / 1000,
                                         max(0.0, u1 - u0 - self.us_oh) / 1000, ok,
                                         len(base.devices), pool_idle))  # fmt: skip
        s = self.size
        log(
            f"  commit: {s.med(s.commit, 'assigned'):.0f} pairs, "
            f"{s.med(s.commit, 'wall_ms'):.1f} ms wall, "
            f"{s.med(s.commit, 'cpu_ms'):.2f} ms Redis CPU"
        )

    def read_slow(self, names: dict[str, str]) -> None:
        entries = read_slowlog(self.r, names)
        self.size.slow_by_script = Scenario("size", entries=entries).by_script()
        lo = longest(entries)
        if lo:
            self.size.slow_max_ms, self.size.slow_script = lo.duration_ms, lo.script

    def close(self) -> None:
        self.r.close()
        self.srv.stop()


def measure_size(devices: int, passes: int, names: dict[str, str], where: bool = False) -> Size:
    log(f"size {devices:,} devices" + (" (10 tasks with 10 distinct --where)" if where else ""))
    fs = FleetServer(devices, where)
    try:
        fs.run_fill()
        fs.run_ten(passes)
        fs.run_empty(passes)
        fs.run_commit(passes)
        fs.read_slow(names)
        return fs.size
    finally:
        fs.close()


def commit_id() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except OSError:
        return "?"


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="5 passes per median (<5 min)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--sizes", help="device counts [1000,10000,100000]")
    p.add_argument("--passes", type=int, help="measured 10-task and empty passes [15; quick 5]")
    p.add_argument("--no-probes", action="store_true", help="skip the SLOWLOG/heartbeat probes")
    p.add_argument("--no-daemons", action="store_true", help="skip the real-daemon utilization")
    p.add_argument("--out", type=Path, help="also write the markdown tables to this file")
    p.add_argument(
        "--where",
        action="store_true",
        help="every device gets attributes (sdk, battery) and the measured 10-task passes' "
        "tasks carry 10 distinct --where expressions",
    )
    p.add_argument(
        "--realtime-redis",
        action="store_true",
        help="run each redis-server under SCHED_FIFO (root): SLOWLOG then times the calls' own "
        "work, not the time the bench's own processes take the CPU from it",
    )
    p.add_argument(
        "--plan-ahead",
        action="store_true",
        help="the real daemons' scheduler with next-task hints (scheduler run --plan-ahead)",
    )
    a = p.parse_args(argv)
    a.sizes = [int(x) for x in (a.sizes or "1000,10000,100000").split(",")]
    a.passes = a.passes or (5 if a.quick else 15)
    return a


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.plan_ahead:
        daemons.SCHEDULER_OPTIONS.append("--plan-ahead")
    if args.realtime_redis:
        os.environ[REALTIME_ENV] = "1"  # (the daemons' servers too: bench.support.procs.realtime)
    started = time.time()
    load0 = os.getloadavg()
    log(f"sizes={args.sizes} passes={args.passes} batch={DEFAULT_BATCH} load={load0[0]:.2f}")
    names = script_names()
    sizes = [measure_size(n, args.passes, names, args.where) for n in args.sizes]
    probes = None
    if not args.no_probes:
        log("probes: SLOWLOG scenarios and heartbeat cost")
        probes = run_probes(args.quick, log)
    util = util_async = None
    if not args.no_daemons:
        log("utilization with the real daemons: a thread runner, then an async runner")
        util = run_utilization(10 if args.quick else 30, log)
        util_async = run_utilization(10 if args.quick else 30, log, ASYNC_RUNNER)
    load1 = os.getloadavg()
    rt = ", redis-server under SCHED_FIFO" if args.realtime_redis else ""
    meta = (
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit_id()}, "
        f"{'--quick' if args.quick else 'full'} run{' --where' if args.where else ''}"
        f"{' --plan-ahead' if args.plan_ahead else ''}, "
        f"{args.passes} passes per median, "
        f"batch {DEFAULT_BATCH}{rt}, took {time.time() - started:.0f}s; python "
        f"{platform.python_version()}, {os.cpu_count()} cpus, load average (1/5/15 min) "
        f"at start {' '.join(f'{x:.2f}' for x in load0)}, "
        f"at end {' '.join(f'{x:.2f}' for x in load1)}"
    )
    text = markdown(sizes, probes, util, meta, util_async)
    print(text, file=sys.stderr)
    if args.out:
        args.out.write_text(text)
        log(f"wrote {args.out}")
    if args.json:
        out = summary(sizes, probes, util, util_async)
        out["meta"] = meta
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
