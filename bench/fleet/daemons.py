"""Device utilization with deviceq's real daemons (``deviceq scheduler run`` + one
``deviceq host run`` serving ``DEVICES`` devices, goal runner ``bench.fleet.runners:hold``:
every task holds its device ``TASK_S`` seconds; or ``hold_async``, the same as an async runner
on the host's event loop), on a private redis-server of its own.

Enough tasks are queued up front for ``rounds`` rounds of every device; once the first round
is done, a window runs until all but the last round is done (steady state: the queue never
empty). Over the window: utilization = tasks done x ``TASK_S`` / (devices x window seconds)
(1.0: no device ever waits between tasks), and the CPU per task of the host daemon and of the
scheduler daemon (their process trees, ``psutil``)."""

from __future__ import annotations

import argparse
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import redis

from bench import URL_ENV
from bench.fleet.runners import TASK_S
from bench.support.deviceq_daemons import HOST, add_host
from bench.support.drain import tree_cpu_s
from bench.support.procs import Registry, child_env, cli
from deviceq import Client
from deviceq.core.keys import Keys

POOL = "bench"
DRIVER = "bench"
DEVICES = 100
GOAL = "open the settings app, enable wifi, check the connection: ok"


THREAD_RUNNER = "bench.fleet.runners:hold"
ASYNC_RUNNER = "bench.fleet.runners:hold_async"


@dataclass
class Utilization:
    devices: int
    task_s: float
    window_s: float
    tasks: int
    host_cpu_s: float
    scheduler_cpu_s: float
    runner: str = THREAD_RUNNER

    @property
    def utilization(self) -> float:
        return self.tasks * self.task_s / (self.devices * self.window_s)

    @property
    def host_cpu_us_per_task(self) -> float:
        return self.host_cpu_s * 1e6 / self.tasks if self.tasks else float("nan")

    @property
    def scheduler_cpu_us_per_task(self) -> float:
        return self.scheduler_cpu_s * 1e6 / self.tasks if self.tasks else float("nan")


def done_count(r: redis.Redis) -> int:
    """The pool's tasks done (its ``status:done`` index; retention keeps them for days)."""
    return int(r.zcard(Keys(POOL).status("done")))


def wait_done(r: redis.Redis, at_least: int, timeout: float, alive: Callable[[], None]) -> None:
    deadline = time.monotonic() + timeout
    while done_count(r) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{at_least} tasks were not done in {timeout:.0f} s")
        alive()
        time.sleep(0.02)


SCHEDULER_OPTIONS: list[str] = []
"""Options of every ``deviceq scheduler run`` these benchmarks start (``python -m bench.fleet
--plan-ahead`` sets ``--plan-ahead``)."""


def start_daemons(
    reg: Registry, url: str, devices: int, goal_runner: str, host_command: list[str] | None = None
) -> tuple[dict[str, subprocess.Popen[bytes]], Callable[[], None]]:
    """``deviceq scheduler run`` and one ``deviceq host run`` serving ``devices`` devices
    (``u000:bench``...) with ``goal_runner`` in threads, on the server at ``url``; returns the
    processes by name and a check that raises once either has exited. ``host_command``: what
    runs the host's ``deviceq`` arguments instead of the ``deviceq`` script."""
    env = child_env({URL_ENV: url})
    base = [cli(), "--redis-url", url, "--pool", POOL]
    token_file = add_host(reg, base, env)
    args = [a for i in range(devices) for a in ("--device", f"u{i:03d}:{DRIVER}")]
    host = [
        *(host_command or base[:1]), *base[1:], "host", "run", "--host-id", HOST,
        "--token-file", str(token_file), *args, "--goal-runner", goal_runner,
        "--isolation", "thread",
    ]  # fmt: skip
    procs = {
        "scheduler": reg.spawn("scheduler", [*base, "scheduler", "run", *SCHEDULER_OPTIONS], env),
        "host": reg.spawn("host", host, env),
    }

    def alive() -> None:
        for name, p in procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"the {name} daemon exited ({p.returncode})")

    return procs, alive


