"""A lab's day in miniature with deviceq's real daemons: ``--hosts`` ``deviceq host run``
processes of ``--devices`` devices each (1,000 devices on 10 hosts by default) and one
``deviceq scheduler run``, on a private redis-server; every task holds its device for a time
drawn uniformly from ``--min``..``--max`` seconds (0.2-2 s; its goal is the time, goal runner
``bench.fleet.runners:hold_goal``), and the queue is never empty during the window.

Over a window of ``--window`` seconds (after a warm-up in which every device has run a task),
read afterwards from the attempt records Redis kept (every time in them is Redis' clock):

- utilization: the devices' time between dispatch and report, inside the window, over
  devices x window (1.0: no device ever waits);
- the gap between a device's report and its next dispatch (p50, p99, max): what a device
  waits for its next task;
- host and scheduler daemon CPU per task (their process trees, ``psutil``).

Run: ``python -m bench.fleet.lab [--hosts 10] [--devices 100] [--window 30] [--plan-ahead]
[--json]`` (``--plan-ahead``: ``deviceq scheduler run --plan-ahead``, next-task hints)."""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import redis

from bench import URL_ENV
from bench.support.drain import tree_cpu_s
from bench.support.procs import Registry, child_env, cli, log
from deviceq import Client
from deviceq.core.keys import Keys

POOL = "lab"
DRIVER = "phone"
WARM_S = 6.0  # seconds before the window: every device has run a task by then


@dataclass
class LabRun:
    hosts: int
    devices: int
    window_s: float
    tasks_in_window: int
    utilization: float
    gap_p50_ms: float
    gap_p99_ms: float
    gap_max_ms: float
    gaps: int
    host_cpu_us_per_task: float
    scheduler_cpu_us_per_task: float


def add_hosts(reg: Registry, base: list[str], env: dict[str, str], n: int) -> dict[str, str]:
    """Host ids -> token files."""
    out = {}
    for i in range(n):
        host = f"lab-{i:02d}"
        raw = reg.run(f"add-{host}", [*base, "host", "add", host, "--json"], env, timeout=60)
        token = json.loads(raw[raw.index("{") : raw.rindex("}") + 1])["token"]
        path = reg.tmp / f"{host}.token"
        path.write_text(token + "\n")
        path.chmod(0o600)
        out[host] = str(path)
    return out


def attempts_of(r: redis.Redis, keys: Keys, ids: list[str]) -> list[dict[str, Any]]:
    """Every attempt record of ``ids`` (one pipeline per 1,000 tasks)."""
    out: list[dict[str, Any]] = []
    for i in range(0, len(ids), 1000):
        pipe = r.pipeline(transaction=False)
        for tid in ids[i : i + 1000]:
            pipe.lrange(keys.attempts(tid), 0, -1)
        for recs in pipe.execute():
            out += [json.loads(a) for a in recs]
    return out


def measure(attempts: list[dict[str, Any]], t0: int, t1: int, devices: int) -> dict[str, Any]:
    """Utilization and report-to-next-dispatch gaps of the window [t0, t1] (ms)."""
    busy = 0
    runs: dict[str, list[tuple[int, int]]] = {}
    for a in attempts:
        start, end = a.get("dispatched_at"), a.get("ended_at")
        if not start or not end:
            continue
        busy += max(0, min(end, t1) - max(start, t0))
        runs.setdefault(a["device_id"], []).append((start, end))
    gaps = []
    for spans in runs.values():
        spans.sort()
        for (_, end), (nxt, _) in zip(spans, spans[1:], strict=False):
            if t0 <= end and nxt <= t1:
                gaps.append(max(0, nxt - end))
    gaps.sort()

    def pct(p: float) -> float:
        return float(gaps[min(len(gaps) - 1, int(p * len(gaps)))]) if gaps else float("nan")

    return {
        "utilization": busy / (devices * (t1 - t0)),
        "gap_p50_ms": statistics.median(gaps) if gaps else float("nan"),
        "gap_p99_ms": pct(0.99),
        "gap_max_ms": float(gaps[-1]) if gaps else float("nan"),
        "gaps": len(gaps),
    }


