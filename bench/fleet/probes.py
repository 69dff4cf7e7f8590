"""The long-script and heartbeat probes of ``python -m bench.fleet``, on a private
redis-server of their own (``SLOWLOG`` with ``slowlog-log-slower-than 5000``):

1. ``host_5000``: a host registering 5,000 devices (its first heartbeat), then heartbeating
   them unchanged a few times;
2. ``expire_10k``: 10,000 assignments whose claim leases (``claim_ttl`` = 1 s) lapse at
   once, then ended by ``TaskScheduler.expire()`` as a scheduler pass runs it (batches of
   ``expire_batch``, ``expire_rounds`` calls per pass) until none is left;
3. ``submit_100k``: one ``Client.submit_many`` of 100,000 tasks (its default chunk);
4. ``commit_200``: one commit of 200 (task, device) pairs (``lua/assign.lua``);
5. ``report_100``: one ``HostClient.report_many`` of 100 claimed attempts (``done``);
6. ``trim_1m`` (``--quick``: ``trim_200k``): the retention trim of 1,000,000 finished tasks
   (index entries of ``status:done``/``failed``/``cancelled`` far past ``retention``, a third
   each, and 100,000 old events, written directly into a pool of their own) by
   ``TaskScheduler.expire()`` calls until none is left; then again with ``expire_batch``
   10,000 (``trim_1m_batch10k``: a call asks for 30,000 entries).

Each scenario starts from ``SLOWLOG RESET``; its entries are named by script (an EVALSHA's
first argument is the script's sha: ``deviceq.core.scripts.sha(name)``).

Then the heartbeat cost when nothing changed: Redis command time (``INFO commandstats``) and
Redis CPU (``INFO cpu``) per heartbeat of a host with 10 devices and of one with 5,000, the
INFO calls' own cost subtracted (``bench.support.assignment.stats_overhead``)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis

from bench.support.assignment import GOAL, POOL, add_fleet, stats, stats_overhead
from bench.support.common import preload_scripts
from bench.support.procs import realtime
from deviceq import Client, DeviceReport, HostClient, PoolAdmin, Report
from deviceq.core import scripts
from deviceq.core.redis_server import RedisServer
from deviceq.scheduler.task_scheduler import TaskScheduler

SLOWER_THAN_US = 5000
PACED_MS = 25.0  # heartbeats of the paced measurement start this far apart
Log = Callable[[str], None]


def sha_names() -> dict[str, str]:
    """Script sha -> script name, for every script deviceq sends."""
    return {scripts.sha(n): n for n in scripts.names()}


@dataclass
class SlowEntry:
    script: str  # script name, or a command's name (is_script False)
    duration_ms: float
    is_script: bool = True


@dataclass
class Scenario:
    """What ``SLOWLOG`` recorded during one scenario (entries over 5 ms only)."""

    name: str
    wall_s: float = 0.0
    entries: list[SlowEntry] = field(default_factory=list)
    note: str = ""
    redis_cpu_ms: float = 0.0  # INFO cpu (main thread) over the whole scenario

    @property
    def longest(self) -> SlowEntry | None:
        """The longest script call (EVALSHA) recorded."""
        return longest(self.entries)

    @property
    def longest_inner(self) -> SlowEntry | None:
        """The longest other command (one a script ran -- Redis 7 logs those too -- or a
        client's own, e.g. a pipelined read)."""
        inner = [e for e in self.entries if not e.is_script]
        return max(inner, key=lambda e: e.duration_ms) if inner else None

    def by_script(self) -> dict[str, tuple[int, float]]:
        """script -> (entries, longest ms), script calls only."""
        out: dict[str, tuple[int, float]] = {}
        for e in self.entries:
            if not e.is_script:
                continue
            n, m = out.get(e.script, (0, 0.0))
            out[e.script] = (n + 1, max(m, e.duration_ms))
        return out

    def as_dict(self) -> dict[str, Any]:
        lo, inner = self.longest, self.longest_inner
        return {
            "wall_s": round(self.wall_s, 3),
            "redis_cpu_ms": round(self.redis_cpu_ms, 1),
            "slow_script_calls": sum(1 for e in self.entries if e.is_script),
            "slow_inner_commands": sum(1 for e in self.entries if not e.is_script),
            "longest_inner_command": inner.script if inner else None,
            "longest_inner_ms": round(inner.duration_ms, 2) if inner else None,
            "max_ms": round(lo.duration_ms, 2) if lo else None,
            "max_script": lo.script if lo else None,
            "by_script": {
                k: {"entries": n, "max_ms": round(m, 2)} for k, (n, m) in self.by_script().items()
            },  # fmt: skip
            "note": self.note,
        }


def longest(entries: list[SlowEntry]) -> SlowEntry | None:
    """The longest script call among ``entries`` (commands run inside scripts left out)."""
    calls = [e for e in entries if e.is_script]
    return max(calls, key=lambda e: e.duration_ms) if calls else None


def enable_slowlog(r: redis.Redis) -> None:
    """Log every call over 5 ms; every script is loaded first (SCRIPT LOAD), so that each
    call is an EVALSHA named by its sha, never a first EVAL of the source."""
    preload_scripts(r)
    r.config_set("slowlog-log-slower-than", SLOWER_THAN_US)
    r.config_set("slowlog-max-len", 4096)
    r.slowlog_reset()


def read_slowlog(r: redis.Redis, names: dict[str, str], most: int = 4096) -> list[SlowEntry]:
    """Every entry since the last reset (the ``most`` newest), named by script (or by command)."""
    out = []
    for e in r.slowlog_get(most):
        cmd = e["command"]
        # (errors replaced: packed script arguments are binary)
        parts = (cmd.decode(errors="replace") if isinstance(cmd, bytes) else str(cmd)).split(" ")
        head = parts[0].upper()
        if head in ("EVALSHA", "EVALSHA_RO") and len(parts) > 1:
            out.append(SlowEntry(names.get(parts[1], f"sha:{parts[1][:10]}"), e["duration"] / 1e3))
        elif head in ("EVAL", "EVAL_RO", "FCALL"):
            out.append(SlowEntry(f"{head} (source)", e["duration"] / 1e3))
        else:
            out.append(SlowEntry(head, e["duration"] / 1e3, is_script=False))
    return out


@dataclass
class HeartbeatCost:
    devices: int
    beats: int
    cmd_us: float  # INFO commandstats usec per heartbeat
    cpu_us: float  # INFO cpu (main thread) per heartbeat
    wall_ms: float  # client wall time per heartbeat (Python building the args included)
    paced_ms: float | None = None  # each beat started this long after the last (None: at once)


def heartbeat_cost(
    r: redis.Redis,
    hc: HostClient,
    devs: list[DeviceReport],
    beats: int,
    paced_ms: float | None = None,
) -> HeartbeatCost:
    """Heartbeat ``beats`` times with the same devices (each beat alone, measured as a whole):
    back to back, or each ``paced_ms`` after the start of the last. Paced, Redis is idle
    between beats as it is between a real host's, and both host sizes are measured alike:
    back to back, the 5,000-device host's own client time (building its delta) spaces its
    beats and the 10-device host's follow each other at once, and an idle Redis serves the
    next call slower (its caches cold)."""
    hc.heartbeat(devs)  # whatever changed is applied before the window
    cmd_us, cpu_us, wall_ms = per_call(r, beats, paced_ms, lambda _: hc.heartbeat(devs))
    return HeartbeatCost(len(devs), beats, cmd_us, cpu_us, wall_ms, paced_ms)


def per_call(
    r: redis.Redis, calls: int, paced_ms: float | None, call: Callable[[int], object]
) -> tuple[float, float, float]:
    """Redis command µs, Redis CPU µs and client wall ms per call of ``call(i)``, ``calls``
    times: back to back, or each ``paced_ms`` after the start of the last (the INFO calls'
    own cost subtracted)."""
    cpu_oh, us_oh = stats_overhead(r, 10)
    c0, u0, _ = stats(r)
    t = time.perf_counter()
    for i in range(calls):
        if paced_ms is not None:
            time.sleep(max(0.0, t + i * paced_ms / 1000 - time.perf_counter()))
        call(i)
    wall = time.perf_counter() - t
    c1, u1, _ = stats(r)
    return (max(0.0, u1 - u0 - us_oh) / calls, max(0.0, c1 - c0 - cpu_oh) / calls,
            wall * 1000 / calls)  # fmt: skip


def calls_alone(
    r: redis.Redis, hc: HostClient, devs: list[DeviceReport], beats: int
) -> Callable[[], None]:
    """``beats`` unchanged heartbeat script calls of ``hc``, their arguments built first."""
    auth = [hc.host_id, hc._token, hc.session]
    if hasattr(hc, "heartbeat_call"):  # the delta protocol
        hk = hc.keys.host(hc.host_id)
        versions = [f"bench{i}" for i in range(beats)]
        no_devices = packed_none()

        def deltas() -> None:
            ver = str(r.hget(hk, "hb_ver"))
            for nxt in versions:
                args = [*auth, "delta", ver, nxt, str(len(devs)), "0", *no_devices]
                hc.scripts.run("heartbeat", hc.keys.prefix, args)
                ver = nxt

        return deltas
    args = [*auth, str(len(devs))]
    for dev in devs:
        args += dev.args()

    def snapshots() -> None:
        for _ in range(beats):
            hc.scripts.run("heartbeat", hc.keys.prefix, args)

    return snapshots


def packed_none() -> list[bytes]:
    """A delta's devices argument when it carries none: the packed empty list on a tree whose
    heartbeat takes its devices packed (`deviceq.core.script_args`), nothing on an older one."""
    try:
        from deviceq.core.script_args import packb
    except ImportError:
        return []
    return [packb([])]


FLOORS = {
    "floor: a script doing nothing": "return 1",
    "floor: a script of 2 commands": (
        "redis.call('HGET', KEYS[1], 'token_digest') "
        "redis.call('HSET', KEYS[1], 'last_heartbeat', ARGV[1]) return 1"
    ),
}
"""What any script call costs this server: the floor an unchanged heartbeat (a host proves
itself and says it is alive: at least a read and a write) is compared with."""


def unchanged_alone_us(
    r: redis.Redis, hc: HostClient, devs: list[DeviceReport], beats: int
) -> float:
    """Redis command µs per unchanged heartbeat script call of ``hc``, `calls_alone`."""
    fn = calls_alone(r, hc, devs, beats)
    return per_call(r, 1, None, lambda _: fn())[0] / beats


def script_floor_us(r: redis.Redis, key: str, calls: int, paced_ms: float | None) -> float:
    """Redis command µs per call of the 2-command floor script (`FLOORS`) on ``key``: back to
    back, or each call ``paced_ms`` after the start of the last (as the paced heartbeats)."""
    sha = str(r.script_load(FLOORS["floor: a script of 2 commands"]))
    return per_call(r, calls, paced_ms, lambda i: r.evalsha(sha, 1, key, str(i)))[0]


@dataclass
class Probes:
    scenarios: list[Scenario]
    heartbeats: list[HeartbeatCost]
    alone_us: dict[str, float] = field(default_factory=dict)  # devices -> µs per call
    floor_us: dict[str, float] = field(default_factory=dict)  # back_to_back | paced -> µs

    @property
    def longest(self) -> tuple[str, SlowEntry] | None:
        best = None
        for s in self.scenarios:
            lo = s.longest
            if lo and (best is None or lo.duration_ms > best[1].duration_ms):
                best = (s.name, lo)
        return best


def run_probes(quick: bool, log: Log) -> Probes:
    names = sha_names()
    srv = realtime(RedisServer().start())
    try:
        return _run(srv.url, names, quick, log)
    finally:
        srv.stop()


def _run(url: str, names: dict[str, str], quick: bool, log: Log) -> Probes:
    r = redis.Redis.from_url(url, decode_responses=True)
    client, admin = Client(url, POOL), PoolAdmin(url, POOL)
    for k, v in {"max_queue_depth": 400_000, "claim_ttl": 3600, "lease_ttl": 3600,
                 "host_timeout": 3600}.items():  # fmt: skip
        admin.set_config(k, v)
    enable_slowlog(r)
    out: list[Scenario] = []

    def scenario(name: str, fn: Callable[[], str]) -> None:
        r.slowlog_reset()
        c0, _, _ = stats(r)
        t = time.perf_counter()
        note = fn()
        wall = time.perf_counter() - t
        c1, _, _ = stats(r)
        s = Scenario(name, wall, read_slowlog(r, names), note, (c1 - c0) / 1000)
        lo = s.longest
        log(
            f"  slowlog {name}: {len(s.by_script())} script(s) over {SLOWER_THAN_US / 1000:.0f} "
            + (f"ms, longest call {lo.duration_ms:.1f} ms ({lo.script})" if lo else "ms: none")
            + f"; {s.wall_s:.1f}s, {s.redis_cpu_ms:,.0f} ms Redis CPU; {note}"
        )
        out.append(s)

    big_id = "big"
    big = HostClient(url, POOL, big_id, admin.add_host(big_id))
    big_devs = [DeviceReport(f"big-d{i}", "d0", ()) for i in range(5000)]
    beats = 3

    def host_5000() -> str:
        big.heartbeat(big_devs)
        for _ in range(beats):
            big.heartbeat(big_devs)
        return f"register + {beats} unchanged heartbeats"

    scenario("host_5000", host_5000)

    # heartbeat cost when nothing changed
    small_id = "small"
    small = HostClient(url, POOL, small_id, admin.add_host(small_id))
    small_devs = [DeviceReport(f"small-d{i}", "d1", ()) for i in range(10)]
    small.heartbeat(small_devs)
    n = 50 if quick else 200
    hb = [
        heartbeat_cost(r, small, small_devs, n, PACED_MS),  # alike: the comparison
        heartbeat_cost(r, big, big_devs, n, PACED_MS),
        heartbeat_cost(r, small, small_devs, n),  # as fast as each client goes
        heartbeat_cost(r, big, big_devs, n),
    ]
    for h in hb:
        how = f"every {h.paced_ms:.0f} ms" if h.paced_ms else "back to back"
        log(
            f"  heartbeat unchanged, {h.devices} devices, {how}: {h.cmd_us:,.0f} us Redis "
            f"command time, {h.cpu_us:,.0f} us Redis CPU, {h.wall_ms:.2f} ms wall (x{h.beats})"
        )
    hosts = ((small, small_devs), (big, big_devs))
    alone = {str(len(d)): unchanged_alone_us(r, h, d, n) for h, d in hosts}
    key = small.keys.host(small_id)
    floor = {"back_to_back": script_floor_us(r, key, n, None),
             "paced": script_floor_us(r, key, n, PACED_MS)}  # fmt: skip
    log(
        "  heartbeat unchanged, script calls alone: "
        + ", ".join(f"{d} devices {us:,.0f} us" for d, us in alone.items())
        + f"; a 2-command script: {floor['back_to_back']:,.0f} us back to back, "
        f"{floor['paced']:,.0f} us paced"
    )
    admin.remove_host(small_id, force=True)

    # 10,000 leases lapsing at once: 5,000 devices of `big` + 50 hosts of 100
    others = add_fleet(url, admin, 5000, 1, "x")
    admin.set_config("claim_ttl", 1)
    client.submit_many([{"goal": GOAL} for _ in range(10_000)], chunk=1000)
    sched = TaskScheduler(admin)
    assigned = 0
    for _ in range(200):
        res = sched.assign(expire=False)
        assigned += res.assigned
        if assigned >= 10_000 or not res.assigned:
            break
    time.sleep(1.5)  # every claim lease (1 s) has lapsed

    def expire_10k() -> str:
        total, calls = 0, 0
        while True:
            got = sched.expire()
            calls += 1
            total += sum(v for k, v in got.items() if k != "more")
            if not got.get("more") or calls > 5000:
                break
        return (
            f"{assigned} assigned, {total} ended by {calls} TaskScheduler.expire() calls "
            f"(batches of {sched.expire_batch}, {sched.expire_rounds} per call"
            f"{budget_note(sched)})"
        )

    scenario("expire_10k", expire_10k)
    admin.set_config("claim_ttl", 3600)
    big.heartbeat(big_devs)  # a heartbeat clears the hosts' and devices' suspect marks
    for i, h in enumerate(others):
        h.heartbeat([DeviceReport(f"x-dev{j}", "d0", ()) for j in range(i * 100, i * 100 + 100)])

    def submit_100k() -> str:
        specs = [{"goal": GOAL} for _ in range(100_000)]
        ids = client.submit_many(specs)
        return f"{len(ids)} tasks, default chunk"

    scenario("submit_100k", submit_100k)

    def commit_200() -> str:
        base, want, heads = sched.reader.read()
        _, pairs, _ = sched.plan_deep(base, want, heads)
        pairs = pairs[:200]
        c0, u0, _ = stats(r)
        t = time.perf_counter()
        outcome = sched.commit(pairs)
        wall = time.perf_counter() - t
        c1, u1, _ = stats(r)
        ok = sum(1 for o in outcome if o.startswith("ok:"))
        return (
            f"{len(pairs)} pairs ({ok} ok): {wall * 1000:.1f} ms wall, "
            f"{(c1 - c0) / 1000:.1f} ms Redis CPU, {(u1 - u0) / 1000:.1f} ms command time"
        )

    scenario("commit_200", commit_200)

    claimed = claim_some(sched, [big, *others], 100)

    def report_100() -> str:
        host, got = claimed
        answers = host.report_many([Report(a.task.id, a.lease_id, "done", None, "ok") for a in got])
        ok = sum(1 for a in answers if a.startswith("ok:"))
        return f"{len(got)} reports in one report_many ({ok} ok)"

    scenario("report_100", report_100)

    n_trim = 200_000 if quick else 1_000_000
    name = f"trim_{n_trim // 1000}k" if n_trim < 1_000_000 else "trim_1m"
    for batch in (500, 10_000):  # the default expire_batch, and one that asks for much more
        trim_admin = PoolAdmin(url, f"trim{batch}")
        fill_finished(r, trim_admin, n_trim, 100_000)
        scenario(name + ("" if batch == 500 else "_batch10k"), trimming(r, trim_admin, batch))
    r.close()
    return Probes(out, hb, alone, floor)


def trimming(r: redis.Redis, trim_admin: PoolAdmin, batch: int) -> Callable[[], str]:
    """The retention trim scenario: ``TaskScheduler.expire()`` until nothing is left."""
    trimmer = TaskScheduler(trim_admin, expire_batch=batch)

    def trim() -> str:
        total, calls = 0, 0
        while calls < 100_000:
            got = trimmer.expire()
            calls += 1
            total += got["trimmed"]
            if not got.get("more"):
                break
        left = sum(r.zcard(trim_admin.keys.status(st)) for st in ("done", "failed", "cancelled"))
        return (
            f"{total:,} index entries trimmed by {calls} TaskScheduler.expire() calls "
            f"(expire_batch {batch}{budget_note(trimmer)}), {left} left; "
            f"events {r.xlen(trim_admin.keys.events):,} of 100,000 old left"
        )

    return trim


def budget_note(sched: TaskScheduler) -> str:
    """The expiry calls' time budget, where the tree has one."""
    budget = getattr(sched, "expire_budget_ms", None)
    return f", {budget:g} ms budget a call" if budget else ""


def claim_some(
    sched: TaskScheduler, hosts: list[HostClient], n: int
) -> tuple[HostClient, list[Any]]:
    """``n`` attempts claimed by one host (its own assignments; more passes while none of the
    hosts holds ``n``)."""
    got: dict[str, list[Any]] = {h.host_id: [] for h in hosts}
    for _ in range(50):
        for h in hosts:
            got[h.host_id] += h.claim(1000)
        best = max(hosts, key=lambda h: len(got[h.host_id]))
        if len(got[best.host_id]) >= n:
            return best, got[best.host_id][:n]
        sched.assign(expire=False)
    return best, got[best.host_id][:n]


def fill_finished(r: redis.Redis, admin: PoolAdmin, n: int, events: int) -> None:
    """``n`` finished tasks' index entries far past ``retention`` (a third in each terminal
    index, task-id-like members) and ``events`` old events, written directly."""
    keys = admin.keys
    pipe = r.pipeline(transaction=False)
    for i in range(0, n, 5000):
        st = ("done", "failed", "cancelled")[(i // 5000) % 3]
        pipe.zadd(keys.status(st), {f"{j:016x}": 1_000_000 + j for j in range(i, min(n, i + 5000))})
        if len(pipe) >= 20:
            pipe.execute()
    for i in range(1, events + 1):
        pipe.xadd(keys.events, {"type": "done", "task": f"{i:016x}"}, id=f"{1_000_000 + i}-0")
        if len(pipe) >= 10_000:
            pipe.execute()
    pipe.execute()
