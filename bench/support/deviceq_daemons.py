"""deviceq through its real daemons, on one fresh private redis-server:

1. ``deviceq host add`` (CLI) creates the host; its token goes to a 0600 file;
2. ``Client.submit_many`` queues N goal tasks (driver type ``bench``);
3. ``deviceq scheduler run`` (with ``plan_ahead=True``: ``--plan-ahead``, next-task hints) and
   ``deviceq host run`` (16 devices ``d01:bench`` ...,
   goal runner ``bench.support.runners:incr`` in threads, or with ``runner="async"``
   ``bench.support.runners:incr_async`` on the host's event loop) start; the drain is
   measured like the peers' (``bench.support.drain``), with the CPU of each daemon process;
4. with both daemons idle, an open-loop producer submits at a fixed offered rate for a few
   seconds; submit -> dispatched latency comes from the ``since_submit_ms`` field of the
   ``dispatched`` events (``Client.events``);
5. every task must end ``done``: the counter equals the number of tasks submitted."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import URL_ENV
from bench.support.common import percentile
from bench.support.drain import Drain, measure_drain, tree_cpu_s
from bench.support.procs import Registry, child_env, cli
from bench.support.redisstats import Probe, Usage
from deviceq import Client

POOL = "bench"
HOST = "bench-host"
DEVICES = 16
DRIVER = "bench"
GOAL = "open the settings app, enable wifi, check the connection: ok"
RUNNERS = {"thread": "bench.support.runners:incr", "async": "bench.support.runners:incr_async"}
"""The goal runner of each runner kind: a thread runner, an async runner (``async def``)."""


def settings(runner: str = "thread", plan_ahead: bool = False) -> str:
    """How deviceq runs in the drain benchmark, for the report."""
    mode = "run --plan-ahead` (next-task hints)" if plan_ahead else "run` (defaults)"
    sched = f"`deviceq scheduler {mode}"
    return (
        f"{sched} + `deviceq host run` with {DEVICES} devices, "
        f"`--goal-runner {RUNNERS[runner]} --isolation thread`"
        + (" (an async runner: on the host's event loop, no thread a run)" * (runner == "async"))
    )


SETTINGS = settings()


@dataclass
class Latency:
    offered_per_s: float
    submitted: int
    submit_s: float  # how long the producer took to submit them
    done_s: float  # from the first submission to the last task done
    samples: list[int]  # since_submit_ms of each dispatched event
    usage: Usage  # Redis work during the phase (submission to the last task done)
    proc_cpu_s: dict[str, float]

    @property
    def completed_per_s(self) -> float:
        return self.submitted / self.done_s

    def pct(self, p: float) -> float:
        return percentile(self.samples, p)

    def redis_cpu_us_per_task(self) -> float:
        return self.usage.cpu_s * 1e6 / max(1, self.submitted)


@dataclass
class DeviceqRun:
    drain: Drain
    latency: Latency | None
    counts: dict[str, int]
    expected_done: int
    passes: int = 0  # scheduler passes that assigned something (from its log), whole run
    log_lines: dict[str, int] = field(default_factory=dict)  # per daemon, whole run

    @property
    def tasks_per_pass(self) -> float:
        return self.expected_done / self.passes if self.passes else float("nan")

    @property
    def ok(self) -> bool:
        return (
            self.counts.get("done") == self.expected_done
            and self.drain.final_counter == self.expected_done
        )


def settled_counts(client: Client, expected: int, timeout: float = 30.0) -> dict[str, int]:
    """The pool's counts once ``expected`` tasks are done (or ``timeout`` has passed): a job's
    ``INCR`` lands before its report, which the host sends in a wave a few ms later (later
    still when every report waits for a replica), so the counter can reach N first."""
    deadline = time.monotonic() + timeout
    counts = client.counts()
    while counts.get("done", 0) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
        counts = client.counts()
    return counts


def add_host(reg: Registry, base: list[str], env: dict[str, str]) -> Path:
    out = reg.run("host-add", [*base, "host", "add", HOST, "--json"], env, timeout=60)
    token = json.loads(out[out.index("{") : out.rindex("}") + 1])["token"]  # --json: indented
    token_file = reg.tmp / f"{HOST}.token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token_file


def with_replica(reg: Registry, primary_url: str) -> object:
    """A replica of the primary at ``primary_url`` (another private server), link up."""
    import redis

    replica = reg.redis_server()
    port = int(primary_url.rsplit(":", 1)[1].split("/")[0])
    r = redis.Redis(port=replica.port)
    r.replicaof("127.0.0.1", port)
    deadline = time.monotonic() + 20
    while r.info("replication").get("master_link_status") != "up":
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not link up")
        time.sleep(0.05)
    r.close()
    return replica


def run_deviceq(
    reg: Registry,
    n: int,
    rate: float,
    duration: float,
    timeout: float,
    durability: str = "none",
    runner: str = "thread",
    plan_ahead: bool = False,
) -> DeviceqRun:
    """One deviceq run (see the module docstring). ``durability`` other than ``none`` adds a
    replica of the private server and sets the pool's durable mode (``replica``/``aof``);
    ``runner``: ``thread`` or ``async`` (`RUNNERS`); ``plan_ahead``: the scheduler writes
    next-task hints (``scheduler run --plan-ahead``)."""
    server = reg.redis_server()
    try:
        env = child_env({URL_ENV: server.url})
        base = [cli(), "--redis-url", server.url, "--pool", POOL]
        token_file = add_host(reg, base, env)
        client = Client(server.url, POOL)
        if durability != "none":
            with_replica(reg, server.url)
            subprocess.run([*base, "config", "set", "durability", durability], env=env,
                           check=True, stdout=subprocess.DEVNULL)  # fmt: skip
        client.submit_many([{"goal": GOAL, "driver_type": DRIVER}] * n)
        queued = client.counts().get("queued", 0)
        if queued != n:
            raise RuntimeError(f"{queued} tasks queued after submitting {n}")
        devices = [a for i in range(1, DEVICES + 1) for a in ("--device", f"d{i:02d}:{DRIVER}")]
        scheduler = [*base, "scheduler", "run", *(["--plan-ahead"] if plan_ahead else [])]
        host = [
            *base, "host", "run", "--host-id", HOST, "--token-file", str(token_file), *devices,
            "--goal-runner", RUNNERS[runner], "--isolation", "thread",
        ]  # fmt: skip
        probe = Probe(server.url)

        def start() -> dict[str, subprocess.Popen[bytes]]:
            return {"scheduler": reg.spawn("scheduler", scheduler, env),
                    "host": reg.spawn("host", host, env)}  # fmt: skip

        drain, procs = measure_drain(reg, probe, n, start, timeout)
        logs = {name: reg.log_of(p) for name, p in procs.items()}
        try:
            latency = None
            if rate > 0 and duration > 0:
                time.sleep(0.5)  # let the daemons go idle (blocking waits)
                latency = open_loop(client, probe, procs, n, rate, duration)
            expected = n + (latency.submitted if latency else 0)
            counts = settled_counts(client, expected)
        finally:
            reg.forget(procs["host"])  # SIGTERM: the host drains and exits
            reg.forget(procs["scheduler"])
        drain.final_counter = probe.counter()
        probe.close()
        client.close()
        run = DeviceqRun(drain, latency, counts, expected)
        for name, path in logs.items():
            lines = path.read_text(errors="replace").splitlines()
            run.log_lines[name] = len(lines)
            if name == "scheduler":  # "msg=passes ... passes=N": best effort, format may change
                run.passes = sum(
                    int(m.group(1))
                    for x in lines
                    if "msg=passes" in x and (m := re.search(r" passes=(\d+)", x))
                )
        return run
    finally:
        reg.stop_server(server)


def open_loop(
    client: Client,
    probe: Probe,
    procs: dict[str, subprocess.Popen[bytes]],
    done_before: int,
    rate: float,
    duration: float,
) -> Latency:
    """At time t, ``rate * t`` tasks are due; whatever is due is one ``submit_many`` call.
    Then wait for all of them to be done and collect their ``dispatched`` events."""
    newest = client.redis.xrevrange(f"dq:{{{POOL}}}:events", count=1)
    cursor = str(newest[0][0]) if newest else "0-0"
    spec = {"goal": GOAL, "driver_type": DRIVER}
    total = int(rate * duration)
    ids: set[str] = set()
    mark = probe.mark()
    s1 = probe.snapshot()
    cpu1 = {k: tree_cpu_s(p) for k, p in procs.items()}
    t0 = time.perf_counter()
    submitted = 0
    while submitted < total:
        due = min(total, int((time.perf_counter() - t0) * rate) + 1) - submitted
        if due > 0:
            ids.update(client.submit_many([spec] * due))
            submitted += due
        wait = t0 + submitted / rate - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
    submit_s = time.perf_counter() - t0
    deadline = time.perf_counter() + 60 + duration
    while probe.counter() < done_before + submitted:
        if time.perf_counter() > deadline:
            raise TimeoutError(f"open loop: not all {submitted} tasks done after 60 s")
        time.sleep(0.01)
    done_s = time.perf_counter() - t0
    s2 = probe.snapshot()
    cpu2 = {k: tree_cpu_s(p) for k, p in procs.items()}
    samples = [
        int(e.fields["since_submit_ms"])
        for e in client.events(since=cursor)
        if e.type == "dispatched" and e.task in ids and "since_submit_ms" in e.fields
    ]
    return Latency(
        offered_per_s=rate,
        submitted=submitted,
        submit_s=submit_s,
        done_s=done_s,
        samples=samples,
        usage=probe.usage(s1, s2, mark),
        proc_cpu_s={k: cpu2[k] - cpu1[k] for k in procs},
    )