@dataclass
class HeldFleet:
    """`held_fleet`'s daemons, once every device has finished its first task."""

    procs: dict[str, subprocess.Popen[bytes]]
    alive: Callable[[], None]
    r: redis.Redis
    client: Client
    tasks: int  # queued in all

    def wait_last_but_one_round(self, devices: int, task_s: float, rounds: int) -> None:
        """Wait until every round but the last is done (the queue never ran empty)."""
        wait_done(self.r, self.tasks - devices, 60 + rounds * task_s * 20, self.alive)

    def close(self) -> None:
        self.r.close()
        self.client.close()


def held_fleet(
    reg: Registry,
    task_s: float,
    rounds: int,
    devices: int,
    host_command: list[str] | None = None,
    asynchronous: bool = False,
) -> HeldFleet:
    """A private server with ``rounds`` tasks per device queued (each sleeps ``task_s``, goal
    runner ``bench.fleet.runners:hold_goal``, or ``hold_goal_async``), the daemons of
    `start_daemons` started, and the first round done: the steady-state window of
    ``bench/fleet/host_cpu.py`` and ``bench/fleet/host_profile.py`` begins."""
    server = reg.redis_server()
    client = Client(server.url, POOL)
    n = devices * rounds
    client.submit_many([{"goal": f"{task_s:.3f}", "driver_type": DRIVER}] * n)
    runner = "bench.fleet.runners:hold_goal" + ("_async" if asynchronous else "")
    procs, alive = start_daemons(reg, server.url, devices, runner, host_command)
    r = redis.Redis.from_url(server.url, decode_responses=True)
    wait_done(r, devices, 120, alive)
    return HeldFleet(procs, alive, r, client, n)


def run_utilization(
    rounds: int, log: Callable[[str], None], runner: str = THREAD_RUNNER
) -> Utilization:
    """One run (see the module docstring) with goal runner ``runner``; every process and
    server is gone on return."""
    reg = Registry()
    try:
        server = reg.redis_server()
        client = Client(server.url, POOL)
        n = DEVICES * rounds
        client.submit_many([{"goal": GOAL, "driver_type": DRIVER}] * n)
        procs, alive = start_daemons(reg, server.url, DEVICES, runner)

        r = redis.Redis.from_url(server.url)
        wait_done(r, DEVICES, 120, alive)
        c0 = done_count(r)
        cpu0 = {k: tree_cpu_s(p) for k, p in procs.items()}
        t0 = time.perf_counter()
        wait_done(r, n - DEVICES, 60 + rounds * TASK_S * 20, alive)
        window = time.perf_counter() - t0
        c1 = done_count(r)
        cpu1 = {k: tree_cpu_s(p) for k, p in procs.items()}
        u = Utilization(
            DEVICES,
            TASK_S,
            window,
            c1 - c0,
            cpu1["host"] - cpu0["host"],
            cpu1["scheduler"] - cpu0["scheduler"],
            runner,
        )
        log(
            f"  {runner}: utilization {u.utilization:.2f} ({u.tasks} tasks of {TASK_S} s on "
            f"{DEVICES} devices in {window:.1f} s); host daemon "
            f"{u.host_cpu_us_per_task:,.0f} us CPU/task, scheduler "
            f"{u.scheduler_cpu_us_per_task:,.0f} us CPU/task"
        )
        r.close()
        client.close()
        return u
    finally:
        reg.close()


def host_bench_args(description: str) -> argparse.Namespace:
    """The options of the host-daemon benchmarks (``host_cpu.py``, ``host_profile.py``), parsed
    and checked: ``--task-s``, ``--rounds``, ``--devices``, ``--out``, ``--async``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--task-s", type=float, default=1.0, help="seconds each task runs")
    ap.add_argument("--rounds", type=int, default=20, help="tasks per device queued")
    ap.add_argument("--devices", type=int, default=100, help="devices on the one host")
    ap.add_argument("--out", type=Path, help="write the markdown table here too")
    ap.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        help="the async runner (hold_goal_async, on the host's event loop) instead",
    )
    a = ap.parse_args()
    if a.rounds < 3 or a.devices < 1 or a.task_s <= 0:
        ap.error("--rounds must be >= 3, --devices >= 1, --task-s > 0")
    return a
