"""Preemption latency on a fully busy fleet, with deviceq's real daemons: ``--hosts``
``deviceq host run`` processes of ``--devices`` devices each (1,000 devices on 10 hosts by
default) and one ``deviceq scheduler run`` on a private redis-server. Every device runs a task of
the preemptible class ``routine`` that would hold it for an hour (goal runner
``bench.fleet.runners:hold_goal_stoppable``, which stops at once when told to, so the grace
is not part of the figures); then ``--urgent`` tasks of the class ``urgent`` (it preempts, it is
not preemptible) are submitted one at a time, each once the one before it runs.

Per urgent task, from the times Redis recorded (its clock): submit -> its start (``dispatched``),
and the phases of it: submit -> the scheduler's decision (the ``preempted`` event), decision ->
the preempted run's end (its host stopped it and reported), that end -> the urgent task's start
(hand-over, claim). Printed as p50 / p99 / max (ms).

Run: ``python -m bench.scheduler.preemption [--hosts 10] [--devices 100] [--urgent 100]
[--json] [--out FILE]``."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path: the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import redis

from bench import URL_ENV
from bench.fleet.lab import add_hosts
from bench.support.procs import Registry, child_env, cli, log
from deviceq import Client, PoolAdmin
from deviceq.core.keys import Keys

POOL = "preempt"
DRIVER = "phone"
RUNNER = "bench.fleet.runners:hold_goal_stoppable"


@dataclass
class Figures:
    devices: int
    urgent: int
    total_p50_ms: float
    total_p99_ms: float
    total_max_ms: float
    decide_p50_ms: float
    decide_p99_ms: float
    stop_p50_ms: float
    stop_p99_ms: float
    handover_p50_ms: float
    handover_p99_ms: float


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p * len(s)))] if s else float("nan")


def wait_status(r: redis.Redis, keys: Keys, tid: str, status: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while r.hget(keys.task(tid), "status") != status.encode():
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {tid} not {status} in {timeout} s")
        time.sleep(0.002)


def run(hosts: int, per_host: int, urgent: int) -> Figures:
    reg = Registry()
    try:
        server = reg.redis_server()
        env = child_env({URL_ENV: server.url})
        base = [cli(), "--redis-url", server.url, "--pool", POOL]
        devices = hosts * per_host
        client, admin = Client(server.url, POOL), PoolAdmin(server.url, POOL)
        keys = Keys(POOL)
        admin.set_config("max_preemptions_per_minute", 10_000)
        admin.add_priority_class("routine", 1, grace=0)
        admin.add_priority_class("urgent", 9, preempts=True, preemptible=False)
        tokens = add_hosts(reg, base, env, hosts)
        procs = {"scheduler": reg.spawn("scheduler", [*base, "scheduler", "run"], env)}
        for host, token in tokens.items():
            devs = [a for d in range(per_host) for a in ("--device", f"{host}-d{d:03d}:{DRIVER}")]
            procs[host] = reg.spawn(host, [
                *base, "host", "run", "--host-id", host, "--token-file", token, *devs,
                "--goal-runner", RUNNER, "--isolation", "thread",
            ], env)  # fmt: skip
        client.submit_many(
            [{"goal": "3600", "driver_type": DRIVER, "priority_class": "routine"}] * devices
        )
        r = redis.Redis.from_url(server.url)
        deadline = time.monotonic() + 180
        while int(r.zcard(keys.status("dispatched"))) < devices:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {devices} devices were not all busy in 180 s")
            for name, p in procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"the {name} daemon exited ({p.returncode})")
            time.sleep(0.2)
        log(f"preemption: {devices:,} devices busy on {hosts} hosts")
        time.sleep(1.0)
        rows: list[dict[str, Any]] = []
        for i in range(urgent):
            tid = client.submit("3600", driver_type=DRIVER, priority_class="urgent")
            wait_status(r, keys, tid, "dispatched", 60)
            rows.append({"task": tid})
            if (i + 1) % 25 == 0:
                log(f"preemption: {i + 1} urgent tasks started")
        events = {
            e.fields["by"]: e for e in client.events() if e.type == "preempted" and "by" in e.fields
        }
        total, decide, stop, handover = [], [], [], []
        for row in rows:
            t = client.get(row["task"])
            ev = events[row["task"]]
            victim = client.get(ev.fields["task"])
            ended = next(a.ended_at for a in victim.attempts if a.outcome == "preempted")
            decided = int(ev.id.split("-")[0])
            assert t.dispatched_at and ended
            total.append(t.dispatched_at - t.submitted_at)
            decide.append(decided - t.submitted_at)
            stop.append(ended - decided)
            handover.append(t.dispatched_at - ended)
        r.close()
        return Figures(
            devices, urgent, statistics.median(total), pct(total, 0.99), max(total),
            statistics.median(decide), pct(decide, 0.99), statistics.median(stop),
            pct(stop, 0.99), statistics.median(handover), pct(handover, 0.99),
        )  # fmt: skip
    finally:
        reg.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hosts", type=int, default=10, help="host daemons (default 10)")
    p.add_argument("--devices", type=int, default=100, help="devices per host (default 100)")
    p.add_argument("--urgent", type=int, default=100, help="urgent tasks, one at a time (100)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--out", help="also write the result's text to this file")
    a = p.parse_args()
    if a.hosts < 1 or a.devices < 1 or not 1 <= a.urgent <= a.hosts * a.devices:
        p.error("--hosts, --devices >= 1 and 1 <= --urgent <= the devices")
    f = run(a.hosts, a.devices, a.urgent)
    text = (
        f"{f.devices:,} busy devices, {f.urgent} urgent tasks one at a time (grace excluded: "
        f"runs stop at once)\n"
        f"| phase | p50 ms | p99 ms |\n|---|---|---|\n"
        f"| submit -> start | {f.total_p50_ms:.0f} | {f.total_p99_ms:.0f} (max "
        f"{f.total_max_ms:.0f}) |\n"
        f"| submit -> decision | {f.decide_p50_ms:.0f} | {f.decide_p99_ms:.0f} |\n"
        f"| decision -> preempted run ended | {f.stop_p50_ms:.0f} | {f.stop_p99_ms:.0f} |\n"
        f"| run ended -> urgent start | {f.handover_p50_ms:.0f} | {f.handover_p99_ms:.0f} |"
    )
    print(json.dumps(asdict(f), indent=2) if a.json else text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
