"""Redis CPU per task lifecycle against the number of items per script call.

Through the real daemons (``python -m bench``) a drain with 16 devices runs about 5 items per
assign, claim or report call, because devices free up a few at a time. This benchmark holds
the batch size fixed and measures what one lifecycle costs Redis at each size, for two
implementations, each on its own fresh private ``redis-server``, interleaved, in one run:

- **deviceq**: the public API. A scheduler pass (``TaskScheduler.assign``: its snapshot reads,
  ``heads.lua`` and ``assign.lua``), ``HostClient.claim(B)``, the job's ``INCR``, then
  ``HostClient.report_many`` of the B claimed tasks, on one host with B idle devices. The
  pass's expiry step (``expire.lua``) runs as the scheduler daemon runs it: on its tick
  (``DEFAULT_TICK``, 2 s), not at every pass (``--expire-every-pass``: at every pass, as this
  benchmark did before; the floor has no expiry).
- **floor**: the least an atomic lifecycle can be: three inline scripts (assign, claim, report),
  each taking B items, with one event per transition, a lease index, the device's reservation,
  a per-host inbox and an attempt record, the same ``ZRANGE`` snapshot read and job ``INCR``.
  It checks only the task's status and lease: no token or session, no device or host state,
  no pool settings, no status indexes, no retry policy, no retention. It is a reference for
  the per-call and per-item cost, not an implementation of deviceq's guarantees.

Calls are sequential from Python over TCP on an otherwise idle server, so each call is a
round trip of its own (as in the drain). Redis CPU is ``used_cpu_user + used_cpu_sys`` from
``INFO cpu`` around the loop; commands and script time are from ``INFO commandstats``.

Usage: ``python bench/lifecycle/batch.py [--quick] [--repeat N] [--out FILE]``"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.common import (
    Timer,
    add_hosts,
    commandstats,
    machine,
    median,
    preload_scripts,
    private_redis,
    raw_client,
    redis_cpu_s,
    stat_delta,
    table,
)
from deviceq.host.link import Report
from deviceq.host.redis_link import HostClient
from deviceq.ops.admin import PoolAdmin
from deviceq.producer import Client
from deviceq.scheduler import TaskScheduler
from deviceq.scheduler.daemon import DEFAULT_TICK

GOAL = "open the settings app, enable wifi, check the connection: ok"
DRIVER = "bench"

# -- the floor: three minimal atomic transitions (see the module docstring) -----------------
_NOW = "local t = redis.call('TIME') local now = t[1] * 1000 + math.floor(t[2] / 1000)\n"
FLOOR_ASSIGN = (
    _NOW
    + """local P, out = KEYS[1], {}