def run(
    hosts: int, per_host: int, window: float, lo: float, hi: float, plan_ahead: bool = False
) -> LabRun:
    reg = Registry()
    try:
        server = reg.redis_server()
        env = child_env({URL_ENV: server.url})
        base = [cli(), "--redis-url", server.url, "--pool", POOL]
        devices = hosts * per_host
        client = Client(server.url, POOL)
        n = int(devices * (WARM_S + window + 10) / ((lo + hi) / 2) * 1.2)
        client.redis.hset(client.keys.config, "max_queue_depth", str(n + 1000))
        tokens = add_hosts(reg, base, env, hosts)
        rnd = random.Random(7)
        ids = client.submit_many(
            [{"goal": f"{rnd.uniform(lo, hi):.3f}", "driver_type": DRIVER} for _ in range(n)]
        )
        log(f"lab: {n:,} tasks queued for {devices:,} devices on {hosts} hosts")
        sched = [*base, "scheduler", "run", *(["--plan-ahead"] if plan_ahead else [])]
        procs = {"scheduler": reg.spawn("scheduler", sched, env)}
        for host, token in tokens.items():
            devs = [a for d in range(per_host) for a in ("--device", f"{host}-d{d:03d}:{DRIVER}")]
            procs[host] = reg.spawn(host, [
                *base, "host", "run", "--host-id", host, "--token-file", token, *devs,
                "--goal-runner", "bench.fleet.runners:hold_goal", "--isolation", "thread",
            ], env)  # fmt: skip
        r = redis.Redis.from_url(server.url)
        done = Keys(POOL).status("done")
        deadline = time.monotonic() + 120
        while int(r.zcard(done)) < devices:  # every device has run a task
            if time.monotonic() > deadline:
                raise TimeoutError("the devices did not all run a task in 120 s")
            for name, p in procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"the {name} daemon exited ({p.returncode})")
            time.sleep(0.1)
        time.sleep(1.0)
        sec, usec = r.time()
        t0 = int(sec) * 1000 + int(usec) // 1000
        cpu0 = {k: tree_cpu_s(p) for k, p in procs.items()}
        c0 = int(r.zcard(done))
        time.sleep(window)
        sec, usec = r.time()
        t1 = int(sec) * 1000 + int(usec) // 1000
        cpu1 = {k: tree_cpu_s(p) for k, p in procs.items()}
        c1 = int(r.zcard(done))
        queued = int(r.zcard(Keys(POOL).status("queued")))
        if queued == 0:
            log("lab: warning: the queue ran empty during the window (raise the task count)")
        tasks = c1 - c0
        host_cpu = sum(cpu1[h] - cpu0[h] for h in tokens)
        sched_cpu = cpu1["scheduler"] - cpu0["scheduler"]
        time.sleep(hi + 1)  # the attempts running at t1 are reported
        m = measure(attempts_of(r, Keys(POOL), ids), t0, t1, devices)
        r.close()
        client.close()
        return LabRun(
            hosts, devices, (t1 - t0) / 1000, tasks, m["utilization"], m["gap_p50_ms"],
            m["gap_p99_ms"], m["gap_max_ms"], m["gaps"], host_cpu * 1e6 / max(1, tasks),
            sched_cpu * 1e6 / max(1, tasks),
        )  # fmt: skip
    finally:
        reg.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=10, help="host daemons (default 10)")
    p.add_argument("--devices", type=int, default=100, help="devices per host (default 100)")
    p.add_argument("--window", type=float, default=30.0, help="seconds measured (default 30)")
    p.add_argument("--min", type=float, default=0.2, help="shortest task, seconds (0.2)")
    p.add_argument("--max", type=float, default=2.0, help="longest task, seconds (2.0)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--plan-ahead", action="store_true", help="the scheduler with next-task hints")
    a = p.parse_args()
    if a.hosts < 1 or a.devices < 1 or a.window <= 0 or not 0 < a.min <= a.max:
        p.error("--hosts and --devices must be >= 1, --window > 0 and 0 < --min <= --max")
    res = run(a.hosts, a.devices, a.window, a.min, a.max, a.plan_ahead)
    if a.json:
        print(json.dumps(asdict(res), indent=2))
        return
    print(
        f"{res.devices:,} devices on {res.hosts} hosts, tasks of {a.min}-{a.max} s, "
        f"{res.window_s:.1f} s window: utilization {res.utilization:.3f}; report to next "
        f"dispatch p50 {res.gap_p50_ms:.0f} ms, p99 {res.gap_p99_ms:.0f} ms, max "
        f"{res.gap_max_ms:.0f} ms ({res.gaps:,} gaps); {res.tasks_in_window:,} tasks; host "
        f"daemons {res.host_cpu_us_per_task:,.0f} us CPU/task, scheduler "
        f"{res.scheduler_cpu_us_per_task:,.0f} us CPU/task"
    )


if __name__ == "__main__":
    main()
