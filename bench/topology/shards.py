"""Scale-out over Redis Cluster shards: lifecycles/s through the real daemons with
6 pools on 1, 2 and 3 shards (a private ``LocalCluster`` each time), and each shard's Redis
CPU per lifecycle. Writes bench/topology/RESULTS-shards.md.

Per configuration: the 6 pools are spread evenly over the shards; every pool gets ``--jobs``
no-op tasks queued first, one host daemon (4 devices, ``bench.support.runners:noop`` in threads),
and one ``deviceq scheduler run`` process serves all 6 pools. The drain runs from the first
task done to the last (all pools together).

    python -m bench.topology.shards [--jobs 1000] [--runs 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.support.common import GOAL
from bench.support.drain import tree_cpu_s
from bench.support.procs import Registry, child_env, cli, interrupt_on_signals, log
from deviceq import Client
from deviceq.core.connection import connect
from deviceq.core.redis_server import LocalCluster
from deviceq.ops.admin import PoolAdmin

OUT = Path(__file__).resolve().parent / "RESULTS-shards.md"
POOLS = 6
DEVICES = 4
DRIVER = "bench"


@dataclass
class Run:
    shards: int
    tasks: int
    drain_s: float
    startup_s: float
    shard_cpu_s: list[float]
    shard_tasks: list[int]
    proc_cpu_s: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.tasks / self.drain_s


def pools_for(c: LocalCluster, shards: int) -> list[str]:
    """POOLS pool names, spread evenly over the shards (pool i on shard i % shards)."""
    out: list[str] = []
    for i in range(POOLS):
        want = i % shards
        n = 0
        while c.node_of(f"dq:{{s{i}-{n}}}:x") != want:
            n += 1
        out.append(f"s{i}-{n}")
    return out


def node_cpu(c: LocalCluster, i: int) -> float:
    with c.client(i) as r:
        info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def one(reg: Registry, shards: int, jobs: int) -> Run:
    with LocalCluster(shards) as c:
        url = c.url(0)
        r = connect(url)
        pools = pools_for(c, shards)
        env = child_env({})
        hosts = []
        for p in pools:
            token = PoolAdmin(r, p).add_host("h1")
            tf = reg.tmp / f"{p}.token"
            tf.write_text(token)
            Client(r, p).submit_many([{"goal": GOAL, "driver_type": DRIVER}] * jobs)
            devices = [a for d in range(DEVICES) for a in ("--device", f"d{d}:{DRIVER}")]
            hosts.append([cli(), "--redis-url", url, "--pool", p, "host", "run", "--host-id", "h1",
                          "--token-file", str(tf), *devices, "--goal-runner",
                          "bench.support.runners:noop", "--isolation", "thread"])  # fmt: skip
        sched = [cli(), "--redis-url", url]
        for p in pools:
            sched += ["--pool", p]
        sched += ["scheduler", "run"]
        cpu0 = [node_cpu(c, i) for i in range(shards)]
        spawned = time.monotonic()
        procs = {"scheduler": reg.spawn("scheduler", sched, env)}
        for i, argv in enumerate(hosts):
            procs[f"host{i}"] = reg.spawn(f"host{i}", argv, env)
        clients = {p: Client(r, p) for p in pools}
        total, first = jobs * POOLS, None
        cpu_first: dict[str, float] = {}
        done_at_first = 0
        deadline = time.monotonic() + 600
        while True:
            done = sum(cl.counts()["done"] for cl in clients.values())
            now = time.monotonic()
            if first is None and done > 0:
                first, done_at_first = now, done
                cpu_first = {name: tree_cpu_s(p) for name, p in procs.items()}
            if done >= total:
                break
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited {proc.returncode}")
            if now > deadline:
                raise RuntimeError(f"{done}/{total} done after 600 s")
            time.sleep(0.05)
        end = time.monotonic()
        cpu1 = [node_cpu(c, i) for i in range(shards)]
        proc_cpu = {name: tree_cpu_s(p) - cpu_first[name] for name, p in procs.items()}
        for p in procs.values():
            reg.forget(p)
        shard_tasks = [0] * shards
        for i in range(POOLS):
            shard_tasks[i % shards] += jobs
        r.close()
        assert first is not None
        drained = total - done_at_first
        return Run(shards, drained, end - first, first - spawned,
                   [b - a for a, b in zip(cpu0, cpu1, strict=True)], shard_tasks,
                   proc_cpu)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000, help="tasks per pool [1000]")
    ap.add_argument("--runs", type=int, default=1, help="runs per configuration [1]")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    interrupt_on_signals()
    reg = Registry()
    runs: dict[int, list[Run]] = {1: [], 2: [], 3: []}
    try:
        for k in range(args.runs):
            for shards in runs:
                log(f"run {k + 1}/{args.runs}: {shards} shard(s), {POOLS} pools")
                runs[shards].append(one(reg, shards, args.jobs))
    finally:
        reg.close()
    base = statistics.median(r.rate for r in runs[1])
    lines = [
        "# Scale-out over Redis Cluster shards",
        "",
        f"Generated by `python -m bench.topology.shards --jobs {args.jobs} --runs {args.runs}` on "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: {POOLS} pools, {args.jobs:,} "
        f"no-op tasks each, one host daemon per pool ({DEVICES} devices, Python runner in "
        "threads) and one `deviceq scheduler run` serving all pools, on a private "
        "`LocalCluster` of 1, 2 or 3 primaries (loopback, no persistence). Medians of "
        f"{args.runs} run(s).",
        "",
        "| shards | lifecycles/s | × 1 shard | ideal × | Redis CPU µs/lifecycle per shard | "
        "scheduler µs/lifecycle | hosts µs/lifecycle | start-up s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for shards, rs in runs.items():
        rate = statistics.median(r.rate for r in rs)
        per_shard = [
            statistics.median(r.shard_cpu_s[i] * 1e6 / r.shard_tasks[i] for r in rs)
            for i in range(shards)
        ]
        sched = statistics.median(r.proc_cpu_s["scheduler"] * 1e6 / r.tasks for r in rs)
        hosts = statistics.median(
            sum(v for n, v in r.proc_cpu_s.items() if n != "scheduler") * 1e6 / r.tasks for r in rs
        )
        start = statistics.median(r.startup_s for r in rs)
        lines.append(
            f"| {shards} | {rate:,.0f} | {rate / base:.2f} | {shards} | "
            f"{' / '.join(f'{x:.0f}' for x in per_shard)} | {sched:.0f} | {hosts:.0f} | "
            f"{start:.1f} |"
        )
    cores = os.cpu_count() or 1
    lines += [
        "",
        "What limits it: every process runs on this machine's "
        f"{cores} cores. One lifecycle costs, in CPU µs (median run of each configuration):",
        "",
        "| shards | Redis (all shards) | scheduler | hosts | total | ceiling on "
        f"{cores} cores (lifecycles/s) | measured |",
        "|---|---|---|---|---|---|---|",
    ]
    for shards, rs in runs.items():
        r = sorted(rs, key=lambda x: x.rate)[len(rs) // 2]
        red = sum(r.shard_cpu_s) * 1e6 / r.tasks
        sch = r.proc_cpu_s["scheduler"] * 1e6 / r.tasks
        hst = sum(v for n, v in r.proc_cpu_s.items() if n != "scheduler") * 1e6 / r.tasks
        tot = red + sch + hst
        lines.append(f"| {shards} | {red:.0f} | {sch:.0f} | {hst:.0f} | {tot:.0f} | "
                     f"{cores * 1e6 / tot:,.0f} | {r.rate:,.0f} |")  # fmt: skip
    lines += [
        "",
        "When the measured rate is near the ceiling, more shards cannot help here: the daemons "
        "and the shards share the same cores. No shard talks to another, so with cores of their "
        "own the shards add capacity until the one scheduler process (serving every pool) "
        "saturates its core; the per-shard column shows what each shard then costs (with more "
        "shards each script call carries fewer tasks, so the per-call cost is spread over "
        "fewer lifecycles).",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.write_text(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
