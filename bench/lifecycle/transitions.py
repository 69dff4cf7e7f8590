"""Cost of each Lua transition: Redis commands run inside the script per call (from
``INFO commandstats`` deltas on a private redis-server) and µs per call (a sequential loop from
Python through the public API over a real TCP connection, and the server-side time of the
EVALSHA from commandstats), next to references measured in the same run:

- ``EVALSHA return 1``: a trivial script, the floor of any script call from Python;
- ``naive HSET+ZADD+XADD``: what a non-atomic implementation of submit would send as one
  pipeline (a 16-field HSET of the task, a ZADD to a queue, an XADD event), per task.

With ``--library``, only what loading a script's helpers costs per call, for this tree and for
the reference tree ``--baseline REV`` (default ``main``) side by side
(``library_load.py``).

Usage: ``python bench/lifecycle/transitions.py [--quick] [--hosts N]`` or
``python bench/lifecycle/transitions.py --library [--baseline REV] [--rounds N] [--calls N]``"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.common import (
    GOAL,
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
from deviceq.host.link import DeviceReport, Report
from deviceq.host.redis_link import HostClient
from deviceq.ops.admin import PoolAdmin
from deviceq.producer import Client
from deviceq.scheduler.client import SchedulerClient

BATCH = 100


@dataclass
class Row:
    name: str
    calls: int
    items: int  # items per call
    cmds: float  # commands inside the script per call
    client_us: float  # per call, from Python
    server_us: float  # per call, EVALSHA usec from commandstats (0 for non-script refs)
    inner_us: float  # per call, usec of the commands the script ran (the rest is Lua itself)
    cpu_us: float  # per call, redis-server CPU time (user+sys)
    breakdown: str


def measure(
    r: Any, name: str, items: int, calls: list[Callable[[], Any]], server_cmds: bool = False
) -> Row:
    """Run every callable once, sequentially; count what the server did meanwhile.
    ``server_cmds``: the reference sends plain commands (count them, no EVALSHA)."""
    cpu0 = redis_cpu_s(r)
    before = commandstats(r)
    with Timer() as t:
        for fn in calls:
            fn()
    after = commandstats(r)
    cpu = (redis_cpu_s(r) - cpu0) * 1e6 / len(calls)
    d = stat_delta(before, after)
    n = len(calls)
    if server_cmds:
        return Row(
            name,
            n,
            items,
            d.inner_calls / n,
            t.s / n * 1e6,
            d.inner_usec / n,
            d.inner_usec / n,
            cpu,
            d.breakdown(n),
        )
    # a batch call may go as several script calls (core/pacing.py sizes them by time): the
    # row is per script call, with the items each one carried
    made = d.evalsha_calls
    assert made >= n, (name, made, n)
    return Row(
        name,
        made,
        round(items * n / made),
        d.inner_calls / made,
        t.s / made * 1e6,
        d.evalsha_usec / made,
        d.inner_usec / made,
        cpu * n / made,
        d.breakdown(made),
    )


def run(quick: bool, n_hosts: int) -> tuple[list[Row], dict[str, Any]]:
    per_host = BATCH
    n_dev = n_hosts * per_host
    rows: list[Row] = []
    with private_redis() as server:
        r = raw_client(server.url)
        pool = "bench"
        preload_scripts(r)
        admin, client = PoolAdmin(r, pool), Client(r, pool)
        store = SchedulerClient(r, pool)
        admin.set_config("max_queue_depth", 10_000_000)
        fleet = add_hosts(admin, server.url, n_hosts, per_host)
        hosts = {h: HostClient(r, pool, h, tok) for h, tok, _ in fleet}
        devices = [d.device_id for _, _, devs in fleet for d in devs]
        host_of = {d.device_id: h for h, _, devs in fleet for d in devs}

        # ---- references -------------------------------------------------------------------
        trivial = r.register_script("return 1")
        trivial(keys=["dq:{bench}:x"], args=[])
        k = max(200, n_dev)
        rows.append(
            measure(
                r,
                "ref: EVALSHA `return 1`",
                1,
                [lambda: trivial(keys=["dq:{bench}:x"], args=[])] * k,
            )
        )

        def naive(n: int, base: list[int]) -> Callable[[], Any]:
            def go() -> None:
                p = r.pipeline(transaction=False)
                for _ in range(n):
                    base[0] += 1
                    i = base[0]
                    p.hset(
                        f"naive:task:{i}",
                        mapping={
                            "id": f"t{i:015d}",
                            "status": "queued",
                            "kind": "goal",
                            "goal": GOAL,
                            "workflow": "",
                            "driver_type": "android",
                            "tags": "",
                            "priority": 0,
                            "attempt": 0,
                            "max_attempts": 3,
                            "seq": i,
                            "sig": "0123456789abcdef",
                            "submitted_at": 1764400000000,
                            "updated_at": 1764400000000,
                        },
                    )
                    p.zadd("naive:queue", {f"t{i:015d}": i})
                    p.xadd(
                        "naive:events",
                        {"type": "submitted", "task": f"t{i:015d}"},
                        maxlen=100_000,
                        approximate=True,
                    )
                p.execute()

            return go

        counter = [0]
        rows.append(
            measure(
                r,
                "ref: naive pipeline HSET+ZADD+XADD",
                1,
                [naive(1, counter)] * k,
                server_cmds=True,
            )
        )
        rows.append(
            measure(
                r,
                f"ref: naive pipeline x{BATCH}",
                BATCH,
                [naive(BATCH, counter)] * (k // BATCH),
                server_cmds=True,
            )
        )
        r.delete("naive:queue", "naive:events")

        # ---- heartbeat (steady state: nothing changed) --------------------------------------
        tok = admin.add_host("hb")
        hb = HostClient(r, pool, "hb", tok)
        hb_devs = [DeviceReport(f"hb-d{i}", "android", ("wifi",)) for i in range(10)]
        hb.heartbeat(hb_devs)
        hb.set_draining(True)  # its devices must not take the bench's tasks
        rows.append(
            measure(r, "heartbeat (10 devices, unchanged)", 10, [lambda: hb.heartbeat(hb_devs)] * k)
        )

        # ---- single-item calls: submit, assign, claim, renew, report ------------------------
        ids: list[str] = []
        rows.append(
            measure(
                r,
                "submit (single)",
                1,
                [lambda: ids.append(client.submit(GOAL, driver_type="android"))] * n_dev,
            )
        )
        pairs = list(zip(ids, devices, strict=True))
        rows.append(
            measure(r, "assign (single pair)", 1, [lambda p=p: store.commit([p]) for p in pairs])
        )
        claimed: list[tuple[str, str, str]] = []  # host, task, lease

        def claim1(h: str) -> None:
            for a in hosts[h].claim(1):
                claimed.append((h, a.task.id, a.lease_id))

        rows.append(
            measure(r, "claim (max=1)", 1, [lambda d=d: claim1(host_of[d]) for d in devices])
        )
        assert len(claimed) == n_dev, len(claimed)
        rows.append(
            measure(
                r,
                "renew (single)",
                1,
                [lambda c=c: hosts[c[0]].renew([(c[1], c[2])]) for c in claimed],
            )
        )
        rows.append(
            measure(
                r,
                "report done (single)",
                1,
                [lambda c=c: hosts[c[0]].report(c[1], c[2], "done", None, "ok") for c in claimed],
            )
        )
        res = hosts[claimed[0][0]].report(claimed[0][1], claimed[0][2], "done", None, "ok")
        assert res == "dup:done", res

        # ---- batch calls ---------------------------------------------------------------------
        ids = []
        spec = {"goal": GOAL, "driver_type": "android"}
        rows.append(
            measure(
                r,
                f"submit_many (batch {BATCH})",
                BATCH,
                [lambda: ids.extend(client.submit_many([spec] * BATCH))] * (n_dev // BATCH),
            )
        )
        pairs = list(zip(ids, devices, strict=True))
        chunks = [pairs[i : i + BATCH] for i in range(0, len(pairs), BATCH)]
        rows.append(
            measure(
                r,
                f"assign (batch {BATCH} pairs)",
                BATCH,
                [lambda c=c: store.commit(c) for c in chunks],
            )
        )
        claimed = []
        by_host: dict[str, list[tuple[str, str]]] = {}

        def claim_many(h: str) -> None:
            for a in hosts[h].claim(BATCH):
                claimed.append((h, a.task.id, a.lease_id))
                by_host.setdefault(h, []).append((a.task.id, a.lease_id))

        rows.append(
            measure(r, f"claim (max={BATCH})", BATCH, [lambda h=h: claim_many(h) for h in hosts])
        )
        assert len(claimed) == n_dev, len(claimed)
        rows.append(
            measure(
                r,
                f"renew (batch {BATCH})",
                BATCH,
                [lambda h=h: hosts[h].renew(by_host[h]) for h in hosts],
            )
        )
        rows.append(
            measure(
                r,
                f"report_many done (batch {BATCH})",
                BATCH,
                [
                    lambda h=h: hosts[h].report_many(
                        [Report(t, le, "done", None, "ok") for t, le in by_host[h]]
                    )
                    for h in hosts
                ],
            )
        )

        # ---- expire: assigned leases past their claim_ttl, back to the queue ------------------
        admin.set_config("claim_ttl", 1)
        ids = client.submit_many([spec] * n_dev)
        for i in range(0, n_dev, BATCH):
            out = store.commit(list(zip(ids[i : i + BATCH], devices[i : i + BATCH], strict=True)))
            assert all(o.startswith("ok:") for o in out), out[:3]
        time.sleep(1.1)  # claim_ttl is at least 1 s
        results: list[dict[str, int]] = []
        rows.append(
            measure(
                r,
                f"expire (limit {BATCH}, assigned, inbox {per_host})",
                BATCH,
                [lambda: results.append(store.expire(BATCH))] * (n_dev // BATCH),
            )
        )
        assert sum(x["requeued"] for x in results) == n_dev, results[-1]
        admin.set_config("claim_ttl", 30)
        for h, _, devs in fleet:  # the expired leases' hosts prove themselves alive again
            hosts[h].heartbeat(devs)

        # ---- cancel queued tasks (the requeued ones above) -------------------------------------
        rows.append(measure(r, "cancel (queued)", 1, [lambda t=t: client.cancel(t) for t in ids]))
        # ---- the scheduler's pass (when deviceq.scheduler exists): snapshot + plan + commit ----
        try:
            from deviceq.scheduler import TaskScheduler  # type: ignore[import-not-found]
        except ImportError:
            TaskScheduler = None  # noqa: N806
        if TaskScheduler is not None:
            client.submit_many([spec] * n_dev)
            sched = TaskScheduler(r, pool)
            passes: list[int] = []

            def one_pass() -> None:
                passes.append(sched.assign().assigned)

            cpu0 = redis_cpu_s(r)
            before = commandstats(r)
            with Timer() as t:
                while not passes or passes[-1]:
                    one_pass()
            d = stat_delta(before, commandstats(r))
            cpu = (redis_cpu_s(r) - cpu0) * 1e6
            n, items = len(passes), sum(passes)
            total_cmds = sum(v for c, v in d.per_command.items() if c != "info")
            rows.append(
                Row(
                    f"TaskScheduler.assign() pass ({items / max(1, n - 1):.0f} pairs)",
                    n,
                    max(1, items // max(1, n)),
                    total_cmds / n,
                    t.s / n * 1e6,
                    cpu / n,
                    d.inner_usec / n,
                    cpu / n,
                    "all commands, client reads + scripts: " + d.breakdown(n),
                )
            )
        info = {"used_memory": r.info("memory")["used_memory_human"]}
        r.close()
    return rows, info


# Lua building blocks the transitions are made of: each script runs its body LOOP times
LOOP = 1000
MICRO = {
    "empty loop": "for i = 1, LOOP do end",
    "redis.call EXISTS (cheapest command)": (
        "for i = 1, LOOP do redis.call('EXISTS', KEYS[1]) end"
    ),
    "redis.call HGET on a listpack hash": (
        "for i = 1, LOOP do redis.call('HGET', KEYS[1], 'a') end"
    ),
    "k('task', id) key (table.concat of varargs)": (
        "local P = KEYS[1] "
        "local function k(...) return P .. table.concat({...}, ':') end "
        "for i = 1, LOOP do local x = k('task', 'abcdef0123456789') end"
    ),
    "key by plain concatenation": (
        "local P = KEYS[1] for i = 1, LOOP do local x = P .. 'task' .. ':' .. 'abcdef01' end"
    ),
    "cjson decode + encode of an attempt record": (
        "local s = cjson.encode({attempt = 1, lease_id = 'abcdef0123456789-a1', "
        "host_id = 'h001', device_id = 'h001-d001', assigned_at = 1764400000000, "
        "outcome = 'active'}) "
        "for i = 1, LOOP do local t = cjson.decode(s) t.outcome = 'done' s = cjson.encode(t) end"
    ),
    # a dispatched task's hash (21 fields, a listpack: TASK_HASH) read whole, and the ~30
    # fields the lifecycle helpers use read by name (lib/tasks.lua reads it whole)
    "HGETALL of a task hash into a table": (
        "for i = 1, LOOP do local f = redis.call('HGETALL', KEYS[1] .. 't') local t = {} "
        "for j = 1, #f, 2 do t[f[j]] = f[j + 1] end end"
    ),
    "HMGET of 30 task fields into a table": (
        "local names = {" + ", ".join(f"'f{i}'" for i in range(30)) + "} "
        "for i = 1, LOOP do local v = redis.call('HMGET', KEYS[1] .. 't', unpack(names)) "
        "local t = {} for j, n in ipairs(names) do t[n] = v[j] end end"
    ),
    "XADD MAXLEN ~ 100000 (an event)": (
        "for i = 1, LOOP do redis.call('XADD', KEYS[1] .. 's', 'MAXLEN', '~', 100000, '*', "
        "'type', 'done', 'task', 'abcdef0123456789', 'lease', 'abcdef0123456789-a1') end"
    ),
}


def lua_micro(repeat: int) -> list[list[Any]]:
    """µs per iteration of each building block: EVALSHA usec / LOOP, median of the runs
    (redis CPU time is too coarse for a ~1 ms call)."""
    out = []
    with private_redis() as server:
        r = raw_client(server.url)
        r.hset("dq:{m}:h", mapping={"a": "1", "b": "2"})
        r.hset("dq:{m}:ht", mapping={f"f{i}": f"value-{i:04d}-abcdef" for i in range(21)})
        for name, body in MICRO.items():
            sha = r.script_load(f"local LOOP = {LOOP} " + body + " return 1")
            usec = []
            for _ in range(max(5, repeat)):
                b = commandstats(r)
                r.evalsha(sha, 1, "dq:{m}:h")
                usec.append(stat_delta(b, commandstats(r)).evalsha_usec / LOOP)
            out.append([name, median(usec), min(usec)])
        r.close()
    return out


def combine(rows: list[Row]) -> Row:
    """The median of each number over repeated runs of the same row."""

    def med(f: str) -> float:
        return median(getattr(x, f) for x in rows)

    first = rows[0]
    return Row(
        first.name,
        first.calls,
        first.items,
        med("cmds"),
        med("client_us"),
        med("server_us"),
        med("inner_us"),
        med("cpu_us"),
        first.breakdown,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls (< 30 s)")
    ap.add_argument(
        "--hosts",
        type=int,
        default=None,
        help=f"hosts of {BATCH} devices; calls per single transition = hosts*100",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=None,
        help="runs on fresh servers; each number is the median over runs "
        "(default 3, 1 with --quick)",
    )
    ap.add_argument(
        "--library",
        action="store_true",
        help="only the per-call cost of loading each script's helpers, beside --baseline",
    )
    ap.add_argument("--baseline", default="main", help="reference git revision for --library")
    ap.add_argument("--rounds", type=int, default=7, help="rounds of --library")
    ap.add_argument("--calls", type=int, default=5000, help="calls per script and round")
    ap.add_argument("--out", type=Path, help="write the transitions table here too (bench.ab)")
    args = ap.parse_args()
    if args.library:
        from bench.lifecycle.library_load import run as library_run

        print(library_run(args.baseline, args.rounds, args.calls))
        return
    n_hosts = args.hosts or (2 if args.quick else 10)
    repeat = args.repeat or (1 if args.quick else 3)
    print(f"machine: {machine()}")
    with Timer() as t:
        runs = [run(args.quick, n_hosts) for _ in range(repeat)]
    info = runs[-1][1]
    rows = [combine([rs[0][i] for rs in runs]) for i in range(len(runs[0][0]))]
    ref_eval = next(x for x in rows if x.name.startswith("ref: EVALSHA"))
    ref_naive = next(x for x in rows if x.name == "ref: naive pipeline HSET+ZADD+XADD")
    ref_naive_b = next(x for x in rows if x.name.startswith(f"ref: naive pipeline x{BATCH}"))
    out = []
    for x in rows:
        naive = ref_naive_b if x.items > 1 else ref_naive
        out.append(
            [
                x.name,
                x.calls,
                x.cmds,
                x.cmds / x.items,
                x.client_us,
                x.client_us / x.items,
                x.server_us,
                x.server_us / x.items,
                x.inner_us / x.items,
                x.cpu_us / x.items,
                x.client_us / ref_eval.client_us,
                (x.client_us / x.items) / (naive.client_us / naive.items),
                (x.cpu_us / x.items) / (naive.cpu_us / naive.items),
                x.breakdown,
            ]
        )
    main_table = table(
        [
            "transition",
            "calls",
            "cmds/call",
            "cmds/item",
            "client µs/call",
            "client µs/item",
            "server µs/call",
            "server µs/item",
            "in-cmds µs/item",
            "redis CPU µs/item",
            "x EVALSHA(1) client",
            "x naive/item client",
            "x naive/item redis CPU",
            "commands per call inside the script",
        ],
        out,
    )
    print(main_table)
    if args.out:  # (bench.ab compares this table between two trees)
        args.out.write_text(main_table + "\n")
    print("\nLua building blocks (per iteration, inside one EVALSHA):")
    print(table(["block", "server µs (median)", "server µs (min)"], lua_micro(repeat)))
    print(
        f"\n{repeat} run(s), medians; x naive compares per item with the naive pipeline of "
        f"the same batch size (1 or {BATCH})"
    )
    print(
        f"machine after: {machine()}; redis used_memory {info['used_memory']}; "
        f"bench took {t.s:.1f} s"
    )


if __name__ == "__main__":
    main()