for i = 1, #ARGV, 2 do
  local id, dev = ARGV[i], ARGV[i + 1]
  if redis.call('ZREM', P .. 'queue', id) == 1 then
    local lease = id .. '-1'
    redis.call('HSET', P .. 'task:' .. id, 'status', 'assigned', 'device_id', dev,
      'lease_id', lease, 'assigned_at', now)
    redis.call('HSET', P .. 'device:' .. dev, 'reserved_by', id)
    redis.call('ZREM', P .. 'idle', dev)
    redis.call('ZADD', P .. 'leases', now + 30000, id)
    redis.call('RPUSH', P .. 'inbox', id)
    redis.call('RPUSH', P .. 'task:' .. id .. ':attempts', cjson.encode({attempt = 1,
      lease_id = lease, device_id = dev, assigned_at = now}))
    redis.call('XADD', P .. 'events', 'MAXLEN', '~', '100000', '*', 'type', 'assigned', 'task', id,
      'device', dev, 'lease', lease)
    out[#out + 1] = id
  end
end
return out"""
)
FLOOR_CLAIM = (
    _NOW
    + """local P, out = KEYS[1], {}
for i = 1, tonumber(ARGV[1]) do
  local id = redis.call('LPOP', P .. 'inbox')
  if not id then break end
  local f = redis.call('HMGET', P .. 'task:' .. id, 'status', 'lease_id', 'device_id', 'goal')
  if f[1] == 'assigned' then
    redis.call('HSET', P .. 'task:' .. id, 'status', 'dispatched', 'dispatched_at', now)
    redis.call('ZADD', P .. 'leases', now + 30000, id)
    redis.call('XADD', P .. 'events', 'MAXLEN', '~', '100000', '*', 'type', 'dispatched',
      'task', id, 'lease', f[2])
    out[#out + 1] = {id, f[2], f[3], f[4]}
  end
end
return out"""
)
FLOOR_REPORT = (
    _NOW
    + """local P, out = KEYS[1], {}
for i = 1, #ARGV, 2 do
  local id, lease = ARGV[i], ARGV[i + 1]
  local f = redis.call('HMGET', P .. 'task:' .. id, 'status', 'lease_id', 'device_id')
  if f[1] == 'dispatched' and f[2] == lease then
    redis.call('HSET', P .. 'task:' .. id, 'status', 'done', 'result', 'ok', 'finished_at', now)
    redis.call('ZREM', P .. 'leases', id)
    redis.call('HSET', P .. 'device:' .. f[3], 'reserved_by', '')
    redis.call('ZADD', P .. 'idle', now, f[3])
    redis.call('LSET', P .. 'task:' .. id .. ':attempts', 0, cjson.encode({attempt = 1,
      lease_id = lease, device_id = f[3], outcome = 'done', ended_at = now}))
    redis.call('XADD', P .. 'events', 'MAXLEN', '~', '100000', '*', 'type', 'done', 'task', id,
      'lease', lease)
    out[#out + 1] = 'ok'
  else
    out[#out + 1] = 'rejected'
  end
end
return out"""
)


@dataclass
class Lab:
    """One pool on a private server with one host of ``batch`` idle devices of `DRIVER`: the
    lifecycle set-up of this benchmark, ``bench/lifecycle/instructions.py`` and
    ``bench/lifecycle/commands.py``."""

    r: redis.Redis
    pool: str
    admin: PoolAdmin
    client: Client
    host: HostClient


def lab(url: str, batch: int, host_cls: type[HostClient] = HostClient) -> Lab:
    """A `Lab` on the server at ``url`` (every script loaded first: each call is an
    ``EVALSHA``)."""
    r = raw_client(url)
    preload_scripts(r)
    pool = "bench"
    admin, client = PoolAdmin(r, pool), Client(r, pool)
    admin.set_config("max_queue_depth", 10_000_000)
    host_id, token, _ = add_hosts(admin, url, 1, batch, driver_type=DRIVER)[0]
    return Lab(r, pool, admin, client, host_cls(r, pool, host_id, token))


def merged_calls(host: HostClient) -> bool:
    """Does this tree's host link claim in its reports and renew on its heartbeats
    (`HostLink.report_and_claim`, ``heartbeat(leases=...)``)? (``bench.ab`` runs one script
    on two trees: a baseline without them runs the separate calls.)"""
    return bool(getattr(host, "heartbeat_renews", False)) and hasattr(host, "report_and_claim")


def staggered_rounds(
    host: HostClient,
    devices: list[Any],
    batch: int,
    tasks: int,
    timed: Callable[[str, Callable[[], Any]], Any],
    sched_pass: Callable[[], Any],
) -> None:
    """``tasks`` lifecycles on one host of ``2 * batch`` devices (``devices``, its snapshot) in
    two groups of ``batch`` whose runs end in turn (a busy host's runs end at different
    times): each round the host's upkeep (``upkeep``: its full device snapshot, and one renewal
    of every running lease), the ``report`` of one group's runs, a scheduler ``pass`` that
    assigns that group's devices again, and their ``claim``. Where the link can
    (`merged_calls`), the renewals ride on the heartbeat and the claim on the next report
    (the claim phase then runs only when no report is left to carry it). ``timed(phase,
    call)`` runs and counts one phase's call."""
    merged = merged_calls(host)
    ids = [d.device_id for d in devices]
    running: list[list[Any]] = [[], []]

    def take(got: list[Any]) -> None:
        for a in got:
            running[ids.index(a.device_id) // batch].append(a)

    timed("pass", sched_pass)
    take(timed("claim", lambda: host.claim(2 * batch)))
    done, g = 0, 0
    while done < tasks:
        leases = [(a.task.id, a.lease_id) for a in running[0] + running[1]]
        if merged:
            timed("upkeep", partial(host.heartbeat, devices, full=True, leases=leases))
        else:
            timed("upkeep", lambda ls=leases: (host.heartbeat(devices, full=True), host.renew(ls)))
        ended, running[g] = running[g], []
        reports = [Report(a.task.id, a.lease_id, "done", payload="ok") for a in ended]
        if merged and reports:
            _, got = timed("report", partial(host.report_and_claim, reports, batch))
            take(got)
        elif reports:
            timed("report", partial(host.report_many, reports))
        done += len(reports)
        timed("pass", sched_pass)
        if not merged or not (running[1 - g] or done >= tasks):
            take(timed("claim", lambda: host.claim(batch)))
        if not reports and not running[0] and not running[1] and done < tasks:
            raise RuntimeError(f"nothing runs after {done} of {tasks} tasks")
        g = 1 - g


def floor_submit(r: redis.Redis, prefix: str, lo: int, hi: int) -> None:
    """The floor's submit of tasks ``t{lo}``..``t{hi - 1}``: a pipelined ``HSET`` and ``ZADD``
    each."""
    pipe = r.pipeline(transaction=False)
    for j in range(lo, hi):
        pipe.hset(f"{prefix}task:t{j}", mapping={"status": "queued", "goal": GOAL,
                                                 "driver_type": DRIVER})  # fmt: skip
        pipe.zadd(prefix + "queue", {f"t{j}": j})
    pipe.execute()


@dataclass
class Cell:
    impl: str
    batch: int
    tasks: int
    cpu_us: float  # Redis CPU per task
    cmds: float  # commands per task (scripts' inner commands included)
    calls: float  # script calls per task
    script_us: float  # server time inside script calls per task


def measure(r: redis.Redis, impl: str, batch: int, step: Callable[[], int]) -> Cell:
    """Run ``step`` (one lifecycle round of up to ``batch`` tasks; returns how many ended)
    until it ends none; what the server did meanwhile, per task."""
    before, cpu0 = commandstats(r), redis_cpu_s(r)
    done = 0
    while n := step():
        done += n
    cpu = redis_cpu_s(r) - cpu0
    d = stat_delta(before, commandstats(r))
    cmds = sum(v for c, v in d.per_command.items() if not c.startswith("info"))
    n = max(1, done)
    return Cell(impl, batch, done, cpu * 1e6 / n, cmds / n, d.evalsha_calls / n, d.evalsha_usec / n)


def run_deviceq(batch: int, tasks: int, expire_every_pass: bool = False) -> Cell:
    with private_redis() as server:
        lb = lab(server.url, batch)
        r, pool, client, host = lb.r, lb.pool, lb.client, lb.host
        client.submit_many([{"goal": GOAL, "driver_type": DRIVER}] * tasks)
        sched = TaskScheduler(r, pool)
        counter = f"dq:{{{pool}}}:bench-counter"
        expiry = ExpiryTick(expire_every_pass)

        def step() -> int:
            sched.assign(expire=expiry.due())
            got = host.claim(batch)
            for _ in got:
                r.incr(counter)  # the job
            if got:
                host.report_many([Report(a.task.id, a.lease_id, "done", payload="ok") for a in got])
            return len(got)

        cell = measure(r, "deviceq", batch, step)
        if int(r.get(counter) or 0) != tasks or client.counts().get("done") != tasks:
            raise RuntimeError(f"deviceq: {cell.tasks} of {tasks} tasks ended done")
        r.close()
        return cell


class ExpiryTick:
    """When a pass runs its expiry step: on the scheduler daemon's tick (``tick`` seconds, the
    daemon's ``DEFAULT_TICK``; the first pass runs it), or at every pass."""

    def __init__(self, every_pass: bool, tick: float = DEFAULT_TICK) -> None:
        self.every_pass = every_pass
        self.tick = tick
        self.last = float("-inf")

    def due(self) -> bool:
        now = time.monotonic()
        if self.every_pass or now - self.last >= self.tick:
            self.last = now
            return True
        return False


def run_floor(batch: int, tasks: int) -> Cell:
    with private_redis() as server:
        r = raw_client(server.url)
        p = "dq:{floor}:"
        assign, claim, report = (
            r.register_script(s) for s in (FLOOR_ASSIGN, FLOOR_CLAIM, FLOOR_REPORT)
        )
        floor_submit(r, p, 0, tasks)
        devices = [f"d{i}" for i in range(batch)]
        for fn in (assign, claim, report):  # cached server-side: every measured call is EVALSHA
            r.script_load(fn.script)

        def step() -> int:
            ids: list[Any] = r.zrange(p + "queue", 0, batch - 1)  # the snapshot read
            if not ids:
                return 0
            assign(keys=[p], args=[v for pair in zip(ids, devices, strict=False) for v in pair])
            got = claim(keys=[p], args=[batch])
            for _ in got:
                r.incr(p + "counter")  # the job
            report(keys=[p], args=[v for g in got for v in (g[0], g[1])])
            return len(got)

        cell = measure(r, "floor", batch, step)
        if int(r.get(p + "counter") or 0) != tasks:
            raise RuntimeError(f"floor: {cell.tasks} of {tasks} tasks ended")
        r.close()
        return cell


def combine(cells: list[Cell]) -> tuple[Cell, float, float]:
    """The median cell of repeated runs, with the min and max of the Redis CPU figure."""
    cpus = [c.cpu_us for c in cells]
    first = cells[0]
    return (
        Cell(
            first.impl,
            first.batch,
            first.tasks,
            median(cpus),
            median(c.cmds for c in cells),
            median(c.calls for c in cells),
            median(c.script_us for c in cells),
        ),
        min(cpus),
        max(cpus),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer tasks and sizes (< 30 s)")
    ap.add_argument(
        "--repeat", type=int, default=None, help="runs per cell (default 3, 1 with --quick)"
    )
    ap.add_argument("--out", type=Path, default=None, help="also write the results (markdown) here")
    ap.add_argument(
        "--expire-every-pass",
        action="store_true",
        help="run deviceq's expiry step at every pass (default: on the daemon's 2 s tick)",
    )
    args = ap.parse_args()
    if args.repeat is not None and args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.out is not None and not args.out.parent.is_dir():
        ap.error(f"--out: no such directory: {args.out.parent}")
    sizes = (1, 5, 16) if args.quick else (1, 5, 16, 64)
    repeat = args.repeat or (1 if args.quick else 3)
    tasks = 640 if args.quick else 3_200
    header = f"machine: {machine()}"
    print(header)
    cells: dict[tuple[str, int], list[Cell]] = {}
    with Timer() as t:
        for _ in range(repeat):
            for b in sizes:
                run_dq = partial(run_deviceq, expire_every_pass=args.expire_every_pass)
                for impl, fn in (("deviceq", run_dq), ("floor", run_floor)):
                    cells.setdefault((impl, b), []).append(fn(b, tasks))
    rows = []
    for b in sizes:
        dq, dq_lo, dq_hi = combine(cells[("deviceq", b)])
        fl, fl_lo, fl_hi = combine(cells[("floor", b)])
        rows.append([
            b, f"{dq.cpu_us:.0f} ({dq_lo:.0f}–{dq_hi:.0f})",
            f"{fl.cpu_us:.0f} ({fl_lo:.0f}–{fl_hi:.0f})", dq.cpu_us / fl.cpu_us, dq.cmds,
            fl.cmds, dq.calls, dq.script_us, fl.script_us,
        ])  # fmt: skip
    out = table(
        [
            "items per call", "deviceq Redis CPU µs/task", "floor Redis CPU µs/task",
            "x floor", "deviceq cmds/task", "floor cmds/task", "deviceq script calls/task",
            "deviceq µs in scripts/task", "floor µs in scripts/task",
        ],
        rows,
    )  # fmt: skip
    footer = (
        f"{tasks:,} tasks per cell, {repeat} run(s) per cell on fresh servers, interleaved; "
        f"medians (min–max); the job's INCR and the snapshot read are in both. "
        f"Took {t.s:.0f} s."
    )
    print(out)
    print(footer)
    if args.out:
        args.out.write_text(f"{header}\n\n{out}\n\n{footer}\n")


if __name__ == "__main__":
    main()
