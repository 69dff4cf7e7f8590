"""Redis memory per queued task, and whether per-task costs stay flat as the queue grows.

For each queue depth N (10k, 100k, and 1M unless --quick) and each task shape (a 60-byte goal
with driver_type only; the same with 3 tags; a 200-byte goal), on a fresh private redis-server:
submit N tasks with ``Client.submit_many`` and report

- ``used_memory`` delta / N (everything the pool holds per queued task, event stream included);
- ``MEMORY USAGE`` of a sample of task hashes (average) and of the pool-wide indexes
  (``status:queued``, the ``queue:SIG`` bucket(s), ``events``), divided by N;
- server µs per submitted task at that depth (EVALSHA usec of the last chunks), and the server
  µs per assigned pair of ``assign`` batches of 100 committed at that depth (then claimed and
  reported to free the devices again): both must stay flat from 10k to 1M.

Usage: ``python bench/lifecycle/memory.py [--quick] [--depths 10000,100000,1000000]``"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (run by path: the repository root)

from bench.support.common import (
    GOAL,
    Timer,
    add_hosts,
    commandstats,
    machine,
    preload_scripts,
    private_redis,
    raw_client,
    redis_cpu_s,
    stat_delta,
    table,
)
from deviceq.core.models import TaskSpec
from deviceq.host.link import Report
from deviceq.host.redis_link import HostClient
from deviceq.ops.admin import PoolAdmin
from deviceq.producer import Client
from deviceq.scheduler.client import SchedulerClient

LONG_GOAL = (GOAL + " ") * 3 + "and then report the measured signal strength as JSON."
SHAPES: dict[str, dict[str, Any]] = {
    "goal 60 B, driver_type": {"goal": GOAL, "driver_type": "android"},
    "goal 60 B, driver_type + 3 tags": {
        "goal": GOAL,
        "driver_type": "android",
        "tags": ["wifi", "sim", "os=android-14"],
    },
    "goal 236 B, driver_type": {"goal": LONG_GOAL, "driver_type": "android"},
}
CHUNK = 1000
ROUNDS = 10  # assign batches measured at each depth


def fill(r: Any, client: Client, spec: TaskSpec, n: int) -> float:
    """Submit n tasks in chunks; returns server µs per task of the last 10% of the chunks."""
    calls = max(1, n // CHUNK)
    tail = max(1, calls // 10)
    before = None
    for i in range(calls):
        if i == calls - tail:
            before = commandstats(r)
        client.submit_many([spec] * min(CHUNK, n - i * CHUNK), chunk=CHUNK)
    d = stat_delta(before or {}, commandstats(r))
    return d.evalsha_usec / (tail * CHUNK)


def assign_cost(
    r: Any, admin: PoolAdmin, hosts: list[HostClient], fleet: list[Any], devices: list[str]
) -> tuple[float, float, float]:
    """Commit ROUNDS batches of len(devices) pairs from the queue head; server µs per pair of
    the assign script (EVALSHA usec and redis CPU) and of the whole lifecycle tail
    (assign+claim+report, EVALSHA usec)."""
    for h, (_, _, devs) in zip(hosts, fleet, strict=True):
        h.heartbeat(devs)  # a long fill outlives host_timeout
    assign_us = total_us = cpu_s = 0.0
    pairs_done = 0
    for _ in range(ROUNDS):
        ids = r.zrange(admin.keys.status("queued"), 0, len(devices) - 1)
        pairs = list(zip(ids, devices, strict=False))
        cpu0 = redis_cpu_s(r)
        before = commandstats(r)
        res = SchedulerClient(admin.redis, admin.pool).commit(pairs)
        mid = commandstats(r)
        cpu_s += redis_cpu_s(r) - cpu0
        assert all(x.startswith("ok:") for x in res), res[:3]
        for h in hosts:
            got = h.claim(len(devices))
            h.report_many([Report(a.task.id, a.lease_id, "done", None, "ok") for a in got])
        after = commandstats(r)
        assign_us += stat_delta(before, mid).evalsha_usec
        total_us += stat_delta(before, after).evalsha_usec
        pairs_done += len(pairs)
    return assign_us / pairs_done, cpu_s * 1e6 / pairs_done, total_us / pairs_done


def measure(depth: int, shape: str, listpack_value: int | None = None) -> dict[str, Any]:
    spec = TaskSpec.model_validate(SHAPES[shape])
    with private_redis() as server:
        r = raw_client(server.url)
        if listpack_value:
            r.config_set("hash-max-listpack-value", listpack_value)
        preload_scripts(r)
        admin, client = PoolAdmin(r, "bench"), Client(r, "bench")
        admin.set_config("max_queue_depth", 10_000_000)
        tags = tuple(spec.tags)
        fleet = add_hosts(admin, server.url, 1, 100, tags=tags)
        hosts = [HostClient(r, "bench", h, tok) for h, tok, _ in fleet]
        devices = [d.device_id for _, _, devs in fleet for d in devs]
        client.submit_many([spec] * 10, chunk=CHUNK)  # create the bucket, stream, counters
        mem0 = int(r.info("memory")["used_memory"])
        with Timer() as t:
            submit_us = fill(r, client, spec, depth)
        mem1 = int(r.info("memory")["used_memory"])
        keys = admin.keys
        ids = r.zrange(keys.status("queued"), 0, -1)
        sample = random.Random(1).sample(ids, min(200, len(ids)))
        p = r.pipeline(transaction=False)
        for tid in sample:
            p.memory_usage(keys.task(tid), samples=0)
        task_avg = sum(p.execute()) / len(sample)
        sigs = r.zrange(keys.queues, 0, -1)
        bucket = sum(r.memory_usage(keys.queue(s), samples=0) or 0 for s in sigs)
        status = r.memory_usage(keys.status("queued"), samples=0) or 0
        events = r.memory_usage(keys.events, samples=0) or 0
        n_events = r.xlen(keys.events)
        encoding = r.object("encoding", keys.task(sample[0]))
        queued = r.zcard(keys.status("queued"))
        assign_us, assign_cpu, lifecycle_tail_us = assign_cost(r, admin, hosts, fleet, devices)
        r.close()
    return {
        "depth": depth,
        "shape": shape + (f" (hash-max-listpack-value {listpack_value})" if listpack_value else ""),
        "per_task": (mem1 - mem0) / depth,
        "used_mb": (mem1 - mem0) / 2**20,
        "task_hash": task_avg,
        "encoding": encoding,
        "status_idx": status / queued,
        "bucket_idx": bucket / queued,
        "events": events / depth,
        "n_events": n_events,
        "submit_us": submit_us,
        "submit_s": t.s,
        "assign_us": assign_us,
        "assign_cpu": assign_cpu,
        "tail_us": lifecycle_tail_us,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="10k and 50k only (< 30 s)")
    ap.add_argument("--depths", default=None, help="queue depths (comma list)")
    ap.add_argument(
        "--shapes",
        default=None,
        help="indexes into the shapes (0 plain, 1 tags, 2 long goal), comma list",
    )
    ap.add_argument(
        "--listpack-value",
        type=int,
        default=None,
        help="also run the long-goal shape with this hash-max-listpack-value",
    )
    args = ap.parse_args()
    depths = [
        int(x)
        for x in (args.depths or ("10000,50000" if args.quick else "10000,100000,1000000")).split(
            ","
        )
    ]
    names = list(SHAPES)
    shapes = [names[int(i)] for i in (args.shapes or "0,1,2").split(",")]
    print(f"machine: {machine()}")
    rows = []
    with Timer() as t:
        for depth in depths:
            for shape in shapes:
                if depth >= 1_000_000 and shape != names[0] and args.depths is None:
                    continue  # 1M: the plain shape only (time)
                res = measure(depth, shape)
                print(
                    f"  {depth:>9,} {shape}: {res['per_task']:.0f} B/task, submit "
                    f"{res['submit_s']:.1f} s",
                    flush=True,
                )
                rows.append(res)
            if args.listpack_value:
                res = measure(depth, names[2], args.listpack_value)
                print(f"  {depth:>9,} {res['shape']}: {res['per_task']:.0f} B/task", flush=True)
                rows.append(res)
    print(
        table(
            [
                "queued N",
                "task shape",
                "used_memory Δ MB",
                "bytes/task (Δ/N)",
                "task hash B",
                "hash encoding",
                "status:queued B/task",
                "queue:SIG B/task",
                "events B/task",
                "events kept",
                "submit µs/task (server)",
                "assign µs/pair (server)",
                "assign redis CPU µs/pair",
                "assign+claim+report µs/pair (server)",
            ],
            [
                [
                    x["depth"],
                    x["shape"],
                    x["used_mb"],
                    x["per_task"],
                    x["task_hash"],
                    x["encoding"],
                    x["status_idx"],
                    x["bucket_idx"],
                    x["events"],
                    x["n_events"],
                    x["submit_us"],
                    x["assign_us"],
                    x["assign_cpu"],
                    x["tail_us"],
                ]
                for x in rows
            ],
        )
    )
    print(
        f"target: <= 1024 bytes per queued task; per-pair cost flat across depths\n"
        f"machine after: {machine()}; bench took {t.s:.1f} s"
    )


if __name__ == "__main__":
    main()
